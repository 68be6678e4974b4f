"""An ``Auto`` BatchedModel moving from its GPUPool to replicas of its own and back, under Poisson load, with the
operator SIGKILLed in the middle of each move, run by a real kubelet and containerd, end to end.

One real node (kubelet + containerd in a network namespace of the test bed's own, :mod:`batchfill.testbed.node`)
whose kubelet advertises ``NODE_GPUS`` ``nvidia.com/gpu`` from the fake-GPU device plugin: the pool's pods and the
mover's own replicas each hold one. **Only the GPU is emulated**: no container sees a GPU, Triton runs on CPU
(``BATCHFILL_TRITON_CPU_IMAGE``: every Triton pod runs that image with ``KIND_CPU`` instance groups), so "what one
GPU serves at its SLA" is the capacity the planner computes from the mover's declared profile, which matches the
sleep its Python-backend model does. Everything else is real: the API server, scheduler, controller-manager,
kubelet, containerd, the pool's Deployment and pods, Triton's repository API (explicit model control), the mover's
own Deployment, the Services and their EndpointSlices, Prometheus scraping the pool's metrics Service and the
mover's own pods (its ServiceMonitor, as prometheus-operator would), and the operator (``batchfill run`` as its
ServiceAccount: the pool loop plans jointly and moves the model, its scaling loop sizes its own replicas and
writes their observed rate, which the pool plan reads back to move it home).

The models: two ``Shared`` neighbours at a low rate and the mover (``placement: {mode: Auto}``), each with
``spec.model.warmup`` (Triton runs warm-up requests before a copy or replica is READY, so the first requests at a
new home are not its first executions, which cost hundreds of ms on this busy machine). The load goes to
each model's Service's ready EndpointSlice endpoints (:class:`~batchfill.testbed.balancer.ServiceEndpoints`, read
every 0.25 s, as a client-side balancer or kube-proxy would), so a Service that routes nowhere, or to a pod that no
longer serves the model, counts as failed requests. The mover's rate is raised above what one GPU serves at its
SLA (it graduates to its own replicas: ``status.placement.mode`` Dedicated), then lowered well below (it comes back
to the pool). Right after each move is decided (``status.placement.mode`` changes), the operator is SIGKILLed and
started again, before the old home is drained. Every request of every model is counted: none may fail, and the
neighbours' client p99 stays within their SLA. After each move: the model is served at one home only (its Service's
endpoints are that home's pods; its copies are READY on exactly the pool pods labelled for it, which
``status.placement`` names), and no pool pod has a model READY in its repository that it is not labelled for.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from batchfill.api.spec import BatchedModelSpec
from batchfill.controller.pool_models import DRAIN_S
from batchfill.policy.plan import plan_batching
from batchfill.render.kube import MODEL_LABEL, Owner, build_service_monitor, names
from batchfill.render.pool import PoolOwner, build_pool_service_monitor, loaded_label
from batchfill.testbed.balancer import BalancedLoad

from .pool_support import (
    NOT_SERVING,
    Pool,
    Sleep,
    figures,
    model_doc,
    models_on,
    pod_ready,
    repository_index,
    slowest,
    states_of,
)
from .support import Sampler, real_node_lab, wait_for, write_sleep_model

pytestmark = pytest.mark.cluster
#: conftest.py builds the kubelet at collection time (outside the test's timeout) when this is selected.
NEEDS_KUBELET = True

#: The pool's pods (at most MAX_PODS), the mover's own replicas (at most 2) and one surge pod.
NODE_GPUS = 5
NS = "shared-moves"
POOL = "movers"
MIN_PODS, MAX_PODS = 1, 2
INTERVAL_S = 3
OPERATOR_ENV = {
    "BATCHFILL_RECONCILE_INTERVAL_SECONDS": str(INTERVAL_S),
    "BATCHFILL_SIGNAL_WINDOW_SECONDS": "10",
    "BATCHFILL_PROMETHEUS_TIMEOUT_SECONDS": "2",
    "BATCHFILL_PROFILE_INTERVAL_SECONDS": "3",
    "BATCHFILL_NAMESPACES": NS,
}
#: Pods take: the sandbox, tritonserver's start; then each model's load.
READY_S = 300.0
NEIGHBOURS = (Sleep("sm-fast", "sleep-fast", 10, 2, 150), Sleep("sm-mid", "sleep-mid", 20, 3, 200))
NEIGHBOUR_RPS = 3.0
#: Batches of at most 2 (``spec.batching.maxBatchSize``): one GPU serves about 23 req/s at its SLA.
MOVER = Sleep("sm-mover", "sleep-mover", 30, 10, 200)
MOVER_SPEC = {
    "batching": {"maxBatchSize": 2},
    "scaling": {"minReplicas": 1, "maxReplicas": 2, "scaleDownStabilizationSeconds": 10},
    "triton": {"gpusPerReplica": 1},
}
#: The mover's rates as fractions of u·C (targetUtilization x capacity at SLA): above it fills a GPU.
HIGH, LOW = 1.3, 0.2
#: A move: decided within a re-plan (REPLAN_S = 60 s) after the rate is seen; own pods start; the drain.
MOVE_S = 420.0


def mover_doc() -> dict[str, Any]:
    return model_doc(MOVER, NS, {"mode": "Auto", "pool": POOL}, warmup=True, **MOVER_SPEC)


def mover_capacity() -> tuple[float, float]:
    """(C, u): the mover's capacity at SLA on one GPU (req/s), as the planner computes it, and its target
    utilization; its design rate λ / u fills a GPU from C on."""
    spec = BatchedModelSpec.model_validate(mover_doc()["spec"])
    return plan_batching(spec, seed=0).chosen.capacity_rps, spec.scaling.targetUtilization


def write_models(files: Path) -> None:
    for m in (*NEIGHBOURS, MOVER):
        write_sleep_model(files, m.triton, m.alpha_ms, m.beta_ms)


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    """The cluster with one real node, Prometheus scraping the pool and the mover's own pods, the operator, the
    GPUPool and its three models placed."""
    monitors = [
        build_pool_service_monitor(PoolOwner(POOL, NS, ""), interval_s=2),
        build_service_monitor(Owner(MOVER.name, NS, ""), interval_s=2),
    ]
    with real_node_lab(NS, NODE_GPUS, write_models, monitors, OPERATOR_ENV, prefix="bf-sm-") as lab:
        p = Pool(lab, NS, POOL)
        p.create_gpupool(MIN_PODS, MAX_PODS)
        yield p


def placement(pool: Pool, m: Sleep = MOVER) -> dict[str, Any]:
    return dict((pool.bm(m.name).get("status") or {}).get("placement") or {})


def own_pods(pool: Pool) -> list[Any]:
    """The mover's own Triton pods (its Deployment's), terminating ones included."""
    return list(pool.lab.kube.core.list_namespaced_pod(NS, label_selector=f"{MODEL_LABEL}={MOVER.name}").items)


def own_replicas(pool: Pool) -> tuple[int, int]:
    """(spec.replicas, readyReplicas) of the mover's own Deployment; (0, 0) when there is none."""
    deployments = pool.lab.kube.apps.list_namespaced_deployment(NS).items
    name = names(Owner(MOVER.name, NS, ""))["deployment"]
    d = next((d for d in deployments if d.metadata.name == name), None)
    if d is None:
        return 0, 0
    return int(d.spec.replicas or 0), int((d.status.ready_replicas if d.status else 0) or 0)


def labelled_copies(pool: Pool, m: Sleep = MOVER) -> list[Any]:
    return [p for p in pool.pods() if pod_ready(p) and loaded_label(m.name) in models_on(p)]


def routes_to(pool: Pool, m: Sleep, pods: list[Any]) -> bool:
    """The model's Service's ready endpoints are exactly ``pods``' IPs (and there is one at least)."""
    ips = sorted(p.status.pod_ip for p in pods if p.status.pod_ip)
    return bool(ips) and pool.ready_endpoints(m) == ips


def strays(pool: Pool) -> list[tuple[str, str]]:
    """(pod, Triton model) READY in a pool pod's repository without that pod's label for the model: loaded where
    it is not wanted (a copy that must be drained and unloaded)."""
    labels = {m.triton: loaded_label(m.name) for m in (*NEIGHBOURS, MOVER)}
    out = []
    for p in pool.pods():
        if not (pod_ready(p) and p.status.pod_ip):
            continue
        on = models_on(p)
        try:
            index = repository_index(p.status.pod_ip)
        except OSError:  # not answering (stopping, or an API hiccup): not known to be clean, so asked again
            out.append((p.metadata.name, "unreachable"))
            continue
        out += [(p.metadata.name, t) for t, s in index.items() if s == "READY" and labels.get(t) not in on]
    return out


def drained(pool: Pool, when: str) -> None:
    """Wait until no pool pod has a model READY that it is not labelled for. A copy unlabelled by a move stays
    loaded for its drain (``DRAIN_S``) and goes at the next tick after it: only one still there later is a stray."""
    bound = DRAIN_S + 4 * INTERVAL_S + 10
    wait_for(f"no unlabelled READY copy {bound:.0f} s after {when}", lambda: not strays(pool), bound, 1.0)


def mover_unloaded_from_pool(pool: Pool) -> list[str] | None:
    """Each pool pod's state of the mover once none is labelled for it and none has it READY, else None."""
    pods = pool.all_pods()
    if any(loaded_label(MOVER.name) in models_on(p) for p in pods):
        return None
    states = states_of(pods, MOVER.triton)
    return states if states is not None and all(s in ("UNAVAILABLE", "absent", NOT_SERVING) for s in states) else None


@dataclass
class MoveWatch(Sampler):
    """Samples the mover every second in a thread: (t, placement mode, labelled copies, own replicas, own Ready,
    its Service's endpoints) on each change, and the longest time both homes served it (a labelled READY pool copy
    and a Ready own replica)."""

    pool: Pool
    t0: float = field(default_factory=time.monotonic)
    changes: list[tuple[Any, ...]] = field(default_factory=list)
    both_s: float = 0.0
    _both_since: float | None = None

    def sample(self) -> None:
        now = time.monotonic()
        mode = placement(self.pool).get("mode")
        copies = len(labelled_copies(self.pool))
        replicas, ready = own_replicas(self.pool)
        row = (mode, copies, replicas, ready, len(self.pool.ready_endpoints(MOVER)))
        if not self.changes or self.changes[-1][1:] != row:
            self.changes.append((round(now - self.t0), *row))
        if copies and ready:
            self._both_since = now if self._both_since is None else self._both_since
            self.both_s = max(self.both_s, now - self._both_since)
        else:
            self._both_since = None


def kill_and_restart(pool: Pool, why: str) -> float:
    """SIGKILL the operator (no handler runs) and start it again at once; the seconds it took."""
    t = time.monotonic()
    pool.lab.operator.kill()
    pool.lab.operator.start()
    print(f"  operator SIGKILLed and started again ({why}) in {time.monotonic() - t:.1f} s")
    return time.monotonic() - t


def test_the_models_are_placed_on_the_pool(pool: Pool) -> None:
    t0 = time.monotonic()
    for m in (*NEIGHBOURS, MOVER):
        pool.create(mover_doc() if m == MOVER else model_doc(m, NS, {"mode": "Shared", "pool": POOL}, warmup=True))

    def placed() -> dict[str, dict[str, Any]] | None:
        out = {m.name: placement(pool, m) for m in (*NEIGHBOURS, MOVER)}
        if any(p.get("mode") != "Shared" or not p.get("podCount") for p in out.values()):
            return None
        if any(not routes_to(pool, m, labelled_copies(pool, m)) for m in (*NEIGHBOURS, MOVER)):
            return None
        return out if own_replicas(pool)[0] == 0 and not own_pods(pool) else None

    found = wait_for("the three models on the pool, the mover's own Deployment at 0", placed, READY_S, 2.0)
    capacity, u = mover_capacity()
    print(f"\nplaced in {time.monotonic() - t0:.0f} s on {sorted(p.metadata.name for p in pool.pods())}")
    print(f"mover: capacity at SLA {capacity:.1f} req/s, u = {u}: fills a GPU from {u * capacity:.1f} req/s")
    for name, p in found.items():
        print(f"  {name}: {p}")
    assert found[MOVER.name]["reason"] == "SharedBelowOneGpu"
    drained(pool, "placement")


def test_the_mover_graduates_and_comes_back_with_no_failed_request(pool: Pool) -> None:
    capacity, u = mover_capacity()
    high, low = HIGH * u * capacity, LOW * u * capacity
    neighbours = pool.loads(NEIGHBOURS, seed=300)
    ((_, mover_endpoints, mover_load),) = pool.loads((MOVER,), seed=400)
    marks: dict[str, float] = {}
    with ExitStack() as stack:
        for _, endpoints, _load in neighbours:
            stack.enter_context(endpoints)
        stack.enter_context(mover_endpoints)
        watch = stack.enter_context(MoveWatch(pool))
        for _, _, load in neighbours:
            load.start(NEIGHBOUR_RPS)
        mover_load.start(high)
        marks["high"] = time.monotonic()
        print(f"\nmover at {high:.1f} req/s (neighbours {NEIGHBOUR_RPS} req/s each)")
        graduate(pool, marks)
        mover_load.set_rate(low)
        marks["low"] = time.monotonic()
        print(f"mover at {low:.1f} req/s")
        come_back(pool, marks)
        time.sleep(5)  # requests after the move are counted too
        for _, _, load in (*neighbours, (MOVER, mover_endpoints, mover_load)):
            load.stop()
    report(watch, marks, [(m, load) for m, _, load in neighbours], mover_load)


def graduate(pool: Pool, marks: dict[str, float]) -> None:
    """Shared -> Dedicated, the operator killed once the move is decided; every step waited for and timed."""
    decided = wait_for("status.placement Dedicated", lambda: p if (p := placement(pool)).get("mode") == "Dedicated"
                       else None, MOVE_S, 0.5)  # fmt: skip
    marks["dedicated"] = time.monotonic()
    copies = labelled_copies(pool)
    print(f"  decided after {marks['dedicated'] - marks['high']:.0f} s: {decided}; copies {len(copies)}")
    assert decided["reason"] == "DedicatedFillsGpu"
    kill_and_restart(pool, "Shared -> Dedicated decided, old home not drained")
    wait_for("the mover's Service on its own Ready pods", lambda: routes_to(pool, MOVER, [p for p in own_pods(pool)
             if pod_ready(p) and p.metadata.deletion_timestamp is None]), MOVE_S, 0.5)  # fmt: skip
    marks["own routed"] = time.monotonic()
    states = wait_for("the mover unloaded from every pool pod", lambda: mover_unloaded_from_pool(pool), MOVE_S, 1.0)
    marks["graduated"] = time.monotonic()
    print(f"  own replicas routed after {marks['own routed'] - marks['high']:.0f} s; unloaded from the pool "
          f"({states}) after {marks['graduated'] - marks['high']:.0f} s")  # fmt: skip
    assert marks["graduated"] - marks["own routed"] >= DRAIN_S - 1, "unloaded within the drain"
    assert placement(pool).get("mode") == "Dedicated"
    drained(pool, "graduation")


def come_back(pool: Pool, marks: dict[str, float]) -> None:
    """Dedicated -> Shared, the operator killed once the move is decided."""
    decided = wait_for("status.placement Shared", lambda: p if (p := placement(pool)).get("mode") == "Shared"
                       else None, MOVE_S, 0.5)  # fmt: skip
    marks["shared"] = time.monotonic()
    print(f"  decided after {marks['shared'] - marks['low']:.0f} s: {decided}")
    assert decided["reason"] == "SharedBelowOneGpu"
    kill_and_restart(pool, "Dedicated -> Shared decided, own replicas not scaled to 0")

    def home() -> list[Any] | None:
        copies = labelled_copies(pool)
        if not routes_to(pool, MOVER, copies) or own_replicas(pool)[0] != 0 or own_pods(pool):
            return None
        return copies if sorted(placement(pool).get("pods") or []) == sorted(p.metadata.name for p in copies) else None

    copies = wait_for("the mover on the pool only, its own Deployment at 0 and no pod", home, MOVE_S, 1.0)
    marks["back"] = time.monotonic()
    print(f"  back on {[p.metadata.name for p in copies]} after {marks['back'] - marks['low']:.0f} s")
    for p in copies:  # what routes is what serves
        assert repository_index(p.status.pod_ip).get(MOVER.triton) == "READY", p.metadata.name
    assert placement(pool)["mode"] == "Shared"
    drained(pool, "coming back")


def report(
    watch: MoveWatch, marks: dict[str, float], neighbours: list[tuple[Sleep, BalancedLoad]], mover: BalancedLoad
) -> None:
    """Print the timeline and each model's figures; assert no failed request and the neighbours' SLA."""
    t0 = marks["high"]
    print("mover over time (s, placement, labelled copies, own replicas, own Ready, Service endpoints):")
    for row in watch.changes:
        print(f"  {row}")
    print(f"  marks (s after the rate went up): { {k: round(v - t0) for k, v in marks.items()} }")
    print(f"  longest both homes served it: {watch.both_s:.0f} s (drain {DRAIN_S:.0f} s)")
    bad = []
    for m, load in [*neighbours, (MOVER, mover)]:
        sent, failed, p99 = figures(load)
        lost = [(round(s.due_s - t0, 1), s.endpoint) for s in list(load.samples) if s.latency_ms is None]
        sla = "" if m == MOVER else f", SLA {m.p99_ms} ms"
        print(f"  {m.name}: {sent} sent, {failed} failed, client p99 {p99:.1f} ms{sla}; failed at {lost[:10]}")
        print(f"    slowest (s after the rate went up, endpoint, ms, of which the generator's lateness): "
              f"{slowest(load, t0)}")  # fmt: skip
        if failed or not sent or (m != MOVER and not p99 <= m.p99_ms):
            bad.append((m.name, sent, failed, round(p99, 1)))
    assert not bad, bad
    assert watch.both_s <= DRAIN_S + 10 * INTERVAL_S + 30, watch.both_s
    assert not math.isnan(figures(mover)[2])
