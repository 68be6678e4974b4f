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

With ``--real-nodes`` (``make demo``) steps 1 and 5 differ: one real node runs the operator's Triton pods from a
local image, a real Prometheus scrapes them and the load goes through the Service (:mod:`.real`).

Everything started is stopped on exit, on Ctrl-C and on SIGTERM, whatever step the demo is at, in at most
:func:`stop_timeout_s` (the sum of the stop timeouts below; :mod:`batchfill.cli.shutdown` says how). With
``--keep`` the demo stays up (tritonservers follow the Ready pods) until interrupted. The steps and their
cleanup are in this module, so that what a Ctrl-C stops, and in which order, reads in one place; the profile
measurement is in :mod:`.profile`, the printed tables in :mod:`.report`, the results in :mod:`.results`, and the
tritonservers that follow the Ready pods in :mod:`batchfill.testbed.pod_tritons`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

import yaml
from rich.console import Console

from batchfill.adapters.triton_stats import summary_quantile_ms
from batchfill.api.reasons import ConditionType
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.cli.demo.profile import PROFILE_REPEATS, PROFILE_WARMUP, measure_example_profile, with_profile
from batchfill.cli.demo.report import load_table, report
from batchfill.cli.demo.results import EXAMPLE, EXAMPLE_MODEL, ROOT, DemoError, DemoOptions, DemoResult
from batchfill.cli.shutdown import CHILD_GRACE_S, Shutdown, run_cancellable, sigterm_as_interrupt
from batchfill.render.kube import MODEL_LABEL, template_config_name
from batchfill.testbed import devcluster
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
from batchfill.testbed.pod_tritons import TRITON_STOP_GRACE_S, PodTritons, ready_pods_with_ips, triton_stop_timeout_s

# The operator's: OPERATOR_STOP_GRACE_S and OPERATOR_KILL_WAIT_S (batchfill.testbed.install).
#: One ``kubectl delete`` of an object the demo made in an existing cluster (``--kubeconfig``).
API_DELETE_TIMEOUT_S = 10.0


#: ``--real-nodes``' default run directory: short, because the node's unix sockets lie deep below it (at most 104
#: bytes, containerd's limit), and on disk (the node's containerd unpacks the Triton image there).
REAL_NODES_RUN_DIR = Path("/var/tmp/bf-demo")

#: Local work: closing the API client, removing the working directory.
LOCAL_STEP_S = 5.0


STOPPING = "stopping what the demo started: tritonservers, operator, control plane or demo objects"


def _until(what: str, fn: Callable[[], Any], timeout_s: float, console: Console, diag: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout_s
    with console.status(what):
        while time.monotonic() < deadline:
            value = fn()
            if value:
                return value
            time.sleep(0.5)
    raise DemoError(f"timed out after {timeout_s:g} s {what}\n{diag()}")


def stop_timeout_s(existing_objects: int | None = None, real_nodes: bool = False) -> float:
    """The longest the demo's cleanup takes, in seconds: the sum of its steps' timeouts, as it prints when it
    starts stopping. ``existing_objects``: on an existing cluster, how many objects the demo made there (each
    gets :data:`API_DELETE_TIMEOUT_S`); None for the demo's own control plane (devcluster.STOP_TIMEOUT_S).
    ``real_nodes``: the ``--real-nodes`` demo (Prometheus instead of local tritonservers)."""
    cluster = devcluster.STOP_TIMEOUT_S if existing_objects is None else existing_objects * API_DELETE_TIMEOUT_S
    operator = OPERATOR_STOP_GRACE_S + OPERATOR_KILL_WAIT_S
    if real_nodes:
        from batchfill.cli.demo.real import PROMETHEUS_STOP_S

        # working directory, control plane with the real node, Prometheus, operator, API client, leftover children
        return LOCAL_STEP_S + cluster + PROMETHEUS_STOP_S + operator + LOCAL_STEP_S + 2 * CHILD_GRACE_S
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


def _condition(bm: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (bm.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


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
    base = options.run_dir or (
        REAL_NODES_RUN_DIR if options.real_nodes else devcluster.default_run_dir().parent / "demo"
    )
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    shutdown.on_exit("remove the working directory", LOCAL_STEP_S, _remove_work, work, shutdown)
    t0 = time.monotonic()
    if options.real_nodes:
        return _run_real(options, work, shutdown, console, t0)
    kubeconfig, made = _cluster(options, work, shutdown, console)

    operator_log = work / "operator.log"
    operator = _install_and_run_operator(kubeconfig, work, operator_log, shutdown, console)

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

    bm = _wait_planned(custom, ns, name, operator, operator_log, options.timeout_s, console)
    selector = f"{MODEL_LABEL}={name}"
    found = _until(
        "waiting for the Triton pods to be scheduled on GPU nodes and Ready ...",
        lambda: ready_pods_with_ips(core, ns, selector),
        options.timeout_s,
        console,
        lambda: _kubectl(kubeconfig, "get", "pods,events", "-n", ns, "-o", "wide", check=False),
    )
    # The config the pods mount: its ConfigMap is named by its digest (render.kube.configmap_name).
    pod = api.sanitize_for_serialization(core.read_namespaced_pod(next(iter(found)), ns))
    config_name = template_config_name(pod["spec"]) or ""
    configmap = core.read_namespaced_config_map(config_name, ns)
    config_pbtxt = str((configmap.data or {})["config.pbtxt"])
    tritons = PodTritons(work / "pods", model, model_files)
    shutdown.on_exit("stop the tritonservers", triton_stop_timeout_s(), tritons.stop)
    ready = {pod: node for pod, (node, _) in found.items()}
    tritons.sync(ready, config_pbtxt, console, {pod: ip for pod, (_, ip) in found.items()})

    result = _load(tritons, ready, model, example, bm["status"]["plan"], options, console)
    # what the user checks next is `kubectl get bm`: shown once the status counts the Ready replicas (the operator
    # writes them at its next scaling tick, up to BATCHFILL_RECONCILE_INTERVAL_SECONDS after the pods got Ready)
    _until(f"waiting for {ns}/{name}'s status to count its {len(ready)} Ready replica(s) ...",
           lambda: _status_counts(custom, ns, name, len(ready)), STATUS_WAIT_S, console,
           lambda: _kubectl(kubeconfig, "get", "bm,pods,events", "-n", ns, check=False))  # fmt: skip
    report(console, kubeconfig, ns, name, config_name, config_pbtxt, result)
    console.log(f"demo done in {time.monotonic() - t0:.0f} s")
    if options.keep:
        _follow_pods(tritons, kubeconfig, core, ns, selector, config_pbtxt, console)
    return result


def _run_real(options: DemoOptions, work: Path, shutdown: Shutdown, console: Console, t0: float) -> DemoResult:
    """``--real-nodes``: the demo on real pods (:mod:`.real`)."""
    from batchfill.cli.demo.real import run_real

    return run_real(options, work, shutdown, console, t0)


def _install_and_run_operator(
    kubeconfig: Path,
    work: Path,
    operator_log: Path,
    shutdown: Shutdown,
    console: Console,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """deploy/base's CRD and RBAC applied, then ``batchfill run`` as the install's ServiceAccount (stopped by
    ``shutdown``), with ``env`` added to its environment."""
    install_operator_rbac(kubeconfig, work)
    console.log("installed the CRD, ServiceAccount and least-privilege RBAC from deploy/base")
    operator = shutdown.enter(
        operator_as_service_account(kubeconfig, work, operator_log, env=env),
        "stop the operator",
        OPERATOR_STOP_GRACE_S + OPERATOR_KILL_WAIT_S,
    )
    console.log(
        f"operator running as ServiceAccount {OPERATOR_NS}/{OPERATOR_SA} (pid {operator.pid}, log {operator_log}: "
        "removed with the demo's folder when it ends, kept while --keep runs)"
    )
    return operator


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


#: The longest the status may take to count the Ready replicas after the load (s): a few scaling ticks.
STATUS_WAIT_S = 90.0


def _status_counts(custom: Any, ns: str, name: str, pods: int) -> bool:
    """Whether the BatchedModel's status says ``pods`` replicas Ready and its Ready condition is True."""
    bm = cast(dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
    ready = int((bm.get("status") or {}).get("readyReplicas") or 0)
    return ready >= pods and _condition(bm, ConditionType.READY).get("status") == "True"


def _wait_planned(
    custom: Any, ns: str, name: str, operator: Any, operator_log: Path, timeout_s: float, console: Console
) -> dict[str, Any]:
    """The BatchedModel once the operator planned it (Planned=True); DemoError with the operator log's tail when
    the operator exits first or ``timeout_s`` passes."""

    def operator_log_tail() -> str:
        return f"operator log {operator_log}:\n" + "\n".join(operator_log.read_text().splitlines()[-15:])

    def planned() -> dict[str, Any] | None:
        if operator.poll() is not None:
            raise DemoError(f"the operator exited with {operator.returncode}\n{operator_log_tail()}")
        bm = cast(dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
        return bm if _condition(bm, ConditionType.PLANNED).get("status") == "True" else None

    found: dict[str, Any] = _until(f"waiting for the operator to plan {ns}/{name} ...", planned, timeout_s, console,
                                   operator_log_tail)  # fmt: skip
    return found


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


__all__ = [
    "EXAMPLE",
    "EXAMPLE_MODEL",
    "PROFILE_REPEATS",
    "PROFILE_WARMUP",
    "ROOT",
    "TRITON_STOP_GRACE_S",
    "DemoError",
    "DemoOptions",
    "DemoResult",
    "PodTritons",
    "demo_main",
    "load_table",
    "measure_example_profile",
    "ready_pods_with_ips",
    "run_demo",
    "sigterm_as_interrupt",
    "stop_timeout_s",
    "triton_stop_timeout_s",
    "with_profile",
]
