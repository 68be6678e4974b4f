"""The pool model-control loop (batchfill.controller.pool_loop), several ticks in a row, against fakes that record
every call in one list.

These are unit tests of the loop's sequencing (what it reads, in what order it writes, what it retries), so both
sides are fakes, the way tests/unit/test_controller_loops.py tests the scaling loop:

* the Kubernetes side is that module's :class:`FakeKube` / :class:`FakeView` (pods trimmed by the informer's own
  trimming), with GPUPools listed and pod label patches applied as a JSON merge patch under the resourceVersion
  precondition (a changed pod: HTTP 409, as the adapter raises it: ``KubeTemporaryError``);
* Triton's repository API is :class:`FakeTriton`, injected as ``Repository`` the way the profiling loop takes
  ``read_stats``: a load makes the model READY (or, for a pod told to be slow, leaves it LOADING and answers with a
  timeout), an unload makes it UNAVAILABLE.

What Triton really does with these calls (a load with the plan's config, READY, an unload with requests in flight)
is tests/component/test_pool_models_real.py, on the real tritonserver.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from batchfill.adapters.kube import KubePermanentError, KubeTemporaryError
from batchfill.adapters.triton_repository import IndexEntry, ModelState, TritonCallError
from batchfill.api.pool import POOL_PLURAL, GPUPoolSpec
from batchfill.api.reasons import PoolModelReason as Why
from batchfill.controller import pool_loop
from batchfill.controller.desired import desired_state
from batchfill.controller.pool_loop import PoolModelsLoop, Repository, every_pod, pool_members
from batchfill.controller.pool_models import DRAIN_S, LOAD_RETRY_S, PoolModelsPlan
from batchfill.controller.settings import OperatorSettings
from batchfill.policy.cost import ExecutionCounters
from batchfill.render.pool import LOADED, POD_DELETION_COST, TritonRequest, loaded_label, pool_selector_labels

from .test_controller_loops import MODEL, NS, SCALING_SPEC, T0, FakeKube, FakeView, merge_patch
from .test_pool_api import POOL_DOC

POOL = "shared"
TICK_S = 5.0


class PoolKube(FakeKube):
    """FakeKube with GPUPools and pod label patches (``adapters.kube.Kube.list_gpu_pools`` / ``patch_pod_metadata``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpu_pools: list[dict[str, Any]] = []
        self.patch_errors: list[Exception] = []  # raised by the next patches, in order (throttling, outage)
        self.before_pod_patch: Any = None  # another writer (the kubelet), once, just before the next patch

    def list_gpu_pools(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        self.calls.append(("list_gpu_pools",))
        return copy.deepcopy(self.gpu_pools)

    def patch_pod_metadata(
        self,
        name: str,
        namespace: str,
        resource_version: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> None:
        self.calls.append(("patch_pod_metadata", name, dict(labels), dict(annotations)))
        hook, self.before_pod_patch = self.before_pod_patch, None
        if hook is not None:
            hook()
        if self.patch_errors:
            raise self.patch_errors.pop(0)
        pod = self.pods[(namespace, name)]
        if pod["metadata"]["resourceVersion"] != resource_version:
            raise KubeTemporaryError(f"patch pod {namespace}/{name}: HTTP 409: Conflict", delay_s=1.0)
        meta = pod["metadata"]
        meta["labels"] = merge_patch(meta.get("labels") or {}, labels)
        meta["annotations"] = merge_patch(meta.get("annotations") or {}, annotations)
        meta["resourceVersion"] = self._rv()

    def patch_kind_status(self, plural: str, body: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        meta = body["metadata"]
        assert plural == POOL_PLURAL
        self.calls.append(("patch_pool_status", meta["namespace"], meta["name"], copy.deepcopy(dict(status))))
        for pool in self.gpu_pools:
            if pool["metadata"]["name"] == meta["name"] and pool["metadata"]["namespace"] == meta["namespace"]:
                if pool["metadata"]["resourceVersion"] != meta["resourceVersion"]:
                    return False
                pool["status"] = merge_patch(pool.get("status") or {}, status)
                pool["metadata"]["resourceVersion"] = self._rv()
                return True
        return False

    def add_pool(self) -> None:
        doc = copy.deepcopy(POOL_DOC)
        doc["metadata"] = {"name": POOL, "namespace": NS, "uid": "uid-pool", "resourceVersion": self._rv()}
        self.gpu_pools.append(doc)

    def add_shared_model(self, name: str, triton_model: str) -> None:
        spec = copy.deepcopy(SCALING_SPEC)
        spec["model"] = {**MODEL, "name": triton_model}
        spec["placement"] = {"mode": "Shared", "pool": POOL}
        self.create_model(name, spec)
        # the plan the handlers store (controller.status.desired_status), so the pool loop's status write keeps it
        plan = desired_state(spec).plan_status.model_dump(mode="json", exclude_none=True)
        self.models[(NS, name)]["status"] = {"plan": plan}

    def add_pool_pod(self, name: str, ip: str, *, ready: bool = True) -> None:
        status = "True" if ready else "False"
        self.pods[(NS, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": f"uid-{name}",
                "resourceVersion": self._rv(),
                "labels": {**pool_selector_labels(POOL), "pod-template-hash": "7c9d"},
                "annotations": {"prometheus.io/scrape": "true"},
            },
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": status}]},
        }

    def labelled(self, pod: str, name: str) -> bool:
        return (self.pods[(NS, pod)]["metadata"].get("labels") or {}).get(loaded_label(name)) == LOADED

    def kubelet_writes(self, pod: str) -> None:
        """The kubelet updates the pod's status: a new resourceVersion, nothing the loop reads changed."""
        self.pods[(NS, pod)]["metadata"]["resourceVersion"] = self._rv()


@dataclass
class FakeTriton:
    """Each pod's Triton repository by IP: model -> state; every call appended to ``calls`` (the FakeKube's)."""

    calls: list[tuple[Any, ...]]
    state: dict[str, dict[str, ModelState]] = field(default_factory=dict)
    slow: set[str] = field(default_factory=set)  # pods whose loads do not finish within the call's timeout
    unreadable: dict[str, str] = field(default_factory=dict)  # pod -> "error" (an answer) or "raise" (a bug)
    executed_us: dict[tuple[str, str], float] = field(default_factory=dict)  # (pod, model) -> cumulative µs

    def index(self, address: str, pod: str) -> Mapping[str, IndexEntry] | TritonCallError:
        self.calls.append(("index", pod))
        if self.unreadable.get(pod) == "raise":
            raise RuntimeError("a bug in the index read")
        if pod in self.unreadable:
            return TritonCallError(pod, "", "index", None, "ConnectionRefusedError: [Errno 111] Connection refused")
        return {m: IndexEntry(m, s) for m, s in self.state.setdefault(pod, {}).items()}

    def load(self, address: str, pod: str, request: TritonRequest) -> TritonCallError | None:
        model = request.path.split("/")[-2]
        self.calls.append(("load", pod, model))
        if pod in self.slow:
            self.state.setdefault(pod, {})[model] = ModelState.LOADING
            return TritonCallError(pod, model, "load", None, "timeout: timed out")
        self.state.setdefault(pod, {})[model] = ModelState.READY
        return None

    def counters(self, address: str, pod: str) -> Mapping[str, ExecutionCounters] | TritonCallError:
        """Triton's statistics of the loaded models: ``executed_us`` of each (cumulative compute infer time)."""
        self.calls.append(("counters", pod))
        loaded = [m for m, s in self.state.get(pod, {}).items() if s == ModelState.READY]
        return {m: ExecutionCounters(0.0, self.executed_us.get((pod, m), 0.0), 0.0) for m in sorted(loaded)}

    def unload(self, address: str, pod: str, model: str) -> TritonCallError | None:
        self.calls.append(("unload", pod, model))
        self.state.setdefault(pod, {})[model] = ModelState.UNAVAILABLE
        return None

    def ready(self, pod: str, model: str) -> bool:
        return self.state.get(pod, {}).get(model) == ModelState.READY


@dataclass
class Bed:
    kube: PoolKube
    triton: FakeTriton
    loop: PoolModelsLoop
    plans: list[PoolModelsPlan]
    now: float = T0

    def tick(self) -> list[tuple[Any, ...]]:
        """One pass; the calls it made."""
        start = len(self.kube.calls)
        self.loop.tick(self.now)
        self.now += TICK_S
        return self.kube.calls[start:]


def writes(calls: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The writes among ``calls`` (loads, unloads, pod patches, Events), as (call, pod, what)."""
    out: list[tuple[Any, ...]] = []
    for c in calls:
        if c[0] in ("load", "unload"):
            out.append(c)
        elif c[0] == "patch_pod_metadata":
            out.append(("patch", c[1], tuple(sorted(c[2].items()))))
        elif c[0] == "post_event":
            out.append(("event", c[2], c[4]))
    return out


@pytest.fixture
def bed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    """One pool, two Ready pods (p0, p1) and one shared model bm-a (Triton model ``a``); the plan of every tick is
    kept (``decide_pool_models`` wrapped) to compare the writes with."""
    kube = PoolKube()
    kube.add_pool()
    kube.add_pool_pod("p0", "10.0.0.10")
    kube.add_pool_pod("p1", "10.0.0.11")
    kube.add_shared_model("bm-a", "a")
    triton = FakeTriton(kube.calls)
    plans: list[PoolModelsPlan] = []
    decide = pool_loop.decide_pool_models

    def recorded(*args: Any, **kwargs: Any) -> PoolModelsPlan:
        plans.append(decide(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(pool_loop, "decide_pool_models", recorded)
    repo = Repository(index=triton.index, load=triton.load, unload=triton.unload, counters=triton.counters)
    # every_pod: these tests are of the loads and labels; the joint plan's own choice of pods is tested below
    loop = PoolModelsLoop(kube, FakeView(kube), OperatorSettings(), repository=repo, assign=every_pod)  # type: ignore[arg-type]
    yield Bed(kube, triton, loop, plans)
    loop.pool.shutdown(wait=True)


def test_a_wanted_model_is_loaded_on_both_pods_then_labelled_only_once_ready(bed: Bed) -> None:
    bed.triton.slow = {"p1"}  # p1's load outlasts its timeout: Triton goes on, reporting LOADING
    first = writes(bed.tick())
    assert first == [("load", "p0", "a"), ("load", "p1", "a"), ("event", "bm-a", Why.MODEL_LOADED)]
    assert not bed.kube.labelled("p0", "bm-a")  # nothing labelled before Triton reported READY
    assert not bed.kube.labelled("p1", "bm-a")

    second = writes(bed.tick())  # p0 READY after our load: labelled; p1 still LOADING: held
    key = loaded_label("bm-a")
    config = bed.plans[0].loads[0].config_hash
    assert second == [("patch", "p0", ((key, LOADED),)), ("event", "bm-a", Why.MODEL_ROUTED)]
    assert bed.kube.pods[(NS, "p0")]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", key: config, POD_DELETION_COST: "1"
    }  # fmt: skip
    assert [h.reason for h in bed.plans[1].holds if h.pod == "p1"] == [Why.HOLD_IN_TRANSITION]
    assert not bed.kube.labelled("p1", "bm-a")

    bed.triton.state["p1"]["a"] = ModelState.READY  # the timed-out load ended well: it is our config
    assert writes(bed.tick()) == [("patch", "p1", ((key, LOADED),)), ("event", "bm-a", Why.MODEL_ROUTED)]
    assert bed.kube.labelled("p0", "bm-a")
    assert bed.kube.labelled("p1", "bm-a")
    assert writes(bed.tick()) == []  # converged: nothing more to write
    assert [c[1] for c in bed.kube.calls if c[0] == "load"] == ["p0", "p1"]


def test_a_load_refused_by_triton_warns_and_is_retried_after_the_backoff(bed: Bed) -> None:
    refused = TritonCallError("p1", "a", "load", 400, "load failed for model 'a': version 1 is at UNAVAILABLE state")

    def load(address: str, pod: str, request: TritonRequest) -> TritonCallError | None:
        result = bed.triton.load(address, pod, request)
        if pod == "p1":
            bed.triton.state["p1"]["a"] = ModelState.UNAVAILABLE
            return refused
        return result

    bed.loop.repository = Repository(index=bed.triton.index, load=load, unload=bed.triton.unload)
    first = writes(bed.tick())
    assert ("event", "bm-a", Why.MODEL_LOAD_FAILED) in first
    assert bed.kube.events[-1] == ("Warning", Why.MODEL_LOAD_FAILED, str(refused))
    for _ in range(3):
        assert ("load", "p1", "a") not in writes(bed.tick())  # within LOAD_RETRY_S: held
    bed.now += LOAD_RETRY_S
    assert ("load", "p1", "a") in writes(bed.tick())


def test_a_move_keeps_a_labelled_ready_copy_at_every_tick_and_unloads_after_the_drain(bed: Bed) -> None:
    target = {"bm-a": frozenset({"p0"})}
    bed.loop.assign = lambda models, pods: {m: target[m] for m in models}
    bed.tick(), bed.tick()
    assert bed.kube.labelled("p0", "bm-a")
    assert not bed.kube.labelled("p1", "bm-a")

    target["bm-a"] = frozenset({"p1"})
    unlabelled_at = unloaded_at = None
    for _ in range(12):
        now = bed.now
        calls = writes(bed.tick())
        serving = [p for p in ("p0", "p1") if bed.kube.labelled(p, "bm-a") and bed.triton.ready(p, "a")]
        assert serving, f"no labelled READY copy after the tick at {now - T0:.0f} s: {calls}"
        if ("patch", "p0", ((loaded_label("bm-a"), None),)) in calls:
            assert bed.kube.labelled("p1", "bm-a"), "p0 unlabelled before p1 was labelled"
            unlabelled_at = now
        if ("unload", "p0", "a") in calls:
            unloaded_at = now
    assert unlabelled_at is not None
    assert unloaded_at is not None
    # the drain starts at the first tick that sees p0 unlabelled (the next one) and lasts DRAIN_S
    assert unloaded_at - (unlabelled_at + TICK_S) >= DRAIN_S
    assert unloaded_at - (unlabelled_at + TICK_S) < DRAIN_S + TICK_S
    assert [c for c in bed.kube.calls if c[0] in ("load", "unload")] == [
        ("load", "p0", "a"), ("load", "p1", "a"), ("unload", "p0", "a")
    ]  # fmt: skip
    assert not bed.triton.ready("p0", "a")
    assert bed.kube.labelled("p1", "bm-a")


@pytest.mark.parametrize("how", ["error", "raise"])
def test_a_pod_whose_index_read_fails_is_not_acted_on(bed: Bed, how: str, caplog: pytest.LogCaptureFixture) -> None:
    bed.triton.unreadable = {"p1": how}
    for _ in range(3):
        bed.tick()
    touched = {c[1] for c in bed.kube.calls if c[0] in ("load", "unload", "patch_pod_metadata")}
    assert touched == {"p0"}
    assert bed.kube.labelled("p0", "bm-a")
    assert not bed.kube.labelled("p1", "bm-a")
    assert all(Why.HOLD_POD_UNKNOWN in [h.reason for h in p.holds if h.pod == "p1"] for p in bed.plans)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a pod's failure is no traceback
    assert any("index" in r.getMessage() and "p1" in r.getMessage() for r in caplog.records)

    bed.triton.unreadable = {}  # readable again: acted on at once
    assert writes(bed.tick())[0] == ("load", "p1", "a")


@pytest.mark.parametrize("failure", ["conflict", "unavailable"])
def test_a_failed_label_patch_is_retried_next_tick_without_loading_again(bed: Bed, failure: str) -> None:
    bed.tick()  # loads on both pods
    if failure == "conflict":  # the kubelet wrote the pod between the cache's copy and the patch: HTTP 409
        bed.kube.before_pod_patch = lambda: bed.kube.kubelet_writes("p0")
    else:
        bed.kube.patch_errors = [KubeTemporaryError("patch pod ml/p0: HTTP 503: Service Unavailable")]
    failed = writes(bed.tick())
    assert [w[:2] for w in failed if w[0] == "patch"] == [("patch", "p0"), ("patch", "p1")]
    assert not bed.kube.labelled("p0", "bm-a")
    assert bed.kube.labelled("p1", "bm-a")
    assert ("event", "bm-a", Why.MODEL_ROUTED) in failed  # p1's only: a failed patch posts nothing
    assert len([w for w in failed if w[0] == "event"]) == 1

    retried = writes(bed.tick())
    assert retried == [("patch", "p0", ((loaded_label("bm-a"), LOADED),)), ("event", "bm-a", Why.MODEL_ROUTED)]
    assert [c[1] for c in bed.kube.calls if c[0] == "load"] == ["p0", "p1"]  # no second load
    assert writes(bed.tick()) == []


def test_the_loops_writes_are_exactly_the_decisions_writes(bed: Bed) -> None:
    """Over a join, a second model, a config change and a leave, each tick's Triton calls and patches are its plan's
    loads, patches and unloads in that order; the rest is Events, the members' and the pool's status, the pool's
    Deployment and the re-apply of a member whose placement changed (controller.pool_sync)."""
    bed.tick(), bed.tick()
    bed.kube.add_shared_model("bm-b", "b")
    bed.tick(), bed.tick()
    bed.kube.models[(NS, "bm-a")]["spec"]["sla"]["latencyP99Ms"] = 150  # a new plan, written to status by the loop
    bed.tick(), bed.tick(), bed.tick()
    bed.kube.models[(NS, "bm-b")]["spec"]["placement"] = {"mode": "Dedicated", "pool": POOL}
    bed.kube.models[(NS, "bm-b")]["status"]["readyReplicas"] = 1  # its own replicas serve it
    bed.now += DRAIN_S
    done = bed.now + 4 * DRAIN_S
    while bed.now < done:
        bed.tick()
    calls = bed.kube.calls
    ticks = [i for i, c in enumerate(calls) if c == ("list_gpu_pools",)] + [len(calls)]
    assert len(ticks) - 1 == len(bed.plans)
    for plan, (a, b) in zip(bed.plans, itertools.pairwise(ticks), strict=True):
        made = [c for c in calls[a:b] if c[0] in ("load", "unload", "patch_pod_metadata")]
        wanted = [("load", w.pod, w.model) for w in plan.loads]
        wanted += [("patch_pod_metadata", p.pod, p.body["metadata"]["labels"], p.body["metadata"]["annotations"])
                   for p in plan.patches]  # fmt: skip
        wanted += [("unload", w.pod, w.model) for w in plan.unloads]
        assert made == wanted
        others = {c[0] for c in calls[a:b]} - {"load", "unload", "patch_pod_metadata", "post_event"}
        reads = {"list_gpu_pools", "list_batched_models", "cache.check", "cache.list_pods", "cache.get", "index",
                 "get_batched_model", "get", "has_kind", "counters"}  # fmt: skip
        assert others <= reads | {"apply", "patch_status", "patch_pool_status", "scale_deployment"}
        assert {c[1] for c in calls[a:b] if c[0] == "apply"} <= {"Deployment", "Service", "ConfigMap"}
    made = [c for c in calls if c[0] in ("load", "unload")]
    assert made.count(("load", "p0", "a")) == 2
    assert made.count(("load", "p0", "b")) == 1
    assert ("unload", "p0", "b") in made
    assert ("unload", "p1", "b") in made
    assert not bed.triton.ready("p0", "b")
    assert bed.triton.ready("p0", "a")
    assert not bed.kube.labelled("p0", "bm-b")
    assert bed.kube.labelled("p0", "bm-a")


def test_a_pool_pass_is_postponed_when_the_api_or_the_cache_fails(bed: Bed, caplog: pytest.LogCaptureFixture) -> None:
    view = bed.loop.view
    view.stale = "pods cache of ml: no watch event for 40 s"  # type: ignore[attr-defined]
    assert writes(bed.tick()) == []
    assert not [c for c in bed.kube.calls if c[0] == "index"]
    assert "postponed" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _member(name: str, triton_model: str, spec_placement: dict[str, Any], **status: Any) -> dict[str, Any]:
    kube = PoolKube()
    kube.add_shared_model(name, triton_model)
    body = kube.models[(NS, name)]
    body["spec"]["placement"] = spec_placement
    body["status"] |= status
    return body


def test_pool_members_follow_spec_and_status_placement() -> None:
    """Which BatchedModels a pool serves and on which pods (``pool_members``), and why the others are left out."""
    kube = PoolKube()
    kube.add_pool()
    pool = kube.gpu_pools[0]
    spec = GPUPoolSpec.model_validate(pool["spec"])
    shared, auto = {"mode": "Shared", "pool": POOL}, {"mode": "Auto", "pool": POOL}
    on_pool = {"mode": "Shared", "pool": POOL, "podCount": 0}
    models = [
        _member("m-shared", "a", shared),
        _member("m-auto-shared", "b", auto, placement=on_pool),
        _member("m-auto-dedicated", "c", auto, placement={**on_pool, "mode": "Dedicated"}),  # leaving: no pod
        _member("m-auto-gone", "d", auto, placement={**on_pool, "mode": "Dedicated"}, readyReplicas=2),  # left
        _member("m-auto-elsewhere", "e", auto, placement={**on_pool, "pool": "other"}),
        _member("m-other-pool", "f", {"mode": "Shared", "pool": "other"}),
        _member("m-dedicated", "g", {"mode": "Dedicated"}),
        _member("m-z-same-triton-name", "a", shared),  # "a" is m-shared's, the first by name
        _member("m-no-plan", "h", shared),
    ]
    del models[-1]["status"]["plan"]
    models[0]["metadata"] = {**models[0]["metadata"], "namespace": "elsewhere"}  # another namespace's: not ours
    models.append(_member("m-shared", "a", shared))
    wanted, notes = pool_members(pool, spec, models, ["p0", "p1"])
    assert {w.name: (w.model, sorted(w.pods)) for w in wanted} == {
        "m-shared": ("a", ["p0", "p1"]),
        "m-auto-shared": ("b", ["p0", "p1"]),
        "m-auto-dedicated": ("c", []),
        "m-auto-elsewhere": ("e", []),  # names the pool, placed on another: leaving (its copies kept until Ready)
    }
    assert notes == [
        "m-no-plan: no plan in status yet",
        "m-z-same-triton-name: Triton model 'a' is already m-shared's on this pool",
    ]
    assert wanted[0].request.path.startswith("/v2/repository/models/")
    cpu, _ = pool_members(pool, spec, models, ["p0"], instance_kind="KIND_CPU")
    assert '"KIND_CPU"' in cpu[0].request.body["parameters"]["config"]

    few = GPUPoolSpec.model_validate({**pool["spec"], "maxModelsPerPod": 1})
    wanted, notes = pool_members(pool, few, models, ["p0"])
    assert [w.name for w in wanted] == ["m-auto-dedicated"]  # the first by name
    assert notes[-2:] == ["m-auto-shared: beyond maxModelsPerPod=1", "m-shared: beyond maxModelsPerPod=1"]


def test_only_max_pods_plus_one_ready_pods_are_read(bed: Bed) -> None:
    for i in range(2, 7):
        bed.kube.add_pool_pod(f"p{i}", f"10.0.0.{10 + i}")
    bed.tick()
    read = sorted(c[1] for c in bed.kube.calls if c[0] == "index")
    assert read == ["p0", "p1", "p2", "p3", "p4"]  # POOL_DOC's maxPods 4, and a surge pod
    assert {c[1] for c in bed.kube.calls if c[0] == "load"} == set(read)
    assert [h.reason for h in bed.plans[0].holds if h.pod in ("p5", "p6")] == [Why.HOLD_POD_UNKNOWN] * 2


def test_each_pods_gpu_time_is_split_among_its_models_by_execution_time_and_exported(bed: Bed) -> None:
    from batchfill.adapters.operator_metrics import REGISTRY, forget

    bed.kube.add_shared_model("bm-b", "b")
    bed.tick(), bed.tick()  # both loaded and labelled on p0 and p1; the pods' counters read once
    hours = {m: REGISTRY.get_sample_value("batchfill_model_gpu_hours_total", {"namespace": NS, "name": m}) or 0.0
             for m in ("bm-a", "bm-b")}  # fmt: skip
    for p in ("p0", "p1"):
        bed.triton.executed_us[(p, "a")] = bed.triton.executed_us.get((p, "a"), 0.0) + 3000.0
        bed.triton.executed_us[(p, "b")] = bed.triton.executed_us.get((p, "b"), 0.0) + 1000.0
    bed.tick()
    gained = {m: (REGISTRY.get_sample_value("batchfill_model_gpu_hours_total", {"namespace": NS, "name": m}) or 0.0)
              - hours[m] for m in ("bm-a", "bm-b")}  # fmt: skip
    held_h = 2 * GPUPoolSpec.model_validate(POOL_DOC["spec"]).gpusPerPod * TICK_S / 3600.0  # two pods, one tick
    assert gained["bm-a"] == pytest.approx(0.75 * held_h)
    assert gained["bm-b"] == pytest.approx(0.25 * held_h)
    share = REGISTRY.get_sample_value("batchfill_model_gpu_share", {"namespace": NS, "name": "bm-a"})
    assert share == pytest.approx(0.75)
    for m in ("bm-a", "bm-b"):
        forget(NS, m)


def _config_valid(kube: PoolKube) -> dict[str, Any] | None:
    conditions = (kube.gpu_pools[0].get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "ConfigValid"), None)


def test_a_pool_spec_that_cannot_be_served_is_named_by_field_once_and_its_pods_left_alone(bed: Bed) -> None:
    pool = bed.kube.gpu_pools[0]
    pool["spec"]["triton"] = {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "1"}}}
    pool["metadata"]["generation"] = 2
    calls = bed.tick()
    refused = _config_valid(bed.kube)
    assert refused is not None
    assert (refused["status"], refused["reason"]) == ("False", "InvalidSpec")
    assert refused["message"] == "spec.triton.resources.requests[cpu]: must be less than or equal to " \
                                 "spec.triton.resources.limits[cpu]"  # fmt: skip
    assert bed.kube.gpu_pools[0]["status"]["observedGeneration"] == 2
    assert [e[:2] for e in bed.kube.events] == [("Warning", "InvalidSpec")]
    assert not [c for c in calls if c[0] in ("apply", "load", "unload", "patch_pod_metadata")]
    # the same problem next tick: nothing written again, no second event
    again = bed.tick()
    assert not [c for c in again if c[0] in ("patch_pool_status", "post_event", "apply")]
    # a schema error (what pydantic refuses) is named the same way
    pool = bed.kube.gpu_pools[0]
    pool["spec"]["maxPods"] = 0
    bed.tick()
    assert _config_valid(bed.kube)["message"].startswith("spec.maxPods: must be positive")  # type: ignore[index]
    # fixed: served again, ConfigValid True
    pool = bed.kube.gpu_pools[0]
    pool["spec"]["maxPods"] = 4
    pool["spec"]["triton"] = {}
    calls = bed.tick()
    assert any(c[0] == "apply" and c[1] == "Deployment" for c in calls)
    assert (_config_valid(bed.kube) or {}).get("status") == "True"


def test_a_pool_deployment_the_api_server_refuses_is_said_on_the_pool(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_apply = bed.kube.apply

    def refuse(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Deployment":
            raise KubePermanentError(f"apply Deployment {NS}/{obj['metadata']['name']}: HTTP 422: exceeded quota")
        return real_apply(obj)

    monkeypatch.setattr(bed.kube, "apply", refuse)
    bed.tick()
    refused = _config_valid(bed.kube)
    assert refused is not None
    assert (refused["status"], refused["reason"]) == ("False", "ApplyRejected")
    assert "HTTP 422: exceeded quota" in refused["message"]
    assert [e[:2] for e in bed.kube.events if e[0] == "Warning"] == [("Warning", "ApplyRejected")]
