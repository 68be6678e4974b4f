"""`batchfill demo`: the main job end to end on this machine, with real parts.

1. a real control plane (etcd, kube-apiserver, scheduler, controller-manager built from Go modules) with kwok
   nodes advertising ``nvidia.com/gpu`` (or an existing cluster named by ``--kubeconfig``, e.g. kind);
2. the CRD and the operator's RBAC from ``deploy/base`` (server-side apply, as a user would);
3. the operator (``batchfill run``) as its ServiceAccount, with a token: the install's RBAC, not an admin;
4. a PersistentVolume holding the real model (PP-OCRv4 text recognizer); the model's execution latency per batch
   size measured on this machine with one local tritonserver, as ``batchfill profile`` measures it; ``kubectl
   apply`` of the example BatchedModel (``deploy/examples/ocr-recognizer.yaml``, the deployable copy of
   ``examples/``) with that measured profile in place of the declared one (measured on another machine);
5. for every Ready Triton pod (a kwok pod: no container runs) one real tritonserver on 127.0.0.1 with the
   model repository assembled as the pod's init container does: the model files from the volume plus the
   ``config.pbtxt`` the operator wrote into the ConfigMap (instance group moved to ``KIND_CPU``: no GPU here);
6. Poisson load on those servers at a fraction of the capacity planned from the measured profile, and Triton's
   own p99 against the SLA;
7. what a user checks: ``kubectl get bm``, the rendered config, the pods on GPU nodes, the events.

Everything started is stopped on exit, on Ctrl-C and on SIGTERM, whatever step the demo is at, in at most
:func:`stop_timeout_s` (the sum of the stop timeouts below; :mod:`batchfill.cli.shutdown` says how). With
``--keep`` the demo stays up (tritonservers follow the Ready pods) until interrupted. The steps and their
cleanup stay in this one module (over 600 lines) so that what a Ctrl-C stops, and in which order, reads in one
place.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from rich.console import Console
from rich.table import Table

from batchfill.adapters.profiler import (
    ModelInfo,
    ProfileError,
    SizeMeasurement,
    connect,
    input_maker,
    measure,
    read_model_info,
)
from batchfill.adapters.triton_stats import summary_quantile_ms
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.api.validate import load_model
from batchfill.cli.profile import DEFAULT_QUANTILE, profile_points
from batchfill.cli.serve import _profile_table, provisional_plan
from batchfill.cli.shutdown import CHILD_GRACE_S, Shutdown, Terminated, run_cancellable
from batchfill.render import config_on_cpu, config_with_parameters, render_model_config
from batchfill.render.kube import GRPC_PORT, HTTP_PORT, METRICS_PORT, MODEL_LABEL
from batchfill.testbed import devcluster, triton_local
from batchfill.testbed.install import (
    CLAIM,
    OPERATOR_KILL_WAIT_S,
    OPERATOR_NS,
    OPERATOR_SA,
    OPERATOR_STOP_GRACE_S,
    install_operator_rbac,
    model_volume,
    operator_as_service_account,
)
from batchfill.testbed.install import kubectl_stdout as _kubectl
from batchfill.testbed.install import server_side_apply as _apply
from batchfill.testbed.loadgen import LoadResult, grpc_fp32_input, poisson_arrivals, run_poisson_async
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.triton_local import LocalTriton, TritonStartError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "deploy" / "examples" / "ocr-recognizer.yaml"
EXAMPLE_MODEL = "ocr_recognizer"  # the shipped model.py the example's annotation names

# Stop timeouts (seconds) of the cleanup's steps; their sum bounds it (stop_timeout_s).
#: A tritonserver gets this after SIGTERM before SIGKILL (Triton itself waits --exit-timeout-secs=5 for requests
#: in flight); all of them stop at once, each within triton_stop_timeout_s().
TRITON_STOP_GRACE_S = 10.0
# The operator's: OPERATOR_STOP_GRACE_S and OPERATOR_KILL_WAIT_S (batchfill.testbed.install).
#: One ``kubectl delete`` of an object the demo made in an existing cluster (``--kubeconfig``).
API_DELETE_TIMEOUT_S = 10.0
#: Local work: closing the API client, removing the working directory.
LOCAL_STEP_S = 5.0
STOPPING = "stopping what the demo started: tritonservers, operator, control plane or demo objects"
#: Unmeasured requests per batch size before the measured ones: the first execution of a new input shape pays
#: onnxruntime's one-time allocations (the first batch of 1 took about twice a warm one on a 2-core machine).
PROFILE_WARMUP = 1
#: Measured executions per batch size. With ``batchfill profile``'s p90 (numpy's "higher" quantile) of ten
#: executions the profile is the slowest of them: on a busy machine, the side to err on for a p99 SLA. Eleven
#: executions of each of the example's batch sizes 1, 2, 4, 8 and 16 (341 samples) took 12-38 s on a 2-core
#: machine shared with other work, depending on how busy it was.
PROFILE_REPEATS = 10


class DemoError(RuntimeError):
    """A demo step failed; the message says which and where its log is."""


@dataclass(frozen=True)
class DemoOptions:
    """``batchfill demo`` flags. Seconds and fractions of the planned capacity."""

    kubeconfig: Path | None = None
    run_dir: Path | None = None
    load_fraction: float = 0.7
    load_seconds: float = 15.0
    keep: bool = False
    seed: int = 0
    timeout_s: float = 180.0


@dataclass
class DemoResult:
    """What the demo observed (for the exit code and tests)."""

    model: str
    server_budget_ms: float
    capacity_rps: float
    pods: dict[str, str]  # Ready pod -> node
    loads: dict[str, LoadResult]
    server_p99_ms: dict[str, float | None]

    @property
    def sla_kept(self) -> bool:
        return bool(self.loads) and all(
            r.failed == 0 and (p := self.server_p99_ms.get(pod)) is not None and p <= self.server_budget_ms
            for pod, r in self.loads.items()
        )


def _until(what: str, fn: Callable[[], Any], timeout_s: float, console: Console, diag: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout_s
    with console.status(what):
        while time.monotonic() < deadline:
            value = fn()
            if value:
                return value
            time.sleep(0.5)
    raise DemoError(f"timed out after {timeout_s:g} s {what}\n{diag()}")


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


def stop_timeout_s(existing_objects: int | None = None) -> float:
    """The longest the demo's cleanup takes, in seconds: the sum of its steps' timeouts, as it prints when it
    starts stopping. ``existing_objects``: on an existing cluster, how many objects the demo made there (each
    gets :data:`API_DELETE_TIMEOUT_S`); None for the demo's own control plane (devcluster.STOP_TIMEOUT_S)."""
    cluster = devcluster.STOP_TIMEOUT_S if existing_objects is None else existing_objects * API_DELETE_TIMEOUT_S
    operator = OPERATOR_STOP_GRACE_S + OPERATOR_KILL_WAIT_S
    # working directory, control plane or objects, operator, API client, tritonservers, leftover children
    return LOCAL_STEP_S + cluster + operator + LOCAL_STEP_S + triton_stop_timeout_s() + 2 * CHILD_GRACE_S


def _gpu_nodes(kubeconfig: Path) -> list[str]:
    out = _kubectl(
        kubeconfig,
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.allocatable.nvidia\\.com/gpu}{'\\n'}{end}",
    )
    return [line.split()[0] for line in out.splitlines() if len(line.split()) == 2 and line.split()[1] != "0"]


def ready_pods_with_ips(core: Any, namespace: str, selector: str) -> dict[str, tuple[str, str]]:
    """Ready, not terminating pods: name -> (node, pod IP)."""
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return {
        p.metadata.name: (p.spec.node_name or "", p.status.pod_ip or "")
        for p in pods
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
    }


def _condition(bm: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (bm.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) in the main thread while inside; a second SIGTERM
    is ignored so it cannot cut that cleanup short. (The demo itself uses :class:`Shutdown`, which also takes
    SIGINT over and keeps later signals out of the whole cleanup.)"""

    def raise_interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_demo(options: DemoOptions, console: Console, shutdown: Shutdown | None = None) -> DemoResult:
    """Run the demo (module docstring); stops everything it started before returning or raising.

    ``shutdown``: where the cleanup steps go (the caller's ``with`` block runs them); by default one of its own.

    Raises:
        DemoError: a step failed (message with the log to read).
        devcluster.DevClusterError: the control plane could not be built or started.
        KeyboardInterrupt: Ctrl-C or SIGTERM (:class:`Terminated`), after the cleanup when the shutdown is the
            demo's own.
    """
    if not EXAMPLE.is_file():
        raise DemoError(f"{EXAMPLE} is missing: run the demo from a clone of the batchfill repository")
    if shutdown is None:
        with Shutdown(console, STOPPING) as own:
            return run_demo(options, console, own)
    base = options.run_dir or devcluster.default_run_dir().parent / "demo"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    shutdown.on_exit("remove the working directory", LOCAL_STEP_S, _remove_work, work, shutdown)
    t0 = time.monotonic()
    kubeconfig, made = _cluster(options, work, shutdown, console)

    install_operator_rbac(kubeconfig, work)
    console.log("installed the CRD, ServiceAccount and least-privilege RBAC from deploy/base")
    operator_log = work / "operator.log"
    operator = shutdown.enter(
        operator_as_service_account(kubeconfig, work, operator_log),
        "stop the operator",
        OPERATOR_STOP_GRACE_S + OPERATOR_KILL_WAIT_S,
    )
    console.log(
        f"operator running as ServiceAccount {OPERATOR_NS}/{OPERATOR_SA} (pid {operator.pid}, log {operator_log})"
    )

    example = yaml.safe_load(EXAMPLE.read_text())
    ns, name = example["metadata"]["namespace"], example["metadata"]["name"]
    model = example["spec"]["model"]["name"]
    measured = measure_example_profile(example, work / "profile", console, seed=options.seed)
    example = with_profile(example, measured)
    model_files = _deploy_example(kubeconfig, work, example, made)
    console.log(f"kubectl apply --server-side -f {EXAMPLE.relative_to(ROOT)}, with the profile measured here")

    from kubernetes import client

    api = shutdown.enter(devcluster.api_client(kubeconfig), "close the API client", LOCAL_STEP_S)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def operator_log_tail() -> str:
        return f"operator log {operator_log}:\n" + "\n".join(operator_log.read_text().splitlines()[-15:])

    def planned() -> dict[str, Any] | None:
        if operator.poll() is not None:
            raise DemoError(f"the operator exited with {operator.returncode}\n{operator_log_tail()}")
        bm = cast(dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
        return bm if _condition(bm, "Planned").get("status") == "True" else None

    bm = _until(
        f"waiting for the operator to plan {ns}/{name} ...", planned, options.timeout_s, console, operator_log_tail
    )
    selector = f"{MODEL_LABEL}={name}"
    found = _until(
        "waiting for the Triton pods to be scheduled on GPU nodes and Ready ...",
        lambda: ready_pods_with_ips(core, ns, selector),
        options.timeout_s,
        console,
        lambda: _kubectl(kubeconfig, "get", "pods,events", "-n", ns, "-o", "wide", check=False),
    )
    configmap = core.read_namespaced_config_map(f"{name}-triton-config", ns)
    config_pbtxt = str((configmap.data or {})["config.pbtxt"])
    tritons = PodTritons(work / "pods", model, model_files)
    shutdown.on_exit("stop the tritonservers", triton_stop_timeout_s(), tritons.stop)
    ready = {pod: node for pod, (node, _) in found.items()}
    tritons.sync(ready, config_pbtxt, console, {pod: ip for pod, (_, ip) in found.items()})

    result = _load(tritons, ready, model, example, bm["status"]["plan"], options, console)
    _report(console, kubeconfig, ns, name, config_pbtxt, result)
    console.log(f"demo done in {time.monotonic() - t0:.0f} s")
    if options.keep:
        _follow_pods(tritons, kubeconfig, core, ns, selector, config_pbtxt, console)
    return result


def _deploy_example(kubeconfig: Path, work: Path, example: dict[str, Any], made: list[tuple[str, ...]] | None) -> Path:
    """The model volume and the example BatchedModel (``example``, with the profile measured here), applied as a
    user would; on an existing cluster their
    ``kubectl delete`` arguments go to ``made``. Returns the volume's directory (the model files)."""
    ns, name = example["metadata"]["namespace"], example["metadata"]["name"]
    model_files = work / "volume"
    write_model(
        model_files, example["spec"]["model"]["name"], "# replaced by the ConfigMap's config.pbtxt\n", EXAMPLE_MODEL
    )
    _apply(kubeconfig, model_volume(ns, name, model_files), work / "volume.yaml")
    _kubectl(kubeconfig, "apply", "--server-side", "-f", str(ROOT / "deploy" / "examples" / "namespaces.yaml"))
    if made is not None:  # an existing cluster keeps its CRD and RBAC; the demo's objects go
        made += [("pv", f"{CLAIM}-{ns}-{name}"), ("pvc", "-n", ns, CLAIM), ("bm", "-n", ns, name)]
    applied = work / EXAMPLE.name
    applied.write_text(yaml.safe_dump(example, sort_keys=False))
    _kubectl(kubeconfig, "apply", "--server-side", "-f", str(applied))
    return model_files


def _follow_pods(
    tritons: PodTritons, kubeconfig: Path, core: Any, ns: str, selector: str, config_pbtxt: str, console: Console
) -> None:
    """``--keep``: one tritonserver per Ready pod, until interrupted."""
    console.print(
        f"\nthe demo stays up; in another shell:\n  export KUBECONFIG={kubeconfig} "
        f"PATH={devcluster.bin_dir()}:$PATH\n  kubectl get bm -A\nCtrl-C stops everything."
    )
    while True:
        time.sleep(2.0)
        found = ready_pods_with_ips(core, ns, selector)
        ips = {p: ip for p, (_, ip) in found.items()}
        tritons.sync({p: n for p, (n, _) in found.items()}, config_pbtxt, console, ips)


def _cluster(
    options: DemoOptions, work: Path, shutdown: Shutdown, console: Console
) -> tuple[Path, list[tuple[str, ...]] | None]:
    """The cluster to run on: the demo's own control plane, or ``--kubeconfig``'s with fake GPU nodes if it has
    no GPU node. Returns its kubeconfig, and for an existing cluster the list of ``kubectl delete`` arguments of
    the objects the demo makes there (filled in as it makes them; deleted on exit, newest first)."""
    if options.kubeconfig is None:
        devcluster.ensure_binaries(console)
        # Registered before the start: an interrupt between the start and the registration would leave it running.
        shutdown.on_exit(
            "stop the control plane",
            devcluster.STOP_TIMEOUT_S,
            devcluster.cluster_down,
            work / "cluster",
            console=console,
            quiet=True,
        )
        info = devcluster.cluster_up(work / "cluster", 2, 4, console=console, die_with_parent=True, build=False)
        console.log(f"control plane up in {info.startup_s:.1f} s: {info.server}, 2 kwok nodes x 4 nvidia.com/gpu")
        return info.kubeconfig, None
    kubeconfig = options.kubeconfig
    made: list[tuple[str, ...]] = []
    shutdown.on_exit(
        f"delete the demo's objects from the cluster of {kubeconfig}",
        lambda: len(made) * API_DELETE_TIMEOUT_S,
        _delete_objects,
        kubeconfig,
        made,
    )
    console.log(f"using the existing cluster of {kubeconfig}")
    if not _gpu_nodes(kubeconfig):
        # e.g. kind with kwok's controller deployed in it (README): kwok runs the Triton pods on these
        nodes = devcluster.desired_nodes(2, 4)
        made += [("node", node["metadata"]["name"]) for node in nodes]
        devcluster.ensure_fake_nodes(kubeconfig, nodes)
        console.log("no node advertises nvidia.com/gpu: added 2 kwok-managed fake GPU nodes x 4 GPUs")
    return kubeconfig, made


def _delete_objects(kubeconfig: Path, made: list[tuple[str, ...]]) -> None:
    """``kubectl delete`` each object of ``made`` (``kubectl delete`` arguments), newest first, each within
    :data:`API_DELETE_TIMEOUT_S`. Raises DemoError naming what is left, why, and the commands that delete it."""
    exe = devcluster.kubectl_path()
    kubectl = str(exe) if exe.is_file() else (shutil.which("kubectl") or "kubectl")
    left: list[str] = []
    why: list[str] = []
    for obj in (" ".join(o) for o in reversed(made)):
        flags = ["--ignore-not-found", "--wait=false", f"--request-timeout={API_DELETE_TIMEOUT_S / 2:g}s"]
        try:
            # A session of its own: a second Ctrl-C at the terminal must not kill the cleanup's kubectl.
            r = subprocess.run(
                [kubectl, f"--kubeconfig={kubeconfig}", "delete", *obj.split(), *flags],
                capture_output=True,
                text=True,
                timeout=API_DELETE_TIMEOUT_S,
                start_new_session=True,
            )
            error = (r.stderr.strip().splitlines() or [f"kubectl exited with {r.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            r, error = None, f"no answer in {API_DELETE_TIMEOUT_S:g} s"
        except OSError as e:
            r, error = None, str(e)
        if r is None or r.returncode != 0:
            left.append(obj)
            why.append(f"{obj}: {error}")
    if left:
        commands = "; ".join(f"kubectl --kubeconfig={kubeconfig} delete {obj}" for obj in left)
        raise DemoError(f"{', '.join(left)} left ({'; '.join(why)}); to delete them: {commands}")


def _remove_work(work: Path, shutdown: Shutdown) -> None:
    if shutdown.problems:  # its logs (and the control plane's PIDs) say what is left
        shutdown.console.print(f"kept {work}: not everything could be stopped or deleted", highlight=False)
        return
    shutil.rmtree(work, ignore_errors=True)


def measure_example_profile(
    example: Mapping[str, Any], work: Path, console: Console, *, seed: int = 0
) -> list[dict[str, Any]]:
    """``spec.profile`` of the example model as measured on this machine, what a user gets from ``batchfill profile``.

    One local tritonserver serves the model with a config that accepts every batch size of the declared profile
    (:func:`batchfill.cli.serve.provisional_plan`, ``KIND_CPU``); :func:`batchfill.adapters.profiler.measure`
    sends :data:`PROFILE_WARMUP` then :data:`PROFILE_REPEATS` requests of each size, one at a time and in rounds
    (:func:`_measure_in_rounds`), and reads each execution's latency from Triton's statistics (compute input +
    infer + output, no transport or queueing). The profile value is ``batchfill profile``'s default quantile
    (p90) of those executions, not their mean as ``batchfill serve`` takes: the plan treats ``l(b)`` as the
    latency of every execution, so a mean would plan as if the slow executions of a busy machine did not happen.
    The declared and measured profiles are printed side by side; the server is stopped (and ``work`` left for the
    caller to remove) however this ends.

    Args:
        example: the example BatchedModel document (``spec.profile`` gives the batch sizes measured).
        work: a new directory for the model repository and the server log.

    Returns:
        ``[{"batchSize": b, "latencyMs": ms}, ...]``, increasing in ``b``.

    Raises:
        DemoError: tritonserver did not start or the measurement failed (with the server log's path).
    """
    spec = load_model(example).spec
    model = spec.model.name
    declared = {p.batchSize: p.latencyMs for p in spec.profile or []}
    sizes = sorted(declared) or [1, 2, 4, 8, 16]  # serve's sizes for a model without a profile
    config = render_model_config(spec, provisional_plan(spec, sizes), instance_kind="KIND_CPU")
    write_model(work / "models", model, config, EXAMPLE_MODEL)
    log = work / "tritonserver.log"
    triton = LocalTriton(work / "models", log_path=log, startup_timeout_s=180)
    t0 = time.monotonic()
    with _interrupt_not_printed_by_gevent():
        try:  # start() inside: an interrupt while it waits for readiness must stop the server it spawned too
            with console.status(f"starting a tritonserver to measure {model} on this machine ..."):
                triton.start()
            client = connect(triton.http_url)
            try:
                info = read_model_info(client, triton.http_url, model)
                make = input_maker(info, triton.http_url, seed=seed)
                with console.status(f"measuring the execution latency of {model} for batch sizes {sizes} ..."):
                    measured = _measure_in_rounds(client, info, make, sizes)
            finally:
                client.close()
        except (TritonStartError, ProfileError) as e:
            raise DemoError(f"measuring the profile of {model} failed: {e}\ntritonserver log {log}") from None
        finally:
            triton.stop()
    points = profile_points(measured, DEFAULT_QUANTILE)
    console.log(
        f"measured {model} on this machine in {time.monotonic() - t0:.0f} s: p{DEFAULT_QUANTILE * 100:g} of "
        f"{PROFILE_REPEATS} executions per batch size after {PROFILE_WARMUP} warm-up"
    )
    _profile_table(console, declared, {p["batchSize"]: p["latencyMs"] for p in points})
    return points


@contextlib.contextmanager
def _interrupt_not_printed_by_gevent() -> Iterator[None]:
    """While inside, gevent's hub (tritonclient.http's event loop) passes Ctrl-C and SIGTERM on without printing
    them first, as `batchfill serve` has it (cli/main.py); the interrupt still reaches the caller."""
    import gevent

    hub = gevent.get_hub()
    not_error = hub.NOT_ERROR
    hub.NOT_ERROR = (*not_error, KeyboardInterrupt)
    try:
        yield
    finally:
        hub.NOT_ERROR = not_error


def _measure_in_rounds(
    client: Any, info: ModelInfo, make: Callable[[int], list[Any]], sizes: list[int]
) -> list[SizeMeasurement]:
    """:data:`PROFILE_REPEATS` rounds of one execution of every size (the warm-up in the first), merged per size.

    :func:`batchfill.adapters.profiler.measure` runs a size's executions back to back: the ten of batch 1 take
    0.3 s and catch the machine's load of that moment only (on a shared machine it changes from second to
    second; measured here: batch 1 at 0.77 of the declared latency, batch 16, measured seconds later, at 1.88).
    In rounds, every size is sampled across the whole measurement, so each quantile sees the same load.
    """
    rounds = [
        measure(client, info, make, sizes, warmup=PROFILE_WARMUP if i == 0 else 0, repeats=1)
        for i in range(PROFILE_REPEATS)
    ]
    return [
        SizeMeasurement(b, tuple(ms for r in rounds for m in r if m.batch_size == b for ms in m.executions_ms))
        for b in sizes
    ]


def with_profile(doc: Mapping[str, Any], profile: list[dict[str, Any]]) -> dict[str, Any]:
    """A copy of the BatchedModel document ``doc`` whose ``spec.profile`` is ``profile``; nothing else differs."""
    return {**doc, "spec": {**doc["spec"], "profile": [dict(p) for p in profile]}}


def _load(
    tritons: PodTritons,
    ready: dict[str, str],
    model: str,
    example: dict[str, Any],
    plan: dict[str, Any],
    options: DemoOptions,
    console: Console,
) -> DemoResult:
    """Poisson load at ``load_fraction`` of the planned capacity on every pod's tritonserver at once.

    ``plan`` is the operator's ``status.plan``, planned from the profile the demo applied (measured here).
    """
    capacity = float(plan["capacityPerReplicaRps"])
    rate = options.load_fraction * capacity
    console.log(
        f"the operator's plan from the measured profile: max_batch_size {plan['maxBatchSize']}, preferred "
        f"{plan['preferredBatchSizes']}, max_queue_delay_microseconds {plan['maxQueueDelayMicroseconds']}"
    )
    console.log(
        f"capacity at SLA {capacity:g} req/s per replica (predicted p99 {plan['predictedP99Ms']:g} ms <= T "
        f"{plan['serverBudgetMs']:g} ms): Poisson load λ = {options.load_fraction:.0%} of it = {rate:.1f} req/s"
    )
    first = example["spec"]["model"]["inputs"][0]
    make = grpc_fp32_input(first["name"], first["dims"], seed=options.seed)
    servers = dict(tritons.servers)
    what = (
        f"Poisson load: {rate:.1f} req/s per pod ({options.load_fraction:.0%} of the planned {capacity:g} req/s) "
        f"for {options.load_seconds:g} s on {len(servers)} pod(s) ..."
    )

    def job(url: str, seed: int) -> Callable[[], Coroutine[Any, Any, LoadResult]]:
        arrivals = poisson_arrivals(rate, duration_s=options.load_seconds, seed=seed)
        return lambda: run_poisson_async(url, model, make, arrivals, rate_rps=rate, duration_s=options.load_seconds)

    with console.status(what):
        loads = run_cancellable(
            {pod: job(s.grpc_url, options.seed + i) for i, (pod, s) in enumerate(sorted(servers.items()))}
        )
    p99 = {pod: summary_quantile_ms(s.metrics_text(), model, 0.99) for pod, s in servers.items()}
    return DemoResult(
        model=model,
        server_budget_ms=float(plan["serverBudgetMs"]),
        capacity_rps=capacity,
        pods=dict(ready),
        loads=loads,
        server_p99_ms=p99,
    )


def _fmt(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.1f}"


def _report(console: Console, kubeconfig: Path, ns: str, name: str, config: str, result: DemoResult) -> None:
    console.rule("kubectl get bm -A")
    console.print(_kubectl(kubeconfig, "get", "bm", "-A"), markup=False, highlight=False)
    console.rule(f"kubectl get configmap {name}-triton-config -n {ns}: config.pbtxt derived from the SLA")
    console.print(config, markup=False, highlight=False)
    console.rule("pods on GPU nodes")
    columns = (
        "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,GPUS:.spec.containers[0].resources.limits."
        "nvidia\\.com/gpu,READY:.status.conditions[?(@.type=='Ready')].status,"
        "CONFIG:.metadata.annotations.batchfill\\.io/config-hash"
    )
    console.print(_kubectl(kubeconfig, "get", "pods", "-n", ns, "-o", columns), markup=False, highlight=False)
    console.rule(f"events of {ns}/{name}")
    events = _kubectl(
        kubeconfig,
        "get",
        "events",
        "-n",
        ns,
        f"--field-selector=involvedObject.name={name}",
        "-o",
        "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message",
    )
    console.print(events, markup=False, highlight=False)
    console.print(load_table(result))
    verdict = "[green]SLA kept[/green]" if result.sla_kept else "[red]SLA missed[/red]"
    worst = max((p for p in result.server_p99_ms.values() if p is not None), default=None)
    console.print(f"{verdict}: worst server p99 {_fmt(worst)} ms against T = {result.server_budget_ms:g} ms")


def load_table(result: DemoResult) -> Table:
    """Per pod: the Poisson rate λ asked for and what was sent and answered per second over the load's duration
    (a seeded draw of arrivals differs from λ·duration: 292 arrivals in 15 s for λ = 22.3 req/s), the counts,
    Triton's and the client's p99 and the budget T (ms)."""
    table = Table(
        title="real tritonserver per Ready pod, under Poisson load",
        caption="λ: Poisson rate asked for; sent, achieved: requests sent, answered, per second of load",
    )
    columns = ("pod", "λ req/s", "sent req/s", "achieved req/s", "sent/failed", "server p99 ms", "client p99 ms")
    for col in (*columns, "T ms"):
        table.add_column(col, justify="right")
    for pod, r in sorted(result.loads.items()):
        table.add_row(
            pod,
            f"{r.rate_rps:.1f}",
            f"{r.sent / r.duration_s:.1f}" if r.duration_s > 0 else "n/a",
            f"{r.achieved_rate_rps:.1f}",
            f"{r.sent}/{r.failed}",
            _fmt(result.server_p99_ms.get(pod)),
            _fmt(r.p99_ms),
            f"{result.server_budget_ms:g}",
        )
    return table


def demo_main(options: DemoOptions, console: Console) -> int:
    """CLI entry: 0 when the SLA was kept and everything was cleaned up, 1 when the SLA was missed or a step or the
    cleanup failed, 130 on Ctrl-C and 143 on SIGTERM, whenever it came, even during the cleanup (128 + the first
    signal, as if it had killed the process; `batchfill serve` does the same)."""
    shutdown = Shutdown(console, STOPPING)
    result: DemoResult | None = None
    try:
        with shutdown:
            result = run_demo(options, console, shutdown)
    except KeyboardInterrupt:
        pass
    except (DemoError, devcluster.DevClusterError) as e:
        console.print(f"[red]demo failed:[/] {e}", highlight=False)
    except SystemExit:  # rich's answer to a closed pipe (`demo | tee` and Ctrl-C): the signal decides
        if not shutdown.interrupted:
            raise
    except Exception as e:
        if not shutdown.interrupted:
            raise
        console.print(f"[red]demo failed while interrupted:[/] {type(e).__name__}: {e}", highlight=False)
    if shutdown.signum is not None:
        if shutdown.problems:
            console.print("interrupted: not everything the demo started could be stopped or deleted (see above)")
        else:
            console.print("interrupted: everything the demo started has been stopped")
        return 128 + shutdown.signum
    if result is None:
        return 1
    summary = {"sla_kept": result.sla_kept, "server_p99_ms": result.server_p99_ms}
    console.print(json.dumps(summary, sort_keys=True), markup=False, highlight=False)
    return 0 if result.sla_kept and not shutdown.problems else 1
