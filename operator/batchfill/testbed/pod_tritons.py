"""One real tritonserver per Ready kwok pod, with the model repository the pod's init container would assemble:
the demo's and the scaling tests' stand-in for a container runtime (kwok pods run no container)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console

from batchfill.render import config_on_cpu, config_with_parameters
from batchfill.render.kube import GRPC_PORT, HTTP_PORT, METRICS_PORT
from batchfill.testbed import triton_local
from batchfill.testbed.triton_local import LocalTriton

# Stop timeouts (seconds) of the cleanup's steps; their sum bounds it (stop_timeout_s).
#: A tritonserver gets this after SIGTERM before SIGKILL (Triton itself waits --exit-timeout-secs=5 for requests
#: in flight); all of them stop at once, each within triton_stop_timeout_s().
TRITON_STOP_GRACE_S = 10.0


class PodTritons:
    """One real tritonserver per Ready Triton pod, with that pod's model repository (see module docstring).

    ``parameters`` are the model's own config knobs (e.g. the sleep model's ``alpha_ms``), added to the
    ConfigMap's config. :meth:`endpoints` is safe to read from another thread (a load generator): a server
    leaves it before it is stopped, and gets ``drain_s`` to finish the requests in flight.
    """

    def __init__(
        self,
        work: Path,
        model: str,
        model_files: Path,
        *,
        parameters: Mapping[str, str] | None = None,
        drain_s: float = 1.0,
    ) -> None:
        self.work, self.model, self.model_files = work, model, model_files
        self.parameters = dict(parameters or {})
        self.drain_s = drain_s
        self.servers: dict[str, LocalTriton] = {}
        self._endpoints: list[str] = []

    def endpoints(self) -> list[str]:
        """gRPC ``host:port`` of the servers of Ready pods (a new list each call)."""
        return list(self._endpoints)

    def sync(
        self, ready: dict[str, str], config_pbtxt: str, console: Console, ips: Mapping[str, str] | None = None
    ) -> None:
        """Start servers for new Ready pods, stop those of pods that went away (``ready``: pod -> node).

        A pod whose IP (``ips``) is a loopback address other than 127.0.0.1 (the dev cluster's kwok pods) gets its
        server on that IP with Triton's standard ports, so clients reach it at ``<pod IP>:8000`` as in a real
        cluster; otherwise the server takes free ports on 127.0.0.1.
        """
        gone = sorted(set(self.servers) - set(ready))
        if gone:
            self._endpoints = [s.grpc_url for p, s in sorted(self.servers.items()) if p not in gone]
            time.sleep(self.drain_s)
        for pod in gone:
            self.servers.pop(pod).stop()
            console.log(f"pod {pod} gone: its tritonserver stopped")
        config = config_on_cpu(config_pbtxt)
        if self.parameters:
            config = config_with_parameters(config, self.parameters)
        for pod in sorted(set(ready) - set(self.servers)):
            repo = self.work / pod / "models"
            shutil.rmtree(repo, ignore_errors=True)
            shutil.copytree(self.model_files, repo)
            (repo / self.model / "config.pbtxt").write_text(config)
            ip = (ips or {}).get(pod, "")
            pod_ports: dict[str, Any] = (
                {"host": ip, "http_port": HTTP_PORT, "grpc_port": GRPC_PORT, "metrics_port": METRICS_PORT}
                if ip.startswith("127.") and ip != "127.0.0.1"
                else {}
            )
            server = LocalTriton(
                repo,
                log_path=self.work / pod / "tritonserver.log",
                startup_timeout_s=180,
                stop_grace_s=TRITON_STOP_GRACE_S,
                **pod_ports,
            )
            self.servers[pod] = server  # before it starts: an interrupt while it starts must still stop it
            try:
                with console.status(f"starting tritonserver for pod {pod} (node {ready[pod]}) ..."):
                    server.start()
            except Exception:  # not started (and stopped): the next sync tries again
                server.stop()
                del self.servers[pod]
                raise
            console.log(
                f"pod {pod} on {ready[pod]}: tritonserver pid {server.pid}, grpc {server.grpc_url}, "
                f"metrics {server.metrics_url}"
            )
        self._endpoints = [s.grpc_url for _, s in sorted(self.servers.items())]

    def stop(self) -> None:
        """Stop every server at once, so that this takes one server's stop time (:func:`triton_stop_timeout_s`)."""
        self._endpoints = []
        servers, self.servers = list(self.servers.values()), {}
        if servers:
            with ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="stop-triton") as pool:
                list(pool.map(LocalTriton.stop, servers))


def triton_stop_timeout_s() -> float:
    """The longest :meth:`PodTritons.stop` takes (seconds): SIGTERM grace, SIGKILL, stubs (triton_local)."""
    return TRITON_STOP_GRACE_S + triton_local.KILL_WAIT_S + triton_local.STUB_REAP_S


def ready_pods_with_ips(core: Any, namespace: str, selector: str) -> dict[str, tuple[str, str]]:
    """Ready, not terminating pods: name -> (node, pod IP)."""
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return {
        p.metadata.name: (p.spec.node_name or "", p.status.pod_ip or "")
        for p in pods
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
    }
