"""Loads, labels, drains and unloads on a GPUPool's pods (batchfill.controller.pool_models): decision tables, a
move tick by tick, and convergence from every crash state (a small world that applies the writes as Triton and the
API server would)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfill.adapters.triton_repository import IndexEntry, ModelState, TritonCallError
from batchfill.api.pool import GPUPoolSpec
from batchfill.api.reasons import PoolModelReason as Why
from batchfill.controller.pool_models import (
    DRAIN_S,
    LOAD_RETRY_S,
    Load,
    LoadFailure,
    Outcome,
    PodPatch,
    PoolModelsMemory,
    PoolModelsPlan,
    PoolPod,
    Unload,
    WantedModel,
    decide_pool_models,
    pool_pod,
    remember,
    wanted_model,
)
from batchfill.render.kube import PRESTOP_DELAY_S
from batchfill.render.pool import LOADED, POD_DELETION_COST, TritonRequest, load_request, loaded_label

from .test_pool_api import POOL_DOC
from .test_render_kube import spec_with
from .test_render_model_config import make_plan

R, L, U, X = ModelState.READY, ModelState.LOADING, ModelState.UNLOADING, ModelState.UNAVAILABLE
KEY = loaded_label("bm-a")
NOW = 1_000.0
STALE = Why.HOLD_STALE_LABEL


def want(pods: set[str], config_hash: str = "h1", name: str = "bm-a", model: str = "a") -> WantedModel:
    request = TritonRequest("POST", f"/v2/repository/models/{model}/load", {"parameters": {"config": config_hash}})
    return WantedModel(name, model, request, config_hash, frozenset(pods))


def pod(
    name: str,
    index: Mapping[str, ModelState] | None,
    *,
    label: str | None = None,
    ready: bool = True,
    ip: str = "10.0.0.1",
    extra_labels: Mapping[str, str] | None = None,
) -> PoolPod:
    """A pod with models in ``index`` (None: unreadable) and, with ``label`` (a config hash), bm-a's label."""
    labels = {"app.kubernetes.io/name": "triton", **(extra_labels or {})}
    annotations = {}
    if label is not None:
        labels[KEY], annotations[KEY] = LOADED, label
    entries = None if index is None else {m: IndexEntry(m, s) for m, s in index.items()}
    return PoolPod(name, f"{ip}:8000" if ip else "", ready, labels, annotations, entries)


def routes(plan: PoolModelsPlan) -> list[tuple[str, str, str | None]]:
    return [(p.pod, r.key, r.config_hash) for p in plan.patches for r in p.routes]


def summary(plan: PoolModelsPlan) -> tuple[list[str], list[tuple[str, str, str | None]], list[str], list[str]]:
    return (
        [f"{w.pod}/{w.model}" for w in plan.loads],
        routes(plan),
        [f"{w.pod}/{w.model}" for w in plan.unloads],
        [h.reason for h in plan.holds],
    )


# --- decision tables -------------------------------------------------------------------------------------------

WANTED_HERE = [
    # (state on p1, label's config hash or None, memory.loaded hash, memory.failed hash, expected)
    ("not loaded: load", X, None, None, None, (["p1/a"], [], [], [])),
    ("loading: wait", L, None, None, None, ([], [], [], [Why.HOLD_IN_TRANSITION])),
    ("unloading: wait, then load", U, None, None, None, ([], [], [], [Why.HOLD_IN_TRANSITION])),
    ("READY after our load: label", R, None, "h1", None, ([], [("p1", KEY, "h1")], [], [])),
    ("READY, config unknown (restart after a load): load again", R, None, None, None, (["p1/a"], [], [], [])),
    ("READY and labelled with the config: nothing", R, "h1", None, None, ([], [], [], [])),
    ("labelled with an old config: reload in place", R, "h0", None, None, (["p1/a"], [], [], [])),
    ("reloaded: the annotation follows", R, "h0", "h1", None, ([], [("p1", KEY, "h1")], [], [])),
    ("labelled but not loaded: unlabel and load", X, "h1", None, None, (["p1/a"], [("p1", KEY, None)], [], [])),
    ("failed load of this config: back off", X, None, None, "h1", ([], [], [], [Why.HOLD_LOAD_BACKOFF])),
    ("failed load of an older config: load", X, None, None, "h0", (["p1/a"], [], [], [])),
]


@pytest.mark.parametrize(("case", "state", "label", "loaded", "failed", "expected"), WANTED_HERE, ids=lambda x: x)
def test_a_model_wanted_on_a_pod(
    case: str, state: ModelState, label: str | None, loaded: str | None, failed: str | None, expected: object
) -> None:
    memory = PoolModelsMemory(
        loaded={("p1", "a"): loaded} if loaded else {},
        failed={("p1", "a"): LoadFailure(failed, NOW - 10, "HTTP 400: bad")} if failed else {},
    )
    plan = decide_pool_models([pod("p1", {"a": state}, label=label)], [want({"p1"})], memory, NOW)
    assert summary(plan) == expected, case


def test_a_failed_load_is_tried_again_after_the_retry_interval() -> None:
    failed = {("p1", "a"): LoadFailure("h1", NOW - LOAD_RETRY_S, "HTTP 400: bad")}
    plan = decide_pool_models([pod("p1", {"a": X})], [want({"p1"})], PoolModelsMemory(failed=failed), NOW)
    assert [w.pod for w in plan.loads] == ["p1"]


UNWANTED_HERE = [
    # (p1: state, label; p2: state, label; model still wanted (on p2)?, draining since, expected for p1)
    ("moved, new home serving: unlabel the old", R, "h1", R, "h1", True, None, ([], [("p1", KEY, None)], [], [])),
    ("moved, new home READY unlabelled: keep", R, "h1", R, None, True, None, ([], [], [], [Why.HOLD_LAST_COPY])),
    ("moved, new home not loaded: keep", R, "h1", X, None, True, None, ([], [], [], [Why.HOLD_LAST_COPY])),
    ("unwanted everywhere: a stale label", R, "h1", X, None, False, None, ([], [("p1", KEY, None)], [], [STALE])),
    ("unlabelled: drain starts", R, None, R, "h1", True, None, ([], [], [], [Why.HOLD_DRAINING])),
    ("draining: wait", R, None, R, "h1", True, NOW - DRAIN_S + 1, ([], [], [], [Why.HOLD_DRAINING])),
    ("drained: unload", R, None, R, "h1", True, NOW - DRAIN_S, ([], [], ["p1/a"], [])),
    (
        "drained but no pod serves it: keep",
        R,
        None,
        X,
        None,
        True,
        NOW - DRAIN_S,
        ([], [], [], [Why.HOLD_NO_OTHER_COPY]),
    ),
    ("unwanted, drained: unload", R, None, X, None, False, NOW - DRAIN_S, ([], [], ["p1/a"], [])),
    ("unwanted, still loading: wait", L, None, X, None, False, None, ([], [], [], [Why.HOLD_IN_TRANSITION])),
    ("unloading: nothing", U, None, X, None, False, None, ([], [], [], [])),
    ("labelled but not loaded: unlabel", X, "h1", R, "h1", True, None, ([], [("p1", KEY, None)], [], [])),
]


@pytest.mark.parametrize(
    ("case", "s1", "l1", "s2", "l2", "wanted", "since", "expected"), UNWANTED_HERE, ids=lambda x: x
)
def test_a_model_not_wanted_on_a_pod(
    case: str,
    s1: ModelState,
    l1: str | None,
    s2: ModelState,
    l2: str | None,
    wanted: bool,
    since: float | None,
    expected: tuple[list[str], list[object], list[str], list[str]],
) -> None:
    memory = PoolModelsMemory(draining={("p1", "a"): since} if since is not None else {})
    pods = [pod("p1", {"a": s1}, label=l1), pod("p2", {"a": s2}, label=l2, ip="10.0.0.2")]
    plan = decide_pool_models(pods, [want({"p2"})] if wanted else [], memory, NOW)
    p1 = (
        [f"{w.pod}/{w.model}" for w in plan.loads if w.pod == "p1"],
        [r for r in routes(plan) if r[0] == "p1"],
        [f"{w.pod}/{w.model}" for w in plan.unloads if w.pod == "p1"],
        [h.reason for h in plan.holds if h.pod == "p1"],
    )
    assert p1 == expected, case


@pytest.mark.parametrize(
    "p1",
    [
        pod("p1", None),  # index unreadable
        pod("p1", {"a": X}, ready=False),
        pod("p1", {"a": X}, ip=""),
        pod("p1", None, label="h1"),
    ],
    ids=["index-unreadable", "not-ready", "no-ip", "labelled-unreadable"],
)
def test_an_unknown_pod_is_never_acted_on_and_counts_as_no_copy(p1: PoolPod) -> None:
    # a is wanted on p1 only; p2 holds a labelled READY copy that is no longer wanted there
    pods = [p1, pod("p2", {"a": R}, label="h1", ip="10.0.0.2")]
    memory = PoolModelsMemory(draining={("p1", "a"): 1.0}, loaded={("p1", "a"): "h1"})
    plan = decide_pool_models(pods, [want({"p1"})], memory, NOW)
    assert summary(plan) == ([], [], [], [Why.HOLD_POD_UNKNOWN, Why.HOLD_LAST_COPY])
    assert plan.memory.draining == {("p1", "a"): 1.0}
    assert plan.memory.loaded == {("p1", "a"): "h1"}


def test_two_old_copies_are_not_both_unlabelled_in_one_tick() -> None:
    pods = [pod("p1", {"a": R}, label="h1"), pod("p2", {"a": R}, label="h1"), pod("p3", {"a": X})]
    plan = decide_pool_models(pods, [want({"p3"})], PoolModelsMemory(), NOW)
    assert routes(plan) == [("p1", KEY, None)]
    assert [(h.pod, h.reason) for h in plan.holds] == [("p2", Why.HOLD_LAST_COPY)]
    assert [w.pod for w in plan.loads] == ["p3"]


def test_a_stale_label_is_removed_and_holds_the_pods_unloads() -> None:
    stale = loaded_label("gone")
    pods = [pod("p1", {"b": R}, extra_labels={stale: LOADED})]
    plan = decide_pool_models(pods, [], PoolModelsMemory(draining={("p1", "b"): 0.0}), NOW)
    assert summary(plan) == ([], [("p1", stale, None)], [], [Why.HOLD_STALE_LABEL])
    # the drain starts once the label is seen off, whatever an earlier tick remembered
    again = decide_pool_models([pod("p1", {"b": R})], [], plan.memory, NOW + 1)
    assert [h.reason for h in again.holds] == [Why.HOLD_DRAINING]
    done = decide_pool_models([pod("p1", {"b": R})], [], again.memory, NOW + 1 + DRAIN_S)
    assert [w.model for w in done.unloads] == ["b"]


def test_models_of_the_repository_never_loaded_are_left_alone() -> None:
    plan = decide_pool_models([pod("p1", {"a": X, "b": X})], [], PoolModelsMemory(), NOW)
    assert summary(plan) == ([], [], [], [])


def test_wanted_names_must_be_distinct() -> None:
    with pytest.raises(ValueError, match="distinct"):
        decide_pool_models([], [want({"p1"}), want({"p2"}, name="bm-b")], PoolModelsMemory(), NOW)


def test_the_patch_sets_label_and_annotation_together() -> None:
    plan = decide_pool_models(
        [pod("p1", {"a": R}, extra_labels={loaded_label("gone"): LOADED})],
        [want({"p1"})],
        PoolModelsMemory(loaded={("p1", "a"): "h1"}),
        NOW,
    )
    assert plan.patches[0].body == {
        "metadata": {
            "labels": {loaded_label("gone"): None, KEY: LOADED},
            "annotations": {loaded_label("gone"): None, KEY: "h1", POD_DELETION_COST: "1"},
        }
    }  # one model left on the pod: its ReplicaSet deletes pods serving none first


def test_a_pod_left_serving_no_model_loses_its_deletion_cost() -> None:
    plan = decide_pool_models([pod("p1", {}, extra_labels={loaded_label("gone"): LOADED})], [], PoolModelsMemory(), NOW)
    assert plan.patches[0].body["metadata"]["annotations"] == {loaded_label("gone"): None, POD_DELETION_COST: None}


def test_the_drain_time_is_the_prestop_delay_and_a_margin() -> None:
    assert DRAIN_S == PRESTOP_DELAY_S + 5.0 == 15.0


# --- outcomes -------------------------------------------------------------------------------------------------


def test_outcomes_update_the_memory_and_give_one_event_each() -> None:
    load = Load("p1", "10.0.0.1:8000", "bm-a", "a", want({"p1"}).request, "h1")
    unload = Unload("p2", "10.0.0.2:8000", "a")
    error = str(TritonCallError("p1", "a", "load", 400, "load failed for model 'a': bad"))
    mem = PoolModelsMemory(draining={("p2", "a"): 1.0})
    ok, events = remember(mem, [Outcome(load, None, NOW), Outcome(unload, None, NOW)])
    assert ok.loaded == {("p1", "a"): "h1"}
    assert ok.draining == {}
    assert [(e.type, e.reason, e.name) for e in events] == [
        ("Normal", Why.MODEL_LOADED, "bm-a"),
        ("Normal", Why.MODEL_UNLOADED, ""),
    ]
    bad, events = remember(mem, [Outcome(load, error, NOW)])
    assert bad.failed == {("p1", "a"): LoadFailure("h1", NOW, error)}
    assert [(e.type, e.reason, e.message) for e in events] == [
        ("Warning", Why.MODEL_LOAD_FAILED, "pod p1: load a: HTTP 400: load failed for model 'a': bad")
    ]


def test_an_unanswered_load_is_under_way_unless_it_replaces_a_ready_copy() -> None:
    """A load that timed out goes on in Triton: remembered as ours (labelled once READY, no reload, no backoff, no
    Warning). Over a READY copy, READY would not tell the new version from the old one Triton keeps: a failure."""
    timeout = str(TritonCallError("p1", "a", "load", None, "timeout: timed out"))
    fresh = Load("p1", "10.0.0.1:8000", "bm-a", "a", want({"p1"}).request, "h1")
    mem, events = remember(PoolModelsMemory(), [Outcome(fresh, timeout, NOW, answered=False)])
    assert (mem.loaded, mem.failed, events) == ({("p1", "a"): "h1"}, {}, [])
    plan = decide_pool_models([pod("p1", {"a": L})], [want({"p1"})], mem, NOW + 5)
    assert summary(plan) == ([], [], [], [Why.HOLD_IN_TRANSITION])
    plan = decide_pool_models([pod("p1", {"a": R})], [want({"p1"})], plan.memory, NOW + 10)
    assert summary(plan) == ([], [("p1", KEY, "h1")], [], [])  # labelled: no second load

    over = Load("p1", "10.0.0.1:8000", "bm-a", "a", want({"p1"}).request, "h2", replaces=True)
    mem, events = remember(PoolModelsMemory(), [Outcome(over, timeout, NOW, answered=False)])
    assert (mem.loaded, mem.failed) == ({}, {("p1", "a"): LoadFailure("h2", NOW, timeout)})
    assert [(e.type, e.reason) for e in events] == [("Warning", Why.MODEL_LOAD_FAILED)]
    reload = decide_pool_models([pod("p1", {"a": R}, label="h1")], [want({"p1"}, "h2")], PoolModelsMemory(), NOW)
    assert [w.replaces for w in reload.loads] == [True]
    assert [w.replaces for w in decide_pool_models([pod("p1", {})], [want({"p1"})], mem, NOW).loads] == [False]


def test_a_repeated_unload_failure_warns_once() -> None:
    unload = Unload("p2", "10.0.0.2:8000", "a")
    mem, first = remember(PoolModelsMemory(), [Outcome(unload, "pod p2: unload a: no answer: timeout", NOW)])
    mem, second = remember(mem, [Outcome(unload, "pod p2: unload a: no answer: timeout", NOW + 5)])
    assert [e.reason for e in first] == [Why.MODEL_UNLOAD_FAILED]
    assert second == []


def test_patch_outcomes_name_routing_and_draining() -> None:
    assert remember(PoolModelsMemory(), [Outcome(PodPatch("p1", ()), None, NOW)])[1] == []
    plan = decide_pool_models(
        [pod("p1", {"a": R}, label="h1"), pod("p2", {"a": R}, label="h1", ip="10.0.0.2")],
        [want({"p2"})],
        PoolModelsMemory(),
        NOW,
    )
    _, events = remember(PoolModelsMemory(), [Outcome(p, None, NOW) for p in plan.patches])
    assert [(e.reason, e.message) for e in events] == [(Why.MODEL_DRAINING, "pod p1 no longer routes a")]
    assert remember(PoolModelsMemory(), [Outcome(p, "409", NOW) for p in plan.patches])[1] == []


def test_gathered_pods_and_wanted_models() -> None:
    k8s = {
        "metadata": {"name": "pool-x", "labels": {KEY: LOADED}, "annotations": {KEY: "h1"}},
        "status": {"podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    index = {"a": IndexEntry("a", R)}
    got = pool_pod(k8s, index)
    assert (got.name, got.address, got.ready, got.known) == ("pool-x", "10.1.2.3:8000", True, True)
    assert not pool_pod(k8s, TritonCallError("pool-x", "", "index", None, "refused")).known
    terminating = {**k8s, "metadata": {**k8s["metadata"], "deletionTimestamp": "2026-12-02T00:00:00Z"}}
    assert not pool_pod(terminating, index).ready
    pool = GPUPoolSpec.model_validate(POOL_DOC["spec"])
    w1 = wanted_model("resnet", spec_with(), make_plan(8, [4, 8], 2500), pool, frozenset({"p1"}))
    w2 = wanted_model("resnet", spec_with(), make_plan(8, [4, 8], 3000), pool, frozenset({"p1"}))
    assert w1.request == load_request(spec_with(), make_plan(8, [4, 8], 2500), pool)
    assert (w1.model, len(w1.config_hash)) == ("resnet50", 16)
    assert w1.config_hash != w2.config_hash


# --- a small world: Triton and the API server applying the writes ---------------------------------------------


@dataclass
class World:
    """Pods p1..pn: each model's state, labels and annotations; loads succeed unless the model is in ``broken``."""

    states: dict[str, dict[str, ModelState]]
    labels: dict[str, dict[str, str]]
    unknown: set[str] = field(default_factory=set)
    broken: set[str] = field(default_factory=set)
    unloads: list[tuple[float, str, str]] = field(default_factory=list)

    def advance(self) -> None:
        """What Triton finished since the last tick: loads running (LOADING) and unloads (UNLOADING)."""
        for models in self.states.values():
            for m, s in list(models.items()):
                models[m] = R if s == L else X if s == U else s

    def pods(self) -> list[PoolPod]:
        out = []
        for i, name in enumerate(sorted(self.states)):
            idx = None if name in self.unknown else {m: IndexEntry(m, s) for m, s in self.states[name].items()}
            labels = dict.fromkeys(self.labels[name], LOADED)
            out.append(PoolPod(name, f"10.0.0.{i + 1}:8000", True, labels, dict(self.labels[name]), idx))
        return out

    def act(self, plan: PoolModelsPlan, now: float) -> list[Outcome]:
        out = []
        for w in plan.loads:
            ok = w.model not in self.broken
            if ok or self.states[w.pod].get(w.model) != R:  # a failed reload keeps the loaded version
                self.states[w.pod][w.model] = R if ok else X
            out.append(Outcome(w, None if ok else f"pod {w.pod}: load {w.model}: HTTP 400: broken", now))
        for p in plan.patches:
            for r in p.routes:
                if r.config_hash:
                    self.labels[p.pod][r.key] = r.config_hash
                else:
                    self.labels[p.pod].pop(r.key, None)
            out.append(Outcome(p, None, now))
        for u in plan.unloads:
            self.states[u.pod][u.model] = U  # Triton answers at once and unloads after the requests in flight
            self.unloads.append((now, u.pod, u.model))
            out.append(Outcome(u, None, now))
        return out

    def serving(self, model: str, key: str) -> set[str]:
        return {p for p, s in self.states.items() if s.get(model) == R and key in self.labels[p]}

    def run(
        self, wanted: list[WantedModel], memory: PoolModelsMemory, start: float, ticks: int, step: float = 5.0
    ) -> tuple[PoolModelsMemory, list[tuple[float, str]]]:
        """``ticks`` ticks ``step`` s apart; returns the memory and a log of what each tick did."""
        log: list[tuple[float, str]] = []
        for i in range(ticks):
            now = start + i * step
            self.advance()
            plan = decide_pool_models(self.pods(), wanted, memory, now)
            outcomes = self.act(plan, now)
            memory, _ = remember(plan.memory, outcomes)
            log += [(now, f"load {w.pod}") for w in plan.loads]
            log += [(now, f"{'label' if r.config_hash else 'unlabel'} {p.pod}") for p in plan.patches for r in p.routes]
            log += [(now, f"unload {w.pod}") for w in plan.unloads]
        return memory, log


def test_a_move_loads_routes_unroutes_drains_and_unloads_in_that_order() -> None:
    world = World({"p1": {"a": R}, "p2": {}}, {"p1": {KEY: "h1"}, "p2": {}})
    served: list[set[str]] = []
    memory, log = PoolModelsMemory(), []
    for i in range(8):
        memory, step = world.run([want({"p2"})], memory, NOW + 5 * i, 1)
        log += step
        served.append(world.serving("a", KEY))
    assert log == [
        (NOW, "load p2"),
        (NOW + 5, "label p2"),
        (NOW + 10, "unlabel p1"),
        (NOW + 15 + DRAIN_S, "unload p1"),  # first seen unlabelled at +15, unloaded DRAIN_S later
    ]
    assert all(served), "some tick had no labelled READY copy"
    assert world.states == {"p1": {"a": X}, "p2": {"a": R}}
    assert world.labels == {"p1": {}, "p2": {KEY: "h1"}}


def test_a_move_to_a_broken_config_keeps_the_old_copy_serving() -> None:
    world = World({"p1": {"a": R}, "p2": {}}, {"p1": {KEY: "h1"}, "p2": {}}, broken={"a"})
    _, log = world.run([want({"p2"})], PoolModelsMemory(), NOW, 30)
    assert world.serving("a", KEY) == {"p1"}
    assert not world.unloads
    loads = [t for t, what in log if what == "load p2"]
    assert loads == [NOW + i * LOAD_RETRY_S for i in range(3)], "one load a minute"


STATES = st.sampled_from([R, X, L])


@settings(max_examples=300, deadline=None)
@given(
    s1=STATES,
    s2=STATES,
    l1=st.sampled_from([None, "h0", "h1"]),
    l2=st.sampled_from([None, "h0", "h1"]),
    targets=st.sampled_from([{"p1"}, {"p2"}, {"p1", "p2"}, None]),
    crash_at=st.integers(0, 12),
    unknown_for=st.integers(0, 3),
)
def test_from_any_state_and_a_restart_at_any_tick_the_pool_converges(
    s1: ModelState,
    s2: ModelState,
    l1: str | None,
    l2: str | None,
    targets: set[str] | None,
    crash_at: int,
    unknown_for: int,
) -> None:
    """Any mix of copies and labels (what a crash mid-move leaves), the memory lost once more at any tick, p2's
    index unreadable for the first ticks: the model ends READY and labelled with the wanted config exactly on its
    target pods and unloaded elsewhere (not wanted: nowhere); once it is served it stays served; nothing is unloaded
    within DRAIN_S of its label going, nor from an unknown pod."""
    states = {"p1": {"a": s1} if s1 != X else {}, "p2": {"a": s2} if s2 != X else {}}
    world = World(states, {"p1": {KEY: l1} if l1 else {}, "p2": {KEY: l2} if l2 else {}})
    wanted = [want(targets)] if targets is not None else []
    memory, unlabelled_at, was_served = PoolModelsMemory(), {"p1": NOW, "p2": NOW}, False
    for i in range(40):
        now = NOW + 5 * i
        world.unknown = {"p2"} if i < unknown_for else set()
        if i == crash_at:
            memory = PoolModelsMemory()
        world.advance()
        before = {p: KEY in world.labels[p] for p in world.states}
        plan = decide_pool_models(world.pods(), wanted, memory, now)
        assert not {w.pod for w in (*plan.loads, *plan.unloads)} & world.unknown
        for u in plan.unloads:
            assert not before[u.pod]
            assert now - unlabelled_at[u.pod] >= DRAIN_S
        memory, _ = remember(plan.memory, world.act(plan, now))
        for p, was in before.items():
            if was and KEY not in world.labels[p]:
                unlabelled_at[p] = now + 5  # seen off from the next tick
        served = world.serving("a", KEY)
        if targets is not None:
            assert served or not was_served, f"tick {i}: a served, wanted model lost its last copy"
            was_served = was_served or bool(served)
    final = {p: (s.get("a", X), world.labels[p].get(KEY)) for p, s in world.states.items()}
    expected = {p: (R, "h1") if targets and p in targets else (X, None) for p in ("p1", "p2")}
    assert final == expected


def test_plan_memory_forgets_pods_that_are_gone() -> None:
    memory = PoolModelsMemory(
        loaded={("gone", "a"): "h1"},
        failed={("gone", "a"): LoadFailure("h1", NOW, "x")},
        draining={("gone", "a"): NOW},
    )
    plan = decide_pool_models([pod("p1", {})], [want({"p1"})], memory, NOW)
    assert plan.memory == PoolModelsMemory()
