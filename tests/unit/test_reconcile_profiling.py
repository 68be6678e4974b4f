"""Profiling in the reconcile path: the first plan, the measured profile in use, and one profiling pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batchfill.api.errors import SpecError
from batchfill.api.reasons import ConditionReason, ConditionType, ReplanReason
from batchfill.api.status import PlannedProfileSource
from batchfill.controller.desired import adopted_profile, desired_state, profile_hash
from batchfill.controller.pods import ready_pod_ips
from batchfill.controller.profiling import profile_tick
from batchfill.controller.status import changed_fields, children_drift, desired_status
from batchfill.policy.conditions import find
from batchfill.policy.profile_fit import BatchTotals
from batchfill.render.kube import CONFIG_HASH_ANNOTATION

T0 = 1_800_000_000.0
SPEC: dict[str, Any] = {
    "model": {"name": "sleep", "backend": "python"},
    "sla": {"latencyP99Ms": 200, "networkOverheadMs": 20},
    "batching": {"maxBatchSize": 8},
    "profiling": {"minExecutions": 20, "replanIntervalSeconds": 60},
}


def body(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"name": "m", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "7"}
    return {"metadata": meta, "spec": spec, "status": status or {}}


def totals(
    alpha: float = 40.0, beta: float = 6.0, sizes: tuple[int, ...] = (1, 2, 3), n: int = 50
) -> list[BatchTotals]:
    return [BatchTotals(b, n, round(n * (alpha + beta * b) * 1e6)) for b in sizes]


def test_without_a_profile_the_first_plan_is_served_with_unknown_capacity() -> None:
    d = desired_state(SPEC)
    assert d.profile_source == PlannedProfileSource.FIRST_PLAN
    assert d.plan_status.capacityPerReplicaRps == 0
    assert d.plan_status.preferredBatchSizes == list(range(1, 9))
    assert d.plan_status.maxQueueDelayMicroseconds == 100
    assert "max_batch_size: 8" in d.config
    wanted = desired_status(body(SPEC), d, {"status": {"replicas": 1, "readyReplicas": 1}}, now=T0)
    assert find(wanted["conditions"], ConditionType.PLANNED)["reason"] == ConditionReason.FIRST_PLAN  # type: ignore[index]
    assert find(wanted["conditions"], ConditionType.SLA_FEASIBLE)["status"] == "Unknown"  # type: ignore[index]
    assert wanted["plannedProfile"] == {
        "source": PlannedProfileSource.FIRST_PLAN,
        "points": [],
        "since": None,  # no measurement was ever adopted
        "reason": "",
        "message": "",
        "declaredHash": "none",
    }


def test_the_first_plan_needs_the_models_batch_limit() -> None:
    spec = copy.deepcopy(SPEC)
    del spec["batching"]
    with pytest.raises(SpecError, match=r"spec\.batching\.maxBatchSize: is required while spec\.profile is absent"):
        desired_state(spec)


def test_declared_source_without_a_profile_is_rejected_naming_the_field() -> None:
    spec = copy.deepcopy(SPEC) | {"profiling": {"source": "Declared"}}
    with pytest.raises(SpecError, match=r"spec\.profiling\.source=Declared needs spec\.profile"):
        desired_state(spec)


def test_a_profiling_pass_adopts_the_measurement_once_and_the_plan_follows() -> None:
    tick = profile_tick(body(SPEC), totals(), pods=1, now=T0)
    assert tick.replan
    assert tick.reason == ReplanReason.PROFILE_MEASURED
    planned = tick.status["plannedProfile"]
    assert planned["source"] == PlannedProfileSource.MEASURED
    assert [p["batchSize"] for p in planned["points"]] == [1, 2, 3, 8]
    assert planned["points"][0] == {"batchSize": 1, "latencyMs": 46.0, "executions": 50}
    assert planned["points"][-1]["executions"] == 0  # extrapolated to spec.batching.maxBatchSize
    assert planned["points"][-1]["latencyMs"] == pytest.approx(88.0)
    assert tick.events[0][:2] == ("Normal", ReplanReason.PROFILE_MEASURED)
    status = dict(tick.status)
    measured = adopted_profile(SPEC, status)
    assert measured == ((1, 46.0), (2, 52.0), (3, 58.0), (8, 88.0))
    d = desired_state(SPEC, measured)
    assert d.profile_source == PlannedProfileSource.MEASURED
    assert d.plan_status.capacityPerReplicaRps > 0
    # the next pass, same numbers: nothing to write (no replan, measuredProfile is fresh)
    again = profile_tick(body(SPEC, status), totals(), pods=1, now=T0 + 5)
    assert (again.replan, again.status) == (False, {})
    assert again.reason == ReplanReason.REPLAN_INTERVAL_NOT_ELAPSED
    # a far slower model after the interval: replanned from the adopted profile, with old and new values
    later = profile_tick(body(SPEC, status), totals(alpha=60.0), pods=1, now=T0 + 61)
    assert later.replan
    assert later.reason == ReplanReason.PROFILE_DISAGREES
    assert "adopted measured 46 ms, measured 66 ms" in later.status["plannedProfile"]["message"]


def test_too_few_executions_write_nothing() -> None:
    tick = profile_tick(body(SPEC), totals(n=5), pods=1, now=T0)
    assert (tick.replan, tick.status, tick.reason) == (False, {}, ReplanReason.AWAITING_MEASUREMENT)


def test_a_declared_profile_within_tolerance_is_kept_and_the_measurement_shown() -> None:
    spec = copy.deepcopy(SPEC) | {"profile": [{"batchSize": 1, "latencyMs": 47}, {"batchSize": 8, "latencyMs": 90}]}
    tick = profile_tick(body(spec), totals(), pods=2, now=T0)
    assert not tick.replan
    assert tick.reason == ReplanReason.PROFILE_AGREES
    assert set(tick.status) == {"measuredProfile"}
    assert tick.status["measuredProfile"]["pods"] == 2
    assert desired_state(spec, adopted_profile(spec, tick.status)).profile_source == PlannedProfileSource.DECLARED


def test_a_new_declared_profile_wins_over_an_older_measurement() -> None:
    status = dict(profile_tick(body(SPEC), totals(), pods=1, now=T0).status)
    assert adopted_profile(SPEC, status) is not None
    spec = copy.deepcopy(SPEC) | {"profile": [{"batchSize": 1, "latencyMs": 47}]}
    assert profile_hash(spec["profile"]) != status["plannedProfile"]["declaredHash"]
    assert adopted_profile(spec, status) is None


def test_a_hand_edited_planned_profile_is_ignored_not_crashed_on() -> None:
    status = {
        "plannedProfile": {
            "source": PlannedProfileSource.MEASURED,
            "points": [{"batchSize": "x"}],
            "declaredHash": "none",
        }
    }
    assert adopted_profile(SPEC, status) is None


def test_measured_plan_status_is_stable_between_reconciles() -> None:
    status = dict(profile_tick(body(SPEC), totals(), pods=1, now=T0).status)
    d = desired_state(SPEC, adopted_profile(SPEC, status))
    wanted = desired_status(body(SPEC, status), d, {"status": {"replicas": 1, "readyReplicas": 1}}, now=T0)
    assert "plannedProfile" not in wanted  # written by the profiling pass only
    b2 = body(SPEC, {**status, **wanted})
    assert (
        changed_fields(b2["status"], desired_status(b2, d, {"status": {"replicas": 1, "readyReplicas": 1}}, now=T0 + 9))
        == {}
    )


def test_ready_pod_ips() -> None:
    def pod(uid: str, ip: str, ready: bool, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"uid": uid} | ({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})
        cond = [{"type": "Ready", "status": "True" if ready else "False"}]
        return {"metadata": meta, "status": {"podIP": ip, "conditions": cond}}

    pods = [
        pod("a", "127.1.0.2", True),
        pod("b", "127.1.0.3", False),
        pod("c", "", True),
        pod("d", "1.2.3.4", True, True),
    ]
    assert ready_pod_ips(pods) == [("a", "127.1.0.2")]


def test_unsorted_or_duplicate_hand_edited_points_are_not_adopted() -> None:
    for points in ([{"batchSize": 4, "latencyMs": 9}, {"batchSize": 2, "latencyMs": 8}],
                   [{"batchSize": 2, "latencyMs": 8}, {"batchSize": 2, "latencyMs": 9}],
                   [{"batchSize": 1, "latencyMs": -1}]):  # fmt: skip
        status = {"plannedProfile": {"source": PlannedProfileSource.MEASURED, "points": points, "declaredHash": "none"}}
        assert adopted_profile(SPEC, status) is None, points


def test_an_infeasible_measurement_is_not_adopted_and_said_once_per_interval() -> None:
    tick = profile_tick(body(SPEC), totals(alpha=500.0), pods=1, now=T0)  # l(1) = 506 ms > T = 180 ms
    assert not tick.replan
    assert set(tick.status) == {"measuredProfile"}
    assert tick.events[0][:2] == ("Warning", ReplanReason.MEASURED_PROFILE_INFEASIBLE)
    assert "measured profile not adopted" in tick.events[0][2]
    again = profile_tick(body(SPEC, dict(tick.status)), totals(alpha=500.0), pods=1, now=T0 + 15)
    assert (again.status, again.events) == ({}, ())


def test_min_replicas_zero_is_refused_by_field() -> None:
    """Issue 15 item 4: at 0 replicas nothing reports demand, so a model scaled to 0 never came back."""
    spec = copy.deepcopy(SPEC) | {"scaling": {"minReplicas": 0}}
    with pytest.raises(SpecError, match=r"spec\.scaling\.minReplicas=0: minReplicas must be at least 1: at 0"):
        desired_state(spec)


def test_editing_the_declared_profile_does_not_restart_the_replan_interval() -> None:
    """A measurement adopted at T0; at T0 + 10 s the user declares a profile that the measurement contradicts:
    the declared profile is served, and the measurement may replace it only once the interval has passed."""
    status = dict(profile_tick(body(SPEC), totals(), pods=1, now=T0).status)
    since = status["plannedProfile"]["since"]
    spec = copy.deepcopy(SPEC) | {"profile": [{"batchSize": 1, "latencyMs": 20}, {"batchSize": 8, "latencyMs": 40}]}
    d = desired_state(spec, adopted_profile(spec, status))
    assert d.profile_source == PlannedProfileSource.DECLARED
    wanted = desired_status(body(spec, status), d, None, now=T0 + 10)
    assert wanted["plannedProfile"]["source"] == PlannedProfileSource.DECLARED
    assert wanted["plannedProfile"]["since"] == since  # kept across the source change
    status = {**status, **wanted}
    early = profile_tick(body(spec, status), totals(), pods=1, now=T0 + 30)
    assert (early.replan, early.reason) == (False, ReplanReason.REPLAN_INTERVAL_NOT_ELAPSED)
    late = profile_tick(body(spec, status), totals(), pods=1, now=T0 + 61)
    assert (late.replan, late.reason) == (True, ReplanReason.PROFILE_DISAGREES)
    assert "declared 20 ms, measured 46 ms" in late.status["plannedProfile"]["message"]


def _deployment(config_hash: str) -> dict[str, Any]:
    return {"spec": {"template": {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: config_hash}}}}}


def test_children_that_do_not_serve_the_handled_spec_are_drift() -> None:
    first_plan = desired_state(SPEC)
    first = desired_status(body(SPEC), first_plan, None, now=T0 - 60)  # the first plan, reconciled
    served = _deployment(first_plan.config_hash)
    assert children_drift(served, first_plan, first) == ""
    assert "missing" in children_drift(None, first_plan, first)
    assert "carry config abc" in children_drift(_deployment("abc"), first_plan, first)
    # a measurement adopted in status, then the API failed before the children were applied
    status = {**first, **profile_tick(body(SPEC), totals(), pods=1, now=T0).status}
    d = desired_state(SPEC, adopted_profile(SPEC, status))
    assert d.config_hash == first_plan.config_hash  # here the same config.pbtxt; the capacity is new
    assert "status.plan" in children_drift(served, d, status)
    reconciled = {**status, **desired_status(body(SPEC, status), d, None, now=T0 + 1)}
    assert children_drift(_deployment(d.config_hash), d, reconciled) == ""
    assert "status.plan" in children_drift(_deployment(d.config_hash), d, status)


def test_a_replan_may_choose_a_larger_batch_than_the_plan_it_replaces() -> None:
    """The running plan batches at most 2, so only sizes 1 and 2 are measured; the measurement still extends to
    the model's limit (here the declared profile's largest size, 16), so a faster model can batch more."""
    slow = [{"batchSize": b, "latencyMs": 2 * (40 + 6 * b)} for b in (1, 2, 4, 8, 16)]
    spec = copy.deepcopy(SPEC) | {"profile": slow, "sla": {"latencyP99Ms": 200, "networkOverheadMs": 20}}
    del spec["batching"]
    declared = desired_state(spec)
    assert declared.plan_status.maxBatchSize <= 2
    tick = profile_tick(body(spec), totals(sizes=(1, 2)), pods=1, now=T0)
    assert (tick.replan, tick.reason) == (True, ReplanReason.PROFILE_DISAGREES)
    points = tick.status["plannedProfile"]["points"]
    assert [p["batchSize"] for p in points] == [1, 2, 16]
    assert points[-1]["executions"] == 0  # extended by the fitted line
    replanned = desired_state(spec, adopted_profile(spec, tick.status))
    assert replanned.plan_status.maxBatchSize > declared.plan_status.maxBatchSize


def test_one_measured_size_never_replaces_a_declared_profile() -> None:
    """Low traffic forms only batches of 1: the disagreement is reported, but adopting that one point would pin
    the plan to batch size 1 for good (Triton then never forms a larger batch to measure)."""
    slow = [{"batchSize": b, "latencyMs": 2 * (40 + 6 * b)} for b in (1, 2, 4, 8, 16)]
    spec = copy.deepcopy(SPEC) | {"profile": slow}
    del spec["batching"]
    one = profile_tick(body(spec), totals(sizes=(1,)), pods=1, now=T0)
    assert (one.replan, one.reason) == (False, ReplanReason.AWAITING_MEASUREMENT)
    assert set(one.status) == {"measuredProfile"}  # shown next to the declared profile, not adopted
    two = profile_tick(body(spec), totals(sizes=(1, 2)), pods=1, now=T0)
    assert (two.replan, two.reason) == (True, ReplanReason.PROFILE_DISAGREES)
