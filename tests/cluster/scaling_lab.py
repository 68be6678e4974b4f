"""The lab of the scaling tests on the real API server (test_scaling.py, test_calm_headroom.py): a real Prometheus,
the operator as a restartable subprocess, and one real tritonserver (the sleep model) per Ready kwok pod of the
BatchedModel being followed, with Poisson load spread round-robin over them (a Service)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from rich.console import Console

from batchfill.api.reasons import ConditionType
from batchfill.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from batchfill.render.kube import MODEL_LABEL, template_config_name
from batchfill.testbed.balancer import BalancedLoad
from batchfill.testbed.loadgen import grpc_fp32_input
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.pod_tritons import PodTritons
from batchfill.testbed.prometheus_local import LocalPrometheus, ScrapeTarget

from .support import Kube, Operator, model_volume, rbac_denials, temp_namespace

ALPHA_MS, BETA_MS = 40.0, 6.0
#: l(b) declared a little above what the sleep model takes (Python-backend overhead ~1 ms, ~0.2 ms per request).
PROFILE = [{"batchSize": b, "latencyMs": round(ALPHA_MS + 1 + (BETA_MS + 0.2) * b, 1)} for b in (1, 2, 4, 8, 16)]


def sleep_model(name: str, mode: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": "sleep",
                "backend": "python",
                "repository": {"pvc": {"claimName": "models"}},
                "inputs": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
                "outputs": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
            },
            "sla": {"latencyP99Ms": 200, "networkOverheadMs": 20},
            "profile": PROFILE,
            "scaling": {
                "minReplicas": 1,
                "maxReplicas": 3,
                "targetUtilization": 0.8,
                "scaleDownStabilizationSeconds": 20,
                "mode": mode,
            },
            "triton": {"gpusPerReplica": 1},
        },
    }


class Lab:
    """Prometheus, the operator, the pod-paired tritonservers and the load, for one namespace."""

    def __init__(self, kube: Kube, ns: str, work: Path) -> None:
        self.kube, self.ns, self.work = kube, ns, work
        self.custom = client.CustomObjectsApi(kube.api)
        self.prometheus = LocalPrometheus(scrape_interval_s=1.0, work_dir=work / "prometheus")
        self.operator = Operator(kube, work)  # its env (Prometheus' URL) is set by start(); restartable
        files = work / "volume"
        write_model(files, "sleep", "# replaced by the ConfigMap's config\n", "sleep_model")
        self.tritons = PodTritons(
            work / "pods", "sleep", files, parameters={"alpha_ms": str(ALPHA_MS), "beta_ms": str(BETA_MS)}
        )
        self.load = BalancedLoad("sleep", grpc_fp32_input("INPUT0", [4]), self.tritons.endpoints, seed=7)
        self.following = ""  # the BatchedModel whose pods get servers (the "Service" of the load)
        self._stop = threading.Event()
        self._errors: list[str] = []
        self.console = Console(file=(work / "pods.log").open("w"), width=200)

    def bm(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        return obj

    def replicas(self, name: str) -> int:
        return int(self.kube.apps.read_namespaced_deployment(f"{name}-triton", self.ns).spec.replicas)

    def _config_name(self, pod: Any) -> str:
        return template_config_name(self.kube.api.sanitize_for_serialization(pod.spec)) or ""

    def _follow_pods(self) -> None:
        """Keep one tritonserver per Ready pod and Prometheus' targets in step with them."""
        while not self._stop.is_set():
            try:
                selector = f"{MODEL_LABEL}={self.following}"
                pods = self.kube.core.list_namespaced_pod(self.ns, label_selector=selector)
                live = [
                    p
                    for p in pods.items
                    if p.metadata.deletion_timestamp is None
                    and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
                ]
                ready = {p.metadata.name: p.spec.node_name for p in live}
                ips = {p.metadata.name: p.status.pod_ip or "" for p in live}
                configs = self.kube.core.list_namespaced_config_map(self.ns).items
                # the config the newest Ready pod mounts (its ConfigMap is named by the config's digest)
                newest = max(live, key=lambda p: p.metadata.creation_timestamp, default=None)
                mine = "" if newest is None else self._config_name(newest)
                config = next((c.data["config.pbtxt"] for c in configs if c.metadata.name == mine), None)
                if config is not None or not ready:
                    self.tritons.sync(ready, config or "", self.console, ips)
                    self.prometheus.set_targets(
                        [ScrapeTarget.from_url(s.metrics_url, self.ns, pod) for pod, s in self.tritons.servers.items()]
                    )
            except Exception as e:  # noted and re-raised by the test at the end
                self._errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(1.0)

    def start(self) -> None:
        self.prometheus.start()
        self._follower = threading.Thread(target=self._follow_pods, daemon=True)
        self._follower.start()
        self.load.start(0.0)
        self.operator.env = {
            "BATCHFILL_PROMETHEUS_URL": self.prometheus.url,
            "BATCHFILL_RECONCILE_INTERVAL_SECONDS": "3",
            "BATCHFILL_SIGNAL_WINDOW_SECONDS": "10",
            "BATCHFILL_PROMETHEUS_TIMEOUT_SECONDS": "2",
            "BATCHFILL_PROFILE_INTERVAL_SECONDS": "3",
            "BATCHFILL_NAMESPACES": self.ns,
        }

    def start_operator(self) -> None:
        """A new ``batchfill run`` (a new log file), checked to be still running 2 s later."""
        self.operator.start()
        time.sleep(2)
        assert self.operator.alive(), self.operator.log()[-3000:]

    def close(self) -> None:
        self.operator.stop()
        self._stop.set()
        self._follower.join(timeout=240)  # it may be starting a tritonserver: let it finish before stopping them
        self.load.stop()
        self.tritons.stop()
        self.prometheus.close()
        assert not self._errors, self._errors[:5]


@contextmanager
def running_lab(kube: Kube, work: Path) -> Iterator[Lab]:
    """A started :class:`Lab` with its operator running, in a new namespace; on exit everything is stopped, the
    namespace deleted, and the operator's logs checked for RBAC denials."""
    from batchfill.testbed.install import install_operator_rbac

    install_operator_rbac(kube.kubeconfig, work)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        lab = Lab(kube, ns, work)
        lab.start()
        try:
            lab.start_operator()
            yield lab
        finally:
            lab.close()  # stops the operator first (if a test left it running)
            denied = rbac_denials(lab.operator.logs())  # every run's log
            assert not denied, denied[:5]


def condition(bm: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (bm.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def scale_events(lab: Lab, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the model's Events, oldest first: what a failure shows of the decisions."""
    items = lab.kube.core.list_namespaced_event(lab.ns, field_selector=f"involvedObject.name={name}").items
    ordered = sorted(items, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
    return [(e.reason, e.message) for e in ordered]


def is_planned(bm: dict[str, Any]) -> bool:
    return condition(bm, ConditionType.PLANNED).get("status") == "True"
