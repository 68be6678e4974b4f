"""Six BatchedModels sharing one GPUPool's Triton pods, run by a real kubelet and containerd, end to end.

One real node (kubelet + containerd in a network namespace of the test bed's own, :mod:`batchfill.testbed.node`)
whose kubelet advertises ``NODE_GPUS`` ``nvidia.com/gpu`` from the fake-GPU device plugin. **Only the GPU is
emulated**: no container sees a GPU, Triton runs on CPU (``BATCHFILL_TRITON_CPU_IMAGE``: the pool pods run that
image and the operator loads ``KIND_CPU`` instance groups). Everything else is real: the API server, scheduler,
controller-manager, kubelet, containerd, the pool's Deployment and pods, Triton's repository API (explicit model
control), the per-model Services and their EndpointSlices, Prometheus scraping the pool's metrics Service, and the
operator (``batchfill run`` as its ServiceAccount, whose pool loop plans, scales, loads, labels and unloads).

The models are the Python-backend sleep model written under six Triton names, each sleeping its own
``ALPHA + BETA * b`` per batch (defaults set in each model.py: the config the operator loads carries no model
parameters), on a hostPath PersistentVolume that the pool's pods mount as their model repository. Each model
declares a profile matching its sleep and its own SLA, and ``spec.model.warmup`` (the first executions run before
a copy is READY).

The one module-scoped ``pool`` fixture goes through the pool's life, and the tests run in order on it: the six
models placed on fewer pods than models, served under Poisson load within their SLAs with no failed request, one
model deleted (unloaded from every pod after the drain, the others serving meanwhile), then all deleted (the pool
back to ``minPods`` = 0 pods). Every request's outcome is counted and the figures are printed.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest

from batchfill.adapters.triton_stats import ModelStats, delta, parse_model_stats
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.controller.pool_models import DRAIN_S
from batchfill.render.kube import HTTP_PORT
from batchfill.render.pool import LOADED, PoolOwner, build_pool_service_monitor, loaded_label

from .pool_support import (
    NOT_SERVING,
    Pool,
    Sleep,
    figures,
    model_doc,
    models_on,
    pod_ready,
    pool_doc,
    repository_index,
    slowest,
    states_of,
)
from .shared_agreement import GPU_TOLERANCE, Figures, disagreements, fleet_of, planned, simulated
from .support import Sampler, real_node_lab, wait_for, write_sleep_model

pytestmark = pytest.mark.cluster
#: conftest.py builds the kubelet at collection time (outside the test's timeout) when this is selected.
NEEDS_KUBELET = True

NODE_GPUS = 3
NS = "shared-pool"
POOL = "small"
MIN_PODS, MAX_PODS = 0, 2
INTERVAL_S = 3
OPERATOR_ENV = {
    "BATCHFILL_RECONCILE_INTERVAL_SECONDS": str(INTERVAL_S),
    # long enough that a few req/s read as a steady rate (10 s of 3 req/s is +-20 %: the plan moves models on it)
    "BATCHFILL_SIGNAL_WINDOW_SECONDS": "30",
    "BATCHFILL_PROMETHEUS_TIMEOUT_SECONDS": "2",
    "BATCHFILL_PROFILE_INTERVAL_SECONDS": "3",
    "BATCHFILL_NAMESPACES": NS,
}
#: Pods take: the sandbox, tritonserver's start; then each model's load through the repository API.
READY_S = 300.0
#: Poisson rate per model (requests/s) and how long the main load runs.
RATE_RPS, LOAD_S = 3.0, 75.0
#: Then, the placement holding still, the window each model's figures are read over from Triton's statistics
#: (compared with the fleet simulator: tests/cluster/shared_agreement.py), s.
STEADY_S, STEADY_ATTEMPTS = 45.0, 4
#: Inside each pool pod (its /dev/shm emptyDir): the lock every model's execution holds, one GPU emulated per pod.
GPU_LOCK = "/dev/shm/batchfill-gpu.lock"


MODELS = (
    Sleep("sp-fast", "sleep-fast", 10, 2, 100),
    Sleep("sp-quick", "sleep-quick", 20, 3, 150),
    Sleep("sp-batchy", "sleep-batchy", 15, 10, 180),
    Sleep("sp-mid", "sleep-mid", 30, 4, 200),
    Sleep("sp-std", "sleep-std", 40, 6, 250),
    Sleep("sp-slow", "sleep-slow", 60, 5, 350),
)
#: The model deleted first.
GONE = MODELS[2]


def shared_doc(m: Sleep) -> dict[str, Any]:
    # warm-up: a copy is READY, and routed to, only after Triton ran its first executions (test_shared_moves)
    return model_doc(m, NS, {"mode": "Shared", "pool": POOL}, warmup=True)


@dataclass
class SharedPool(Pool):
    #: test_poisson_load_on_all_six_within_their_slas's steady window: (models per serving pod, figures by model)
    steady: tuple[list[list[str]], dict[str, Figures], tuple[float, float]] | None = None


def write_models(files: Path) -> None:
    for m in MODELS:
        write_sleep_model(files, m.triton, m.alpha_ms, m.beta_ms, gpu_lock=GPU_LOCK)


@pytest.fixture(scope="module")
def pool() -> Iterator[SharedPool]:
    """The cluster with one real node, Prometheus scraping the pool's metrics Service, the operator, the GPUPool."""
    monitor = build_pool_service_monitor(PoolOwner(POOL, NS, ""), interval_s=2)
    with real_node_lab(NS, NODE_GPUS, write_models, [monitor], OPERATOR_ENV, prefix="bf-sp-") as lab:
        p = SharedPool(lab, NS, POOL)
        p.create_gpupool(MIN_PODS, MAX_PODS)
        yield p


def _placed(pool: SharedPool) -> dict[str, dict[str, Any]] | None:
    """Every model's status.placement once each is on >= 1 pod and its Service has a ready endpoint, else None."""
    out = {}
    for m in MODELS:
        placement = (pool.bm(m.name).get("status") or {}).get("placement") or {}
        if int(placement.get("podCount") or 0) < 1 or not pool.ready_endpoints(m):
            return None
        out[m.name] = placement
    return out


def _all_serving(pool: SharedPool) -> dict[str, list[str]] | None:
    """{pod: the model labels it carries} when every Ready pool pod carries one, else None."""
    ready = {p.metadata.name: models_on(p) for p in pool.pods() if pod_ready(p)}
    return ready if ready and all(ready.values()) else None


@dataclass
class PoolWatch(Sampler):
    """Samples the pool every second in a thread: its (pods, ready, desired) changes and the longest time a Ready
    pod carried no model label."""

    pool: Pool
    t0: float = 0.0  # monotonic s: when it started
    changes: list[tuple[int, int, int, int | None]] = field(default_factory=list)
    longest_idle_s: float = 0.0
    _idle_since: dict[str, float] = field(default_factory=dict)

    def sample(self) -> None:
        pods = self.pool.pods()
        desired = (self.pool.gpupool().get("status") or {}).get("desiredPods")
        now = time.monotonic()
        ready = [p for p in pods if pod_ready(p)]
        row = (len(pods), len(ready), desired)
        if not self.changes or self.changes[-1][1:] != row:
            self.changes.append((round(now - self.t0), *row))
        idle = {p.metadata.name for p in ready if not models_on(p)}
        self._idle_since = {n: self._idle_since.get(n, now) for n in idle}
        for since in self._idle_since.values():
            self.longest_idle_s = max(self.longest_idle_s, now - since)

    def __enter__(self) -> Self:
        self.t0 = time.monotonic()
        return super().__enter__()


def _server_p99(pool: SharedPool) -> dict[str, float]:
    """Triton's own p99 request latency per model (ms), from the summary Prometheus scraped; {} if unanswered."""
    promql = f'max by (model) (nv_inference_request_summary_us{{quantile="0.99", namespace="{NS}"}})'
    try:
        rows = pool.prometheus_query(promql)
    except (OSError, ValueError, KeyError) as e:
        print(f"Prometheus query failed: {e}")
        return {}
    return {r["metric"]["model"]: float(r["value"][1]) / 1000 for r in rows if r["value"][1] not in ("NaN", "+Inf")}


def _counts(status: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(status.get(k) for k in ("models", "readyPods", "pods", "desiredPods"))


def test_six_models_share_fewer_pods(pool: SharedPool) -> None:
    t0 = time.monotonic()
    for m in MODELS:
        pool.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, shared_doc(m))
    placed = wait_for("every model placed on a pool pod with a ready endpoint", lambda: _placed(pool), READY_S, 2.0)
    took = time.monotonic() - t0
    pods = pool.pods()
    status = wait_for(
        "the GPUPool's status to count 6 models",
        lambda: s if (s := pool.gpupool().get("status") or {}).get("models") == len(MODELS) else None,
        timeout_s=30,
        interval_s=1.0,
    )
    print(f"\nplaced in {took:.0f} s on {len(pods)} pod(s): {sorted(p.metadata.name for p in pods)}")
    print(f"GPUPool status: {status}")
    for m in MODELS:
        print(f"  {m.name} ({m.triton}): placement {placed[m.name]}; endpoints {pool.ready_endpoints(m)}")
    assert 1 <= len(pods) <= MAX_PODS < len(MODELS)
    assert all(p.spec.node_name == pool.lab.node for p in pods)
    assert status["pods"] == len(pods)
    assert status["readyPods"] >= 1
    # the CRD's status schema takes the condition the operator writes (pool_sync.pool_validity)
    valid = [(c["status"], c["reason"]) for c in status.get("conditions") or [] if c["type"] == "ConfigValid"]
    assert valid == [("True", "Valid")], status
    for m in MODELS:
        assert placed[m.name]["mode"] == "Shared"
        assert placed[m.name]["pool"] == POOL
        labelled = [p for p in pods if (p.metadata.labels or {}).get(loaded_label(m.name)) == LOADED]
        assert labelled, f"no pool pod carries {loaded_label(m.name)}"
        for p in labelled:  # what routes is what serves
            assert repository_index(p.status.pod_ip).get(m.triton) == "READY", (p.metadata.name, m.triton)
    # no Deployment of a model's own
    own = {d.metadata.name for d in pool.lab.kube.apps.list_namespaced_deployment(NS).items}
    assert own == {f"{POOL}-pool"}, own


def _pod_stats(pod_ip: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{pod_ip}:{HTTP_PORT}/v2/models/stats", timeout=5) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


def _steady_window(pool: SharedPool) -> tuple[list[list[str]], dict[str, Figures], tuple[float, float]]:
    """Each model's figures over ``STEADY_S`` from Triton's statistics on the pods serving it, in a window whose
    placement held still (the same labels at both ends, no model reloaded); the BatchedModels each serving pod
    carries; and the window (monotonic s). The plan may still move a model when the measured rates cross its
    hysteresis (a window of a few req/s is noisy): such a window is measured again, up to ``STEADY_ATTEMPTS``."""
    triton = {loaded_label(m.name): m for m in MODELS}

    def snapshot(serving: dict[str, list[str]], ips: dict[str, str]) -> dict[str, list[ModelStats]]:
        out: dict[str, list[ModelStats]] = {}
        for pod, labels in serving.items():
            answer = _pod_stats(ips[pod])
            for label in labels:
                m = triton[label]
                out.setdefault(m.name, []).append(parse_model_stats(answer, m.triton))
        return out

    moved = []
    for attempt in range(STEADY_ATTEMPTS):
        serving = wait_for("every Ready pool pod serving a model", lambda: _all_serving(pool), 60, 1.0)
        ips = {p.metadata.name: p.status.pod_ip for p in pool.pods() if p.metadata.name in serving}
        try:
            before = snapshot(serving, ips)
            t0 = time.monotonic()
            time.sleep(STEADY_S)  # the window's length, not an assertion
            if _all_serving(pool) != serving:
                raise KeyError("labels changed")
            after = snapshot(serving, ips)
            t1 = time.monotonic()
            deltas = {n: [delta(b, a) for b, a in zip(before[n], after[n], strict=True)] for n in before}
        except (KeyError, ValueError) as e:  # a model moved (unloaded, or reloaded: counters went back)
            moved.append(f"attempt {attempt + 1}: {e}")
            continue
        figures = {}
        for name, ds in deltas.items():
            requests = sum(d.success.count for d in ds)
            executions = sum(d.execution_count for d in ds)
            figures[name] = Figures(
                rate_rps=requests / STEADY_S,
                mean_ms=sum(d.success.ns for d in ds) / max(requests, 1) / 1e6,
                avg_batch=sum(d.inference_count for d in ds) / max(executions, 1),
                requests=requests,
            )
        groups = [sorted(triton[label].name for label in labels) for _, labels in sorted(serving.items())]
        print(f"\nsteady window {attempt + 1} of at most {STEADY_ATTEMPTS}; windows with a move: {moved}")
        return groups, figures, (t0, t1)
    raise AssertionError(f"the placement never held still for {STEADY_S} s: {moved}")


def test_poisson_load_on_all_six_within_their_slas(pool: SharedPool) -> None:
    """Poisson load from cold: the pool was planned at 0 req/s (one pod); once the rates are known the plan grows it.
    Every request of the whole run succeeds, and each model's client p99 is within its SLA in the steady window
    after the plan has reacted. The whole run's p99 is printed beside it: before the pool grows, the six models
    share one emulated GPU, which the plan does not admit at these rates, for the rate window (30 s) plus a pod's
    start."""
    print(f"\nthreads of this process before the load: {sorted(t.name for t in threading.enumerate())}")
    loads = pool.loads(MODELS, seed=100)
    with ExitStack() as stack:
        for _, endpoints, _load in loads:
            stack.enter_context(endpoints)
        watch = stack.enter_context(PoolWatch(pool))
        for _, _, load in loads:
            load.start(RATE_RPS)
        time.sleep(LOAD_S)  # the load's duration, not an assertion
        # the load still on: every Ready pod of the pool serves a model (a pod the plan added is given its slot)
        serving = wait_for("every Ready pool pod serving a model", lambda: _all_serving(pool), 30, 1.0)
        pool.steady = _steady_window(pool)
        # the load still on: each shared model's own signals, read by the pool loop over its copies
        statuses = {m.name: pool.bm(m.name).get("status") or {} for m in MODELS}
        observed = {n: s.get("observed") or {} for n, s in statuses.items()}
        metrics = {n: [(c["status"], c["reason"]) for c in s.get("conditions") or [] if c["type"] == "MetricsAvailable"]
                   for n, s in statuses.items()}  # fmt: skip
        for _, _, load in loads:
            load.stop()
    server = _server_p99(pool)
    window = pool.steady[2]
    total_sent = total_failed = 0
    bad = []
    print(f"\nPoisson {RATE_RPS} req/s per model for {time.monotonic() - watch.t0:.0f} s; pool over time (s, pods, "
          f"ready, desired):")  # fmt: skip
    print(f"  {watch.changes}")
    print(f"  longest a Ready pod served no model: {watch.longest_idle_s:.0f} s; after {LOAD_S:.0f} s: {serving}")
    print(f"  steady window: {window[0] - watch.t0:.0f}-{window[1] - watch.t0:.0f} s, {pool.steady[0]}")
    for m, _, load in loads:
        sent, failed, p99 = figures(load)
        steady_sent, _, steady_p99 = figures(load, window)
        total_sent, total_failed = total_sent + sent, total_failed + failed
        s99 = server.get(m.triton)
        print(
            f"  {m.name}: T={m.p99_ms} ms, client p99 {steady_p99:.1f} ms in the steady window ({steady_sent} sent), "
            f"{p99:.1f} ms over the run; server p99 (Prometheus summary) "
            f"{'n/a' if s99 is None else f'{s99:.1f} ms'}; {sent} sent, {failed} failed"
        )
        print(f"    slowest in the steady window (s, endpoint, ms, of which the generator's lateness): "
              f"{slowest(load, watch.t0, window)}")  # fmt: skip
        if failed or not steady_p99 <= m.p99_ms:
            bad.append((m.name, sent, failed, round(steady_p99, 1), m.p99_ms))
    print(f"  total: {total_sent} sent, {total_failed} failed")
    print(f"  status.observed: {observed}")
    assert total_sent >= 0.7 * RATE_RPS * LOAD_S * len(MODELS)
    assert not bad, bad
    rates = {n: o.get("requestRate") for n, o in observed.items()}
    assert all(r is not None and RATE_RPS / 2 <= r <= 2 * RATE_RPS for r in rates.values()), rates
    assert all(v == [("True", "SignalsOk")] for v in metrics.values()), metrics  # the pool loop's, from its copies


def test_the_fleet_simulator_agrees_with_the_cluster(pool: SharedPool) -> None:
    """The fleet benchmark's code on this fleet at the rates measured in the steady window: as many GPUs as pods
    serving (within one: tests/cluster/shared_agreement.py says why), every model within its SLA there as here; and
    on the cluster's own grouping the simulator admits every model (p99 within its server budget), with each
    model's mean server latency and batch size within the tolerances of tests/cluster/shared_agreement.py."""
    assert pool.steady is not None, "test_poisson_load_on_all_six_within_their_slas did not reach its steady window"
    groups, real, _ = pool.steady
    docs = [{**shared_doc(m), "metadata": {"name": m.name, "namespace": NS, "uid": m.name}} for m in MODELS]
    fleet = fleet_of(docs)
    rates = {n: real[n].rate_rps for n in fleet.names}
    run = planned(fleet, rates, float(pool_doc(POOL, NS, MIN_PODS, MAX_PODS)["spec"]["gpuMemoryMiB"]), seed=1)
    placement = run.placements[0]
    sim = simulated(fleet, groups, rates, seed=7)
    print(f"\ncluster: {len(groups)} pods serving {groups}")
    tenants = [list(g.tenants) for g in placement.shared]
    print(f"fleet simulator at the measured rates: {run.shared_gpus[0]} GPUs {tenants}")
    for name in fleet.names:
        r, s = real[name], sim[name]
        n, ok = run.attainment_shared[name]
        print(
            f"  {name}: {r.rate_rps:.2f} req/s; mean server latency {r.mean_ms:.1f} ms real, {s.mean_ms:.1f} "
            f"simulated; mean batch {r.avg_batch:.2f} real, {s.avg_batch:.2f} simulated; simulated p99 "
            f"{s.p99_ms:.1f} ms of {fleet.plans[name].server_budget_ms:.0f} on the cluster's grouping; fleet plan "
            f"{ok / max(n, 1):.2%} within its budget"
        )
    assert abs(run.shared_gpus[0] - len(groups)) <= GPU_TOLERANCE, (run.shared_gpus[0], groups)
    assert all(ok >= 0.99 * n for n, ok in run.attainment_shared.values()), run.attainment_shared
    over = {n: s.p99_ms for n, s in sim.items() if not (s.p99_ms or 0.0) <= fleet.plans[n].server_budget_ms}
    assert not over, f"the simulator does not admit the cluster's grouping: {over}"
    bad = disagreements(real, sim)
    assert not bad, bad


def test_a_deleted_model_is_unloaded_from_every_pod_while_the_others_serve(pool: SharedPool) -> None:
    others = tuple(m for m in MODELS if m != GONE)
    loads = pool.loads(others, seed=200)
    with ExitStack() as stack:
        for _, endpoints, _load in loads:
            stack.enter_context(endpoints)
        for _, _, load in loads:
            load.start(RATE_RPS)
        t0 = time.monotonic()
        pool.delete(GONE)
        bound = DRAIN_S + 6 * INTERVAL_S + 15

        def unloaded() -> list[str] | None:
            pods = pool.all_pods()
            if any((p.metadata.labels or {}).get(loaded_label(GONE.name)) for p in pods):
                return None
            states = states_of(pods, GONE.triton)
            return states if states and all(s in ("UNAVAILABLE", "absent", NOT_SERVING) for s in states) else None

        states = wait_for(f"{GONE.triton} unloaded from every pool pod", unloaded, timeout_s=bound, interval_s=1.0)
        took = time.monotonic() - t0
        time.sleep(5)  # requests of the others after the unload are counted too
        for _, _, load in loads:
            load.stop()
    print(f"\n{GONE.name} deleted: {GONE.triton} {states} on every pod after {took:.1f} s (bound {bound:.0f} s)")
    failures = []
    for m, _, load in loads:
        sent, failed, p99 = figures(load)
        print(f"  {m.name}: {sent} sent, {failed} failed, client p99 {p99:.1f} ms")
        if failed or not sent:
            failures.append((m.name, sent, failed))
    assert took >= DRAIN_S - 1, f"unloaded {took:.1f} s after the delete, within the drain of {DRAIN_S} s"
    assert not failures, failures
    gpupool = wait_for(
        "the GPUPool's status to count 5 models",
        lambda: s if (s := pool.gpupool().get("status") or {}).get("models") == len(others) else None,
        timeout_s=30,
    )
    assert gpupool["models"] == len(others)


def test_with_no_model_left_the_pool_goes_to_min_pods(pool: SharedPool) -> None:
    t0 = time.monotonic()
    for m in MODELS:
        pool.delete(m)
    apps = pool.lab.kube.apps
    deployment = wait_for(
        f"the pool's Deployment scaled to minPods={MIN_PODS} and its pods gone",
        lambda: (
            d
            if (d := apps.read_namespaced_deployment(f"{POOL}-pool", NS)).spec.replicas == MIN_PODS
            and len(pool.all_pods()) == MIN_PODS
            else None
        ),
        timeout_s=DRAIN_S + 10 * INTERVAL_S + 60,
        interval_s=1.0,
    )
    took = time.monotonic() - t0
    status = wait_for(
        "the GPUPool's status to count no model and no pod",
        lambda: s if _counts(s := pool.gpupool().get("status") or {}) == (0, 0, MIN_PODS, MIN_PODS) else None,
        timeout_s=30,
    )
    print(f"\nall deleted: Deployment replicas {deployment.spec.replicas}, pods 0 after {took:.1f} s; status {status}")
    assert status.get("planHeadroom") is None, status  # no plan: no headroom to state
