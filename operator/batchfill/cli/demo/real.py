"""``batchfill demo --real-nodes``: the example served by the pods the operator rendered, on a real node.

1. a dev cluster with one real node (kubelet + containerd in a network namespace of its own,
   :mod:`batchfill.testbed.node`) whose kubelet advertises ``nvidia.com/gpu`` from the fake-GPU device plugin
   (``dev-cluster up --real-nodes 1``); the Triton image (scripts/build-triton-image.sh) imported
   into the node's containerd;
2. a real Prometheus discovering the Triton pods as prometheus-operator would for the ServiceMonitor the
   operator renders (Prometheus' own ``kubernetes_sd_configs``, :mod:`batchfill.testbed.prometheus_k8s`);
3. the operator as its ServiceAccount with ``BATCHFILL_TRITON_CPU_IMAGE`` (the pods run the local image, instance
   groups ``KIND_CPU``) and ``BATCHFILL_PROMETHEUS_URL``;
4. the example on a hostPath PersistentVolume, its profile measured here (as in the kwok demo);
5. the pods' init container assembling the repository from the volume and the ConfigMap, Triton loading the
   model, readiness gating the Service's EndpointSlices, and Poisson load through the Service: a client-side
   balancer following its ready EndpointSlice endpoints from the root network namespace
   (:class:`batchfill.testbed.balancer.ServiceEndpoints`; README says why not kube-proxy);
6. what a user checks: ``kubectl get pods -o wide`` on the real node, the GPU the device plugin allocated, and
   ``kubectl get bm`` with FILL and QUEUE MS from Prometheus while the load runs.

The cleanup steps are registered with the caller's :class:`~batchfill.cli.shutdown.Shutdown` as each part
starts, so Ctrl-C at any step stops what has started (newest first).
"""

from __future__ import annotations

import math
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console

from batchfill.adapters.triton_stats import summary_quantile_ms
from batchfill.cli.demo.results import DemoError, DemoOptions, DemoResult
from batchfill.cli.shutdown import Shutdown
from batchfill.render.kube import METRICS_PORT, Owner, build_service_monitor, names
from batchfill.testbed import devcluster
from batchfill.testbed.balancer import BalancedLoad, Sample, ServiceEndpoints
from batchfill.testbed.install import kubectl_stdout as _kubectl
from batchfill.testbed.loadgen import LoadResult, grpc_fp32_input
from batchfill.testbed.prometheus_local import PrometheusStartError

#: GPUs the fake device plugin advertises on the real node.
NODE_GPUS = 4
#: Prometheus' scrape interval here (s): the rendered ServiceMonitor's, shortened so that a 30 s load gives the
#: operator's rate() windows several samples.
SCRAPE_INTERVAL_S = 2
#: The operator's tick and signal window here (s), as the scaling tests use them (tests/cluster/test_scaling.py).
OPERATOR_ENV = {
    "BATCHFILL_RECONCILE_INTERVAL_SECONDS": "5",
    "BATCHFILL_SIGNAL_WINDOW_SECONDS": "15",
    "BATCHFILL_PROMETHEUS_TIMEOUT_SECONDS": "3",
}
#: The shortest load here (s): the operator needs a signal window of samples before FILL and QUEUE MS show.
MIN_LOAD_S = 40.0
#: How long the Triton pods may take to be Ready (s): the image's first start on the node, the init container's
#: copy, the model's load.
READY_TIMEOUT_S = 600.0
#: The longest unix socket path containerd accepts (its check, the portable sun_path size).
UNIX_PATH_MAX = 104
#: Stopping Prometheus (SIGTERM grace + SIGKILL wait).
PROMETHEUS_STOP_S = 15.0


def real_cluster(work: Path, shutdown: Shutdown, console: Console) -> tuple[Path, Any, str, float]:
    """The dev cluster with one real node advertising ``nvidia.com/gpu`` (its device plugin started and stopped
    with the node), the Triton image imported there.

    Returns (kubeconfig, the RealNode, the Triton image reference, the seconds spent building what was missing:
    the control plane, the kubelet, the image, the device plugin). Raises DemoError when the node advertises no
    GPU.
    """
    from batchfill.testbed.gpu_plugin import SOCKET_NAME, ensure_fake_gpu_plugin
    from batchfill.testbed.images import ensure_triton_image
    from batchfill.testbed.node import import_image, real_nodes

    node_dir = work / "cluster" / "real-node-0"
    sockets = (node_dir / "containerd" / "containerd.sock.ttrpc", node_dir / "kubelet" / "device-plugins" / SOCKET_NAME)
    longest = max(sockets, key=lambda p: len(str(p)))
    if len(str(longest)) > UNIX_PATH_MAX:  # containerd would exit: "unix socket path too long (> 104)"
        raise DemoError(f"--run-dir is too deep for the node's sockets ({longest}): use a shorter one, e.g. /tmp/bf")
    started = time.monotonic()
    devcluster.ensure_binaries(console, kubelet=True)
    image = ensure_triton_image(console)
    ensure_fake_gpu_plugin(console)
    build_s = time.monotonic() - started
    shutdown.on_exit(
        "stop the control plane and the real node",
        devcluster.STOP_TIMEOUT_S,
        devcluster.cluster_down,
        work / "cluster",
        console=console,
        quiet=True,
    )
    info = devcluster.cluster_up(work / "cluster", 0, 0, real_nodes=1, real_node_gpus=NODE_GPUS, console=console,
                                 die_with_parent=True, build=False)  # fmt: skip
    node = real_nodes(work / "cluster")[0]
    gpus = _node_gpus(info.kubeconfig, node.name)
    console.log(
        f"control plane up in {info.startup_s:.1f} s with real node {node.name} ({node.plan.node_ip}): its kubelet "
        f"advertises {gpus} nvidia.com/gpu from the batchfill-fake-gpu device plugin"
    )
    if gpus < 1:
        raise DemoError(f"{node.name} advertises no nvidia.com/gpu; device plugin log {node.logs}")
    t0 = time.monotonic()
    with console.status(f"importing {image.reference} into {node.name}'s containerd ..."):
        import_image(node, image.path)
    console.log(f"imported {image.reference} into {node.name}'s containerd in {time.monotonic() - t0:.0f} s")
    return info.kubeconfig, node, image.reference, build_s


def _node_gpus(kubeconfig: Path, node: str) -> int:
    out = _kubectl(kubeconfig, "get", "node", node, "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}")
    return int(out.strip() or 0)


def start_prometheus(kubeconfig: Path, owner: Owner, work: Path, shutdown: Shutdown, console: Console) -> Any:
    """A real Prometheus with the scrape job prometheus-operator generates for the operator's ServiceMonitor of
    ``owner`` (reads Endpoints with ``kubeconfig``); stopped by ``shutdown``."""
    from batchfill.testbed.prometheus_k8s import KubernetesPrometheus

    monitor = build_service_monitor(owner, interval_s=SCRAPE_INTERVAL_S)
    prometheus = KubernetesPrometheus(
        [monitor], kubeconfig, scrape_interval_s=SCRAPE_INTERVAL_S, work_dir=work / "prometheus", startup_timeout_s=60
    )
    shutdown.on_exit("stop Prometheus", PROMETHEUS_STOP_S, prometheus.stop)
    try:
        prometheus.start()
    except PrometheusStartError as e:
        raise DemoError(str(e)) from None
    job = prometheus.config()["scrape_configs"][0]["job_name"]
    console.log(
        f"Prometheus {prometheus.url}: job {job}, the relabeling prometheus-operator generates for the rendered "
        "ServiceMonitor, on targets discovered from the EndpointSlices (role endpointslice)"
    )
    return prometheus


def show_pods(console: Console, kubeconfig: Path, ns: str, selector: str, node: str) -> None:
    """``kubectl get pods -o wide``, the node's allocated resources and the GPU each Triton container was given."""
    console.rule(f"kubectl get pods -n {ns} -o wide")
    console.print(_kubectl(kubeconfig, "get", "pods", "-n", ns, "-o", "wide"), markup=False, highlight=False)
    described = _kubectl(kubeconfig, "describe", "node", node)
    start = described.find("Allocated resources:")
    end = described.find("Events:", start)
    console.rule(f"kubectl describe node {node}: Allocated resources")
    console.print(described[start:end].rstrip() if start >= 0 else described, markup=False, highlight=False)
    pods = _kubectl(kubeconfig, "get", "pods", "-n", ns, "-l", selector, "-o", "name").split()
    for pod in pods:
        env = _kubectl(kubeconfig, "exec", "-n", ns, pod, "-c", "triton", "--", "printenv", "NVIDIA_VISIBLE_DEVICES",
                       check=False).strip()  # fmt: skip
        console.print(f"{pod}: NVIDIA_VISIBLE_DEVICES={env or '(unset)'}", markup=False, highlight=False)


def bm_table(kubeconfig: Path) -> str:
    return _kubectl(kubeconfig, "get", "bm", "-A")


def _observed(custom: Any, ns: str, name: str) -> dict[str, Any]:
    from batchfill.api.spec import GROUP, PLURAL, VERSION

    bm = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return dict((bm.get("status") or {}).get("observed") or {})


def load_through_service(
    api: Any,
    kubeconfig: Path,
    ns: str,
    name: str,
    model: str,
    example: dict[str, Any],
    plan: dict[str, Any],
    pods: dict[str, tuple[str, str]],
    options: DemoOptions,
    console: Console,
) -> tuple[DemoResult, str]:
    """Poisson load at ``load_fraction`` of the planned capacity per Ready pod, sent to the Service's ready
    EndpointSlice endpoints (gRPC port) round-robin; returns the result and ``kubectl get bm -A`` as it was once
    the operator reported batch fill and queue time under that load (or at the load's end).

    ``pods``: Ready pod -> (node, pod IP). Long because it is the load, the wait for the operator's signals and the
    per-pod results in one sequence.
    """
    from kubernetes import client

    capacity = float(plan["capacityPerReplicaRps"])
    per_pod = options.load_fraction * capacity
    rate = per_pod * len(pods)
    seconds = max(options.load_seconds, MIN_LOAD_S)
    console.log(
        f"capacity at SLA {capacity:g} req/s per replica (predicted p99 {plan['predictedP99Ms']:g} ms <= T "
        f"{plan['serverBudgetMs']:g} ms): Poisson load λ = {rate:.1f} req/s through Service "
        f"{ns}/{names(Owner(name, ns, ''))['service']} ({len(pods)} pod(s))"
    )
    first = example["spec"]["model"]["inputs"][0]
    make = grpc_fp32_input(first["name"], first["dims"], seed=options.seed)
    custom = client.CustomObjectsApi(api)
    table = ""
    service = names(Owner(name, ns, ""))["service"]
    with ServiceEndpoints(api, ns, service, "grpc") as endpoints:
        if not endpoints.endpoints():
            raise DemoError(f"Service {ns}/{service} has no ready endpoint")
        load = BalancedLoad(model, make, endpoints.endpoints, seed=options.seed)
        t0 = time.monotonic()
        load.start(rate)
        try:
            with console.status(f"Poisson load {rate:.1f} req/s for {seconds:g} s through {ns}/{service} ..."):
                while time.monotonic() - t0 < seconds:
                    time.sleep(1.0)
                    observed = _observed(custom, ns, name)
                    signals = observed.get("batchFill") is not None and observed.get("queueTimeMs") is not None
                    if not table and signals and time.monotonic() - t0 > seconds / 2:
                        table = bm_table(kubeconfig)
        finally:
            load.stop()
        t1 = t0 + seconds
    table = table or bm_table(kubeconfig)
    by_ip = {ip: pod for pod, (_, ip) in pods.items()}
    loads = _per_pod(load.between(t0, t1), by_ip, per_pod, seconds)
    p99 = {pod: _server_p99(ip, model) for pod, (_, ip) in pods.items()}
    result = DemoResult(model=model, server_budget_ms=float(plan["serverBudgetMs"]), capacity_rps=capacity,
                        pods={p: n for p, (n, _) in pods.items()}, loads=loads, server_p99_ms=p99)  # fmt: skip
    return result, table


def _per_pod(samples: list[Sample], by_ip: dict[str, str], rate: float, seconds: float) -> dict[str, LoadResult]:
    """The samples per pod (by the endpoint's IP) as :class:`LoadResult` rows; arrivals that found no endpoint
    form a row of their own (``(no endpoint)``: no server p99, so the SLA counts as missed)."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        pod = by_ip.get(s.endpoint.rsplit(":", 1)[0], "(no endpoint)")
        groups.setdefault(pod, []).append(s)
    out = {}
    for pod, group in groups.items():
        ok = np.array([s.latency_ms for s in group if s.latency_ms is not None], dtype=np.float64)
        failed = sum(1 for s in group if s.latency_ms is None)
        out[pod] = LoadResult(rate_rps=rate, duration_s=seconds, sent=len(group), ok=int(ok.size), failed=failed,
                              latency_ms=ok, send_lag_ms=np.zeros(0), wall_s=seconds)  # fmt: skip
    return out


def _server_p99(ip: str, model: str) -> float | None:
    """Triton's own p99 (ms) of ``model`` from the pod's metrics port; None when it cannot be read."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{METRICS_PORT}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    value = summary_quantile_ms(text, model, 0.99)
    return None if value is None or not math.isfinite(value) else value


def run_real(options: DemoOptions, work: Path, shutdown: Shutdown, console: Console, t0: float) -> DemoResult:
    """The steps of the module docstring in order; cleanup goes to ``shutdown``. Raises as
    :func:`batchfill.cli.demo.run_demo` does. Long because it is the demo's sequence of steps, read top to bottom."""
    from kubernetes import client

    from batchfill.cli.demo import _deploy_example, _install_and_run_operator, _until, _wait_planned
    from batchfill.cli.demo.profile import measure_example_profile, with_profile
    from batchfill.cli.demo.report import report
    from batchfill.cli.demo.results import EXAMPLE, ROOT
    from batchfill.render.kube import MODEL_LABEL, template_config_name
    from batchfill.testbed.pod_tritons import ready_pods_with_ips

    kubeconfig, node, image_ref, build_s = real_cluster(work, shutdown, console)
    example = yaml.safe_load(EXAMPLE.read_text())
    ns, name = example["metadata"]["namespace"], example["metadata"]["name"]
    model = example["spec"]["model"]["name"]
    prometheus = start_prometheus(kubeconfig, Owner(name, ns, ""), work, shutdown, console)
    operator_log = work / "operator.log"
    env = {**OPERATOR_ENV, "BATCHFILL_PROMETHEUS_URL": prometheus.url, "BATCHFILL_TRITON_CPU_IMAGE": image_ref}
    operator = _install_and_run_operator(kubeconfig, work, operator_log, shutdown, console, env=env)
    console.log(f"operator: BATCHFILL_TRITON_CPU_IMAGE={image_ref} BATCHFILL_PROMETHEUS_URL={prometheus.url}")
    measured = measure_example_profile(example, work / "profile", console, seed=options.seed)
    example = with_profile(example, measured)
    _deploy_example(kubeconfig, work, example, None)
    applied_at = time.monotonic()
    console.log(f"kubectl apply --server-side -f {EXAMPLE.relative_to(ROOT)}, with the profile measured here")
    api = shutdown.enter(devcluster.api_client(kubeconfig), "close the API client", 5.0)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    bm = _wait_planned(custom, ns, name, operator, operator_log, options.timeout_s, console)
    selector = f"{MODEL_LABEL}={name}"
    found = _until(
        f"waiting for the Triton pods on {node.name}: init container, model load, readiness ...",
        lambda: ready_pods_with_ips(core, ns, selector),
        max(options.timeout_s, READY_TIMEOUT_S),
        console,
        lambda: _kubectl(kubeconfig, "get", "pods,events", "-n", ns, "-o", "wide", check=False),
    )
    now = time.monotonic()
    # the builds of a first run (minutes) are left out of "into the demo": they say nothing of the operator
    console.log(f"Triton pod(s) Ready {now - applied_at:.0f} s after the apply ({now - t0 - build_s:.0f} s into the "
                f"demo, not counting {build_s:.0f} s of builds): "
                f"{', '.join(sorted(found))}")  # fmt: skip
    pod = api.sanitize_for_serialization(core.read_namespaced_pod(next(iter(found)), ns))
    config_name = template_config_name(pod["spec"]) or ""
    config_pbtxt = str((core.read_namespaced_config_map(config_name, ns).data or {})["config.pbtxt"])
    show_pods(console, kubeconfig, ns, selector, node.name)
    try:
        prometheus.wait_for_pods(sorted(found), timeout_s=60)
    except TimeoutError as e:
        raise DemoError(f"{e}\nPrometheus log {prometheus.log_path}") from None
    console.log(f"Prometheus scrapes {', '.join(sorted(found))} (found through the Service's EndpointSlices)")
    result, table = load_through_service(
        api, kubeconfig, ns, name, model, example, bm["status"]["plan"], found, options, console
    )
    report(console, kubeconfig, ns, name, config_name, config_pbtxt, result, bm_table=table)
    console.log(f"demo done in {time.monotonic() - t0:.0f} s, {build_s:.0f} s of it building what was missing")
    if options.keep:
        console.print(
            f"\nthe demo stays up; in another shell:\n  export KUBECONFIG={kubeconfig} "
            f"PATH={devcluster.bin_dir()}:$PATH\n  kubectl get bm,pods -A -o wide\nCtrl-C stops everything."
        )
        while True:
            time.sleep(2.0)
    return result


__all__ = ["load_through_service", "real_cluster", "run_real", "show_pods", "start_prometheus"]
