"""The pool loop's joint plan (controller/pool_plan.py) and its writes (controller/pool_sync.py,
controller/shared_status.py): pure functions, fed BatchedModel and pod documents shaped as the API server and the
informer give them."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from batchfill.api.pool import GPUPoolSpec
from batchfill.api.spec import PlacementMode
from batchfill.controller.desired import Desired
from batchfill.controller.pool_plan import (
    REPLAN_S,
    Member,
    PoolPlan,
    PoolPlanMemory,
    assign_slots,
    decide_pool_plan,
    pod_slots,
)
from batchfill.controller.pool_sync import (
    POOL_HASH_ANNOTATION,
    labelled,
    member,
    member_writes,
    pool_deployment,
    pool_status,
)
from batchfill.controller.shared_status import copies, member_rate, served_shared, shared_status
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.render.kube import CONFIG_HASH_ANNOTATION
from batchfill.render.pool import LOADED, PoolOwner, loaded_label, pool_selector_labels

from .test_controller_loops import MODEL, NS, SCALING_SPEC, T0
from .test_pool_api import POOL_DOC

POOL = "small-models"
SPEC = GPUPoolSpec.model_validate(POOL_DOC["spec"])  # 10 GiB of GPU memory, maxPods 4
OWNER = PoolOwner(POOL, NS, "uid-pool")


def model_doc(name: str, mode: str = "Shared", **status: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SCALING_SPEC)
    spec["model"] = {**MODEL, "name": name}
    spec["placement"] = {"mode": mode, "pool": POOL}
    meta = {"name": f"bm-{name}", "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "7", "generation": 1}
    return {"metadata": meta, "spec": spec, "status": dict(status)}


def members(*rates: tuple[str, float | None, str]) -> list[tuple[dict[str, Any], Member, Desired]]:
    out = []
    for name, rate, mode in rates:
        doc = model_doc(name, mode)
        found = member(doc, rate)
        assert not isinstance(found, str), found
        out.append((doc, *found))
    return out


def pod(name: str, *serving: str, ready: bool = True) -> dict[str, Any]:
    labels = {**pool_selector_labels(POOL), **{loaded_label(m): LOADED for m in serving}}
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": {"name": name, "namespace": NS, "labels": labels}, "status": {"conditions": conditions}}


# --------------------------------------------------------------------------------------------- the joint plan


def test_low_rate_models_share_fewer_pods_than_models_and_each_is_on_exactly_the_pods_of_its_slots() -> None:
    ms = [m for _, m, _ in members(("a", 5.0, "Shared"), ("b", 5.0, "Shared"), ("c", 5.0, "Auto"))]
    plan = decide_pool_plan(SPEC, ms, ["p0", "p1", "p2"], PoolPlanMemory(), T0)
    assert plan.placement is not None
    assert not plan.notes
    assert all(p.dedicated_gpus == 0 for p in plan.placement.models)
    assert plan.slots == tuple(("gpu", g.gpu_id) for g in plan.placement.shared)
    assert 1 <= plan.pods == len(plan.slots) < len(ms)
    on = plan.memory.slots
    for m in ms:
        gpu = plan.placement.model(m.name).shared_gpu
        assert plan.where[m.name] == frozenset([on[("gpu", gpu)]])
    assert len(set(on.values())) == len(plan.slots)  # one slot per pod while there are pods enough


def test_a_model_that_fills_gpus_keeps_them_on_the_pool_when_shared_and_leaves_when_auto() -> None:
    ms = [m for _, m, _ in members(("a", 5.0, "Shared"), ("hot", 150.0, "Shared"), ("auto", 150.0, "Auto"))]
    plan = decide_pool_plan(SPEC, ms, [f"p{i}" for i in range(6)], PoolPlanMemory(), T0)
    assert plan.placement is not None
    hot, auto = plan.placement.model("bm-hot"), plan.placement.model("bm-auto")
    assert hot.dedicated_gpus >= 1
    assert auto.dedicated_gpus >= 1
    assert [s for s in plan.slots if s[0] == "own"] == [("own", "bm-hot", k) for k in range(hot.dedicated_gpus)]
    assert plan.where["bm-auto"] == frozenset()  # graduates to replicas of its own
    assert len(plan.where["bm-hot"]) >= hot.dedicated_gpus
    assert plan.pods == min(SPEC.maxPods, len(plan.slots))


def test_a_shared_gpu_that_holds_only_a_graduated_auto_models_residual_is_no_slot() -> None:
    """Its own replicas carry all of its load: a pool pod for its residual would serve nothing."""
    ms = [m for _, m, _ in members(("a", 5.0, "Shared"), ("auto", 150.0, "Auto"))]
    plan = decide_pool_plan(SPEC, ms, [f"p{i}" for i in range(4)], PoolPlanMemory(), T0)
    assert plan.placement is not None
    auto = plan.placement.model("bm-auto")
    assert auto.dedicated_gpus >= 1
    assert auto.shared_gpu is not None  # the plan packed its residual ...
    alone = [g.gpu_id for g in plan.placement.shared if g.tenants == ("bm-auto",)]
    assert alone == [auto.shared_gpu]  # ... on a GPU of its own
    assert plan.slots == (("gpu", plan.placement.model("bm-a").shared_gpu),)  # ... which is no pod
    assert plan.pods == 1
    only = decide_pool_plan(SPEC, ms[1:], ["p0"], PoolPlanMemory(), T0)
    assert only.slots == ()
    assert only.pods == SPEC.minPods


def test_an_auto_model_on_its_own_replicas_comes_back_only_once_clearly_below_one_gpu() -> None:
    def at(rate: float, memory: PoolPlanMemory, now: float) -> Any:
        ms = [m for _, m, _ in members(("auto", rate, "Auto"), ("a", 5.0, "Shared"))]
        return decide_pool_plan(SPEC, ms, ["p0", "p1"], memory, now)

    hot = at(150.0, PoolPlanMemory(), T0)
    auto = hot.placement.model("bm-auto")
    assert auto.dedicated_gpus >= 1
    one_gpu = auto.rate_rps / auto.design_rate_rps * auto.capacity_rps  # u·C: the rate that fills one GPU
    assert at(0.95 * one_gpu, PoolPlanMemory(), T0).placement.model("bm-auto").dedicated_gpus == 0  # never left
    # the same rate after it left: it stays on its own replicas (within RETURN_MARGIN of one GPU) ...
    near = at(0.95 * one_gpu, hot.memory, T0 + REPLAN_S)
    assert near.memory.at == T0 + REPLAN_S
    assert near.placement.model("bm-auto").dedicated_gpus == 1
    assert near.where["bm-auto"] == frozenset()
    # ... and comes back once clearly below it, at its own rate
    below = at(0.85 * one_gpu, near.memory, T0 + 2 * REPLAN_S)
    back = below.placement.model("bm-auto")
    assert back.dedicated_gpus == 0
    assert back.rate_rps == pytest.approx(0.85 * one_gpu)
    assert below.where["bm-auto"]


def test_the_plan_holds_for_replan_s_unless_a_rate_rose_and_an_unknown_rate_is_the_last_known_one() -> None:
    ms = [m for _, m, _ in members(("a", 5.0, "Shared"), ("b", 6.0, "Shared"))]
    first = decide_pool_plan(SPEC, ms, ["p0", "p1"], PoolPlanMemory(), T0)
    # within the band (5 -> 5.5 is 10 %, under 10 % + 0.1 req/s), and falls: held until REPLAN_S
    noisy = [m.__class__(**{**m.__dict__, "rate_rps": r}) for m, r in zip(ms, (5.6, 1.0), strict=True)]
    held = decide_pool_plan(SPEC, noisy, ["p0", "p1"], first.memory, T0 + REPLAN_S / 2)
    assert held.placement is first.placement
    assert held.memory.at == T0
    # a rise past it is planned at once: the kept placement is re-checked at the rates it must now carry
    busier = [m.__class__(**{**m.__dict__, "rate_rps": 40.0}) for m in ms]
    risen = decide_pool_plan(SPEC, busier, ["p0", "p1"], held.memory, T0 + REPLAN_S / 2 + 1)
    assert risen.placement is not held.placement
    assert risen.memory.at == T0 + REPLAN_S / 2 + 1
    assert {m.name: m.rate_rps for m in risen.placement.models} == {"bm-a": 40.0, "bm-b": 40.0}  # type: ignore[union-attr]
    held = decide_pool_plan(SPEC, busier, ["p0", "p1"], risen.memory, T0 + REPLAN_S)
    assert held.placement is risen.placement  # planned for those rates: no plan each tick
    unknown = [m.__class__(**{**m.__dict__, "rate_rps": r}) for m, r in zip(ms, (None, math.nan), strict=True)]
    again = decide_pool_plan(SPEC, unknown, ["p0", "p1"], held.memory, T0 + REPLAN_S * 2)
    assert again.memory.at == T0 + REPLAN_S * 2  # planned again ...
    assert again.memory.rates == held.memory.rates == {"bm-a": 40.0, "bm-b": 40.0}  # ... on the last known rates
    fresh = decide_pool_plan(SPEC, unknown, ["p0", "p1"], PoolPlanMemory(), T0)
    assert fresh.memory.rates == {"bm-a": 0.0, "bm-b": 0.0}  # never known: 0, no reason to move


def test_a_new_member_is_planned_at_once_and_a_model_without_profile_is_noted_and_served_on_the_first_pod() -> None:
    (_, a, _), (_, b, _) = members(("a", 5.0, "Shared"), ("b", 5.0, "Shared"))
    first = decide_pool_plan(SPEC, [a], ["p0", "p1"], PoolPlanMemory(), T0)
    unprofiled = Member("bm-new", b.spec.model_copy(update={"profile": None}), PlacementMode.SHARED, solo=None)
    second = decide_pool_plan(SPEC, [a, unprofiled], ["p0", "p1"], first.memory, T0 + 1)
    assert second.memory.at == T0 + 1  # the members changed: no waiting for REPLAN_S
    assert "no profile yet" in second.notes["bm-new"]
    assert second.where["bm-new"] == frozenset([second.memory.slots[("gpu", 0)]])
    assert "bm-new" not in {p.name for p in second.placement.models}  # type: ignore[union-attr]


def test_no_member_means_min_pods_and_no_slot() -> None:
    plan = decide_pool_plan(SPEC, [], ["p0"], PoolPlanMemory(), T0)
    assert (plan.placement, plan.slots, plan.pods, dict(plan.where)) == (None, (), SPEC.minPods, {})


def test_pod_slots_without_a_placement_is_one_slot_for_members_none_without() -> None:
    ((_, a, _),) = members(("a", 1.0, "Shared"))
    assert pod_slots(None, [a]) == (("gpu", 0),)
    assert pod_slots(None, []) == ()


@pytest.mark.parametrize("seed", range(5))
def test_slots_stay_on_their_pods_and_a_lost_pod_moves_only_its_own_slot(seed: int) -> None:
    slots = [("gpu", i) for i in range(4)]
    pods = [f"p{(i + seed) % 4}" for i in range(4)]
    first = assign_slots(slots, pods, {})
    assert sorted(first.values()) == sorted(pods)
    lost = first[("gpu", seed % 4)]
    after = assign_slots(slots, [p for p in pods if p != lost] + ["p9"], first)
    assert {s: p for s, p in after.items() if first[s] != p} == {("gpu", seed % 4): "p9"}


def test_with_fewer_pods_than_slots_they_share_and_a_pod_added_takes_a_shared_slot() -> None:
    slots = [("gpu", 0), ("gpu", 1), ("gpu", 2)]
    two = assign_slots(slots, ["p0", "p1"], {})
    assert set(two.values()) == {"p0", "p1"}
    assert len(two) == 3
    three = assign_slots(slots, ["p0", "p1", "p2"], two)
    assert sorted(three.values()) == ["p0", "p1", "p2"]
    assert sum(1 for s in slots if three[s] != two[s]) == 1  # only the overflowing slot moved
    assert assign_slots(slots, [], two) == {}


# ------------------------------------------------------------------------------------------------- statuses


def test_served_shared_follows_spec_mode_and_for_auto_the_pool_loops_placement() -> None:
    assert served_shared(model_doc("a", "Shared"))
    assert not served_shared(model_doc("a", "Auto"))
    assert served_shared(model_doc("a", "Auto", placement={"mode": "Shared", "pool": POOL}))
    assert not served_shared(model_doc("a", "Auto", placement={"mode": "Shared", "pool": "another"}))
    assert not served_shared(model_doc("a", "Dedicated", placement={"mode": "Shared", "pool": POOL}))


def test_a_members_rate_adds_its_own_replicas_only_while_its_own_scaling_loop_writes_them() -> None:
    """An Auto model that graduated has no pool copy: its rate is its own replicas' (status.observed, written by its
    scaling loop), so the plan sees its load fall and can bring it back; a shared model's stored figure is stale."""
    observed = {"observed": {"requestRate": 40.0}}
    dedicated = model_doc("a", "Auto", placement={"mode": "Dedicated", "pool": POOL}, **observed)
    assert member_rate(False, None, dedicated) == 40.0
    assert member_rate(True, 2.5, dedicated) == 42.5  # moving: the pool's copy and its own replicas both serve
    assert member_rate(True, None, dedicated) is None  # the copies' rate unknown: not the own part alone
    assert member_rate(True, math.nan, dedicated) is None
    shared = model_doc("a", "Auto", placement={"mode": "Shared", "pool": POOL}, **observed)
    assert member_rate(True, 3.0, shared) == 3.0
    assert member_rate(False, None, shared) is None  # stale status.observed is not read
    assert member_rate(False, None, model_doc("a", "Shared", **observed)) is None
    unknown = model_doc("a", "Auto", placement={"mode": "Dedicated", "pool": POOL}, observed={"requestRate": None})
    assert member_rate(False, None, unknown) is None
    # a draining pool copy's rate is not the load of a model its own replicas serve: unknown, the plan keeps the
    # last known rate and does not move it back
    assert member_rate(True, 0.0, unknown) is None
    assert member_rate(True, 1.0, unknown) is None


def test_a_shared_models_status_counts_its_copies_as_ready_up_to_date_replicas() -> None:
    ((doc, _, desired),) = members(("a", 5.0, "Shared"))
    view = copies(2, desired.config_hash)
    assert view["status"]["readyReplicas"] == view["spec"]["replicas"] == 2
    assert view["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == desired.config_hash
    placed = {"mode": "Shared", "pool": POOL, "podCount": 2}
    status = shared_status(doc, desired, placed, now=T0)
    assert status["placement"] == placed
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)
    doc["status"] = status
    assert shared_status(doc, desired, None, now=T0)["placement"] == placed  # None keeps the stored one


def test_member_writes_set_placement_and_reapply_when_copies_first_appear_or_the_mode_changes() -> None:
    ms = members(("a", 5.0, "Shared"), ("auto", 150.0, "Auto"))
    plan = decide_pool_plan(SPEC, [m for _, m, _ in ms], ["p0", "p1"], PoolPlanMemory(), T0)
    pods = [pod("p0", "bm-a"), pod("p1")]
    a, auto = member_writes(ms, plan, pods, now=T0)
    assert a.status["placement"]["mode"] == "Shared"
    assert a.status["placement"]["podCount"] == 1
    assert a.reapply  # copies appeared: its own replicas (if any) may go, its Service follows
    assert auto.status["placement"]["mode"] == "Dedicated"
    assert auto.reapply
    assert "replicas" not in auto.status  # a dedicated model's counts are the handlers' (its Deployment)
    for w, (doc, _, _) in zip((a, auto), ms, strict=True):
        doc["status"] = {**doc["status"], **w.status}
    again = member_writes(ms, plan, pods, now=T0 + 5)
    assert [(w.status, w.reapply) for w in again] == [({}, False), ({}, False)]  # written only where changed


def test_a_shared_models_observed_signals_come_from_its_copies_and_unknown_removes_them() -> None:
    """A shared model has no scaling loop of its own: the pool loop writes status.observed from the signals over
    its pool copies, removes it when they are unknown or it has no copy, and leaves a dedicated model's alone."""
    ms = members(("a", 5.0, "Shared"), ("b", 5.0, "Shared"), ("auto", 150.0, "Auto"))
    plan = decide_pool_plan(SPEC, [m for _, m, _ in ms], ["p0", "p1"], PoolPlanMemory(), T0)
    pods = [pod("p0", "bm-a", "bm-b"), pod("p1")]
    ok = ModelSignals(SignalState.OK, pods=1, request_rate_rps=4.2, avg_batch_size=1.5, batch_fill=0.1875,
                      queue_time_ms=0.7, p99_ms=41.0)  # fmt: skip
    ms[1][0]["status"]["observed"] = {"requestRate": 9.0}  # stale, from before it was shared
    a, b, auto = member_writes(ms, plan, pods, now=T0, signals={"bm-a": ok, "bm-auto": ok})
    assert a.status["observed"] == {"requestRate": 4.2, "avgBatchSize": 1.5, "batchFill": 0.188,
                                    "queueTimeMs": 0.7, "p99Ms": 41.0, "rateVariability": None}  # fmt: skip
    assert b.status["observed"] is None  # no signals for it this tick: removed, not left stale
    assert "observed" not in auto.status  # dedicated: its own scaling loop writes it
    unknown = ModelSignals(SignalState.UNKNOWN, reason="PrometheusUnavailable")
    ms[0][0]["status"] = {**ms[0][0]["status"], **a.status}
    again = member_writes(ms, plan, pods, now=T0 + 5, signals={"bm-a": unknown})
    assert set(again[0].status) == {"observed", "conditions"}
    assert again[0].status["observed"] is None
    assert _condition(again[0].status, "MetricsAvailable")[:2] == ("False", "PrometheusUnavailable")
    held = member_writes(ms, plan, pods, now=T0 + 5, signals=None)  # no signal source: left as stored
    assert "observed" not in held[0].status


def _condition(status: dict[str, Any], type_: str) -> tuple[str, str, str]:
    found = next(c for c in status["conditions"] if c["type"] == type_)
    return found["status"], found["reason"], found["message"]


def test_a_shared_models_metrics_and_failing_requests_conditions_come_from_its_copies() -> None:
    """MetricsAvailable and RequestsFailing of a shared model, from the signals over its copies (it has no scaling
    loop to set them): failures on its copies set RequestsFailing True with the rate, success sets it False."""
    ms = members(("a", 5.0, "Shared"), ("b", 5.0, "Shared"))
    plan = decide_pool_plan(SPEC, [m for _, m, _ in ms], ["p0"], PoolPlanMemory(), T0)
    pods = [pod("p0", "bm-a", "bm-b")]
    failing = ModelSignals(SignalState.OK, pods=1, request_rate_rps=1.0, failure_rate_rps=3.0)
    ok = ModelSignals(SignalState.OK, pods=1, request_rate_rps=4.0, failure_rate_rps=0.0)
    a, b = member_writes(ms, plan, pods, now=T0, signals={"bm-a": failing, "bm-b": ok})
    assert _condition(a.status, "MetricsAvailable") == ("True", "SignalsOk", "1 pool copies reporting")
    status, reason, message = _condition(a.status, "RequestsFailing")
    assert (status, reason) == ("True", "RequestsFailing")
    assert message.startswith("3 failed requests/s, 75% of all requests")
    assert "RequestsFailing" not in {c["type"] for c in b.status["conditions"]}  # never failed: no condition
    ms[0][0]["status"] = {**ms[0][0]["status"], **a.status}
    (recovered, _) = member_writes(ms, plan, pods, now=T0 + 5, signals={"bm-a": ok})
    assert _condition(recovered.status, "RequestsFailing")[:2] == ("False", "RequestsSucceeding")
    ms[0][0]["status"] = {**ms[0][0]["status"], **recovered.status}
    (gone, _) = member_writes(ms, plan, pods, now=T0 + 10, signals={})
    assert _condition(gone.status, "MetricsAvailable") == ("False", "NoData", "no pool copy serves it this tick")
    assert _condition(gone.status, "RequestsFailing")[0] == "False"  # unknown now: the stored one stays


def test_a_member_leaving_the_pool_has_its_copies_counts_zeroed_with_its_new_placement_in_one_patch() -> None:
    """Auto at a rate that fills a GPU, stored Shared with 1 copy: the patch that says Dedicated also says 0 replicas
    Ready (they were its copies'), so the pool, which keeps a copy until readyReplicas counts one of its own, keeps
    it even when the operator dies before the re-apply that writes the real count. Found by
    tests/cluster/test_shared_moves.py."""
    ((doc, m, desired),) = members(("auto", 150.0, "Auto"))
    doc["status"] = {**doc["status"], "replicas": 1, "readyReplicas": 1,
                     "placement": {"mode": "Shared", "pool": POOL, "podCount": 1}}  # fmt: skip
    plan = decide_pool_plan(SPEC, [m], ["p0"], PoolPlanMemory(), T0)
    (w,) = member_writes([(doc, m, desired)], plan, [pod("p0", "bm-auto")], now=T0)
    assert w.status["placement"]["mode"] == "Dedicated"
    assert w.status["placement"]["podCount"] == 1  # the copy still serves it
    assert (w.status["replicas"], w.status["readyReplicas"]) == (0, 0)
    assert w.reapply
    doc["status"] = {**doc["status"], **w.status, "readyReplicas": 2}  # its own replicas, as its scaling loop says
    (again,) = member_writes([(doc, m, desired)], plan, [pod("p0")], now=T0 + 5)
    assert "readyReplicas" not in again.status  # once Dedicated, the counts are its own Deployment's


def test_pool_status_counts_pods_models_and_a_finite_headroom() -> None:
    ms = [m for _, m, _ in members(("a", 5.0, "Shared"), ("b", 5.0, "Shared"))]
    plan = decide_pool_plan(SPEC, ms, ["p0"], PoolPlanMemory(), T0)
    body = {"metadata": {"name": POOL, "namespace": NS, "generation": 3}, "status": {}}
    status = pool_status(body, plan, [pod("p0", "bm-a"), pod("p1", ready=False)], len(ms))
    assert {k: status[k] for k in ("observedGeneration", "pods", "readyPods", "desiredPods", "models")} == {
        "observedGeneration": 3, "pods": 2, "readyPods": 1, "desiredPods": plan.pods, "models": 2
    }  # fmt: skip
    assert 0.0 <= status["planHeadroom"] < 1.0
    body["status"] = status
    assert pool_status(body, plan, [pod("p0", "bm-a"), pod("p1", ready=False)], len(ms)) == {}


def test_a_pool_with_no_plan_left_drops_its_stored_headroom() -> None:
    """Every member deleted: the stored planHeadroom described a plan that is gone, so it is removed (None in the
    merge patch). Found by tests/cluster/test_shared_pool.py."""
    stored = {"observedGeneration": 1, "pods": 0, "readyPods": 0, "desiredPods": 0, "models": 0, "planHeadroom": 0.92}
    body = {"metadata": {"name": POOL, "namespace": NS, "generation": 1}, "status": stored}
    plan = PoolPlan(placement=None, slots=(), pods=0, where={}, notes={}, memory=PoolPlanMemory())
    assert pool_status(body, plan, [], 0) == {"planHeadroom": None}
    body["status"] = {k: v for k, v in stored.items() if k != "planHeadroom"}
    assert pool_status(body, plan, [], 0) == {}


def test_labelled_is_ready_labelled_pods_not_terminating() -> None:
    gone = pod("p2", "bm-a")
    gone["metadata"]["deletionTimestamp"] = "2027-01-01T00:00:00Z"
    assert labelled([pod("p0", "bm-a"), pod("p1", "bm-a", ready=False), gone, pod("p3", "bm-b")], "bm-a") == ["p0"]


def test_member_refuses_a_spec_that_cannot_be_planned_with_the_reason() -> None:
    doc = model_doc("a")
    doc["spec"]["sla"]["latencyP99Ms"] = 1  # below the batch of one's latency
    found = member(doc, 1.0)
    assert isinstance(found, str)
    assert "cannot be planned" in found


# --------------------------------------------------------------------------------------------- the Deployment


def _cached(replicas: int, digest: str) -> dict[str, Any]:
    return {"spec": {"replicas": replicas, "template": {"metadata": {"annotations": {POOL_HASH_ANNOTATION: digest}}}}}


def test_the_pool_deployment_is_applied_when_missing_then_only_when_replicas_or_the_spec_change() -> None:
    new = pool_deployment(OWNER, SPEC, None, 2, [])
    assert new is not None
    assert new["spec"]["replicas"] == 2
    digest = new["spec"]["template"]["metadata"]["annotations"][POOL_HASH_ANNOTATION]
    assert pool_deployment(OWNER, SPEC, _cached(2, digest), 2, []) is None
    assert pool_deployment(OWNER, SPEC, _cached(2, "other"), 2, []) is not None
    grown = pool_deployment(OWNER, SPEC, _cached(2, digest), 3, [])
    assert grown is not None
    assert grown["spec"]["replicas"] == 3
    cpu = pool_deployment(OWNER, SPEC, None, 1, [], cpu_image="triton:cpu")
    assert cpu is not None
    assert cpu["spec"]["template"]["metadata"]["annotations"][POOL_HASH_ANNOTATION] != digest
    assert {c["image"] for c in cpu["spec"]["template"]["spec"]["containers"]} >= {"triton:cpu"}


def test_the_pool_shrinks_only_to_the_pods_still_serving_a_model() -> None:
    digest = pool_deployment(OWNER, SPEC, None, 1, [])["spec"]["template"]["metadata"]["annotations"][  # type: ignore[index]
        POOL_HASH_ANNOTATION
    ]
    serving = [pod("p0", "bm-a"), pod("p1", "bm-b"), pod("p2")]
    held = pool_deployment(OWNER, SPEC, _cached(3, digest), 1, serving)
    assert held is not None
    assert held["spec"]["replicas"] == 2
    assert pool_deployment(OWNER, SPEC, _cached(2, digest), 1, serving[:2]) is None
    drained = pool_deployment(OWNER, SPEC, _cached(2, digest), 1, [pod("p0", "bm-a"), pod("p1")])
    assert drained is not None
    assert drained["spec"]["replicas"] == 1
    assert pool_deployment(OWNER, SPEC, _cached(3, digest), 9, [])["spec"]["replicas"] == SPEC.maxPods  # type: ignore[index]


def test_a_member_the_plan_refused_keeps_its_reason_while_the_plan_holds() -> None:
    (_, a, _), (_, b, _) = members(("a", 5.0, "Shared"), ("b", 5.0, "Shared"))
    huge = Member(b.name, b.spec, b.mode, memory_mib=10**6, rate_rps=5.0, solo=b.solo)  # above the pool's GPU
    first = decide_pool_plan(SPEC, [a, huge], ["p0", "p1"], PoolPlanMemory(), T0)
    reason = first.notes["bm-b"]
    assert reason == "spec.placement.memoryMiB=1e+06 MiB must be > 0 and fit the GPU's 9728 MiB left beside the server"
    # ticks that keep the plan restate the reason it gave, not another one (status would flip each tick)
    kept = decide_pool_plan(SPEC, [a, huge], ["p0", "p1"], first.memory, T0 + 5)
    assert kept.placement is first.placement
    assert kept.notes == first.notes


def test_a_pool_gpu_without_room_beside_the_server_is_named_by_its_field() -> None:
    ((_, a, _),) = members(("a", 5.0, "Shared"))
    small = SPEC.model_copy(update={"gpuMemoryMiB": 512})
    plan = decide_pool_plan(small, [a], ["p0"], PoolPlanMemory(), T0)
    assert plan.placement is None
    assert plan.notes == {"bm-a": "the GPUPool's spec.gpuMemoryMiB=512 leaves no room beside the Triton server's "
                                  "512 MiB"}  # fmt: skip
