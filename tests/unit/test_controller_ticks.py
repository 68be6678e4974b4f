"""The pure parts of the loops' ticks: the profile's counter deltas, the unreadable-pods bookkeeping, the scaling
decision as a function of its inputs and memory, and the controller modules that must stay free of I/O."""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import batchfill.controller
from batchfill.adapters.pod_stats import PodBatchStats, PodStatsError
from batchfill.api.reasons import ConditionReason, ConditionType, EventReason, ScalingReason, SignalsReason
from batchfill.controller.profiling import (
    UNREAD_WARNING_S,
    ProfileInputs,
    ProfilingMemory,
    counter_deltas,
    measure_profile,
    restarted,
)
from batchfill.controller.scaling import ScaleInputs, ScaleOutcome, ScalingMemory, decide_scale, planned_desired
from batchfill.policy.conditions import find
from batchfill.policy.profile_fit import BatchTotals
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.render.kube import CONFIG_HASH_ANNOTATION

T0 = 1_800_000_000.0
MS = 1_000_000  # ns


def stats(**batches: tuple[int, int]) -> PodBatchStats:
    """PodBatchStats as read_pod_batch_stats returns them: ``b4=(executions, total ms)`` -> {4: (n, ns)}."""
    return PodBatchStats({int(k[1:]): (n, ms * MS) for k, (n, ms) in batches.items()})


# -- counter deltas ----------------------------------------------------------------------------------------------


def test_a_pods_first_read_is_its_baseline_and_counts_nothing() -> None:
    first = stats(b1=(5, 230))
    out = counter_deltas({}, ["a"], {"a": first})
    assert (out.baselines, out.totals, out.pods) == ({"a": first}, (), 0)


def test_deltas_are_counted_from_the_baseline_and_summed_over_pods() -> None:
    base = {"a": stats(b1=(5, 230)), "b": stats(b1=(10, 460), b2=(1, 52))}
    now = {"a": stats(b1=(25, 1150), b2=(4, 208)), "b": stats(b1=(30, 1380), b2=(11, 572))}
    out = counter_deltas(base, ["a", "b"], now)
    assert out.pods == 2
    # b=1: (25-5) + (30-10) executions, (1150-230) + (1380-460) ms; b=2 appeared on a after its baseline: from 0
    assert out.totals == (BatchTotals(1, 40, 1840 * MS), BatchTotals(2, 14, 728 * MS))
    assert out.baselines == base, "the baselines stay: totals are always since each pod's first read"


def test_a_triton_restart_resets_the_baseline_instead_of_counting_negative_executions() -> None:
    base = {"a": stats(b1=(500, 23_000), b2=(100, 5_200))}
    after_restart = stats(b1=(600, 27_600), b2=(3, 156))  # b=2 fell: another process's counters
    assert restarted(base["a"], after_restart)
    out = counter_deltas(base, ["a"], {"a": after_restart})
    assert (out.baselines, out.totals, out.pods) == ({"a": after_restart}, (), 0)
    later = stats(b1=(620, 28_520), b2=(13, 676))
    assert counter_deltas(out.baselines, ["a"], {"a": later}).totals == (
        BatchTotals(1, 20, 920 * MS), BatchTotals(2, 10, 520 * MS))  # fmt: skip


def test_a_pod_that_disappears_loses_its_baseline_and_a_new_pod_starts_its_own() -> None:
    base = {"gone": stats(b1=(5, 230)), "stays": stats(b1=(5, 230))}
    out = counter_deltas(base, ["stays", "new"], {"stays": stats(b1=(15, 690)), "new": stats(b1=(900, 41_400))})
    assert set(out.baselines) == {"stays", "new"}
    assert out.baselines["new"] == stats(b1=(900, 41_400))
    assert (out.totals, out.pods) == ((BatchTotals(1, 10, 460 * MS),), 1), "the new pod's history is not a delta"


def test_a_ready_pod_whose_read_failed_keeps_its_baseline_and_is_not_counted() -> None:
    base = {"a": stats(b1=(5, 230)), "b": stats(b1=(5, 230))}
    out = counter_deltas(base, ["a", "b"], {"a": stats(b1=(15, 690))})
    assert out.baselines == base
    assert (out.totals, out.pods) == ((BatchTotals(1, 10, 460 * MS),), 1)


def test_counter_deltas_do_not_change_their_arguments() -> None:
    base = {"a": stats(b1=(5, 230)), "gone": stats(b1=(1, 46))}
    frozen = copy.deepcopy(base)
    counter_deltas(base, ["a", "new"], {"a": stats(b1=(1, 46)), "new": stats(b1=(2, 92))})
    assert base == frozen


# -- unreadable pods ---------------------------------------------------------------------------------------------

BODY: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ml", "uid": "u1", "generation": 1, "resourceVersion": "7"},
    "spec": {
        "model": {"name": "sleep", "backend": "python"},
        "sla": {"latencyP99Ms": 200, "networkOverheadMs": 20},
        "batching": {"maxBatchSize": 8},
        "profiling": {"replanIntervalSeconds": 600},
    },
    "status": {},
}


def refused(ip: str) -> PodStatsError:
    return PodStatsError(f"{ip}:8000: ConnectionRefusedError: [Errno 111] Connection refused")


def test_a_pod_turning_unreadable_is_noted_once_and_a_warning_needs_all_pods_silent_for_two_minutes() -> None:
    two = ProfileInputs("sleep", (("ua", "10.0.0.1"), ("ub", "10.0.0.2")), (refused("10.0.0.1"), stats(b1=(5, 230))))
    first = measure_profile(BODY, two, ProfilingMemory(), now=T0, port=8000)
    assert first.notes == ("statistics of ml/p pod 10.0.0.1 not read: 10.0.0.1:8000: ConnectionRefusedError: "
                           "[Errno 111] Connection refused",)  # fmt: skip
    assert (first.memory.unread, first.memory.unread_since, first.warnings) == (frozenset({"10.0.0.1"}), None, ())
    again = measure_profile(BODY, two, first.memory, now=T0 + 60, port=8000)
    assert again.notes == (), "noted when it turns unreadable, not every tick"

    none = ProfileInputs("sleep", two.pods, (refused("10.0.0.1"), refused("10.0.0.2")))
    ticks = [measure_profile(BODY, none, again.memory, now=T0 + 120, port=8000)]  # all silent from here
    since = T0 + 120
    for t in (since + UNREAD_WARNING_S - 1, since + UNREAD_WARNING_S, T0 + 720, since + UNREAD_WARNING_S + 600):
        ticks.append(measure_profile(BODY, none, ticks[-1].memory, now=t, port=8000))
    assert [len(t.warnings) for t in ticks] == [0, 0, 1, 0, 1], "after 120 s silent, then once per replan interval"
    assert ticks[0].memory.unread_since == T0 + 120
    assert ticks[2].warnings[0][:2] == ("Warning", EventReason.STATISTICS_UNAVAILABLE)


def test_a_spec_without_a_model_name_is_not_measured() -> None:
    body = copy.deepcopy(BODY)
    del body["spec"]["model"]["name"]
    memory = ProfilingMemory(unread=frozenset({"10.0.0.1"}), unread_since=T0)
    out = measure_profile(body, ProfileInputs(""), memory, now=T0 + 600, port=8000)
    assert (out.memory, out.warnings, out.tick.status) == (memory, (), {})


# -- the scaling decision ----------------------------------------------------------------------------------------

SCALING_BODY: dict[str, Any] = {
    "metadata": {"name": "m", "namespace": "ml", "uid": "u1", "generation": 1, "resourceVersion": "7"},
    "spec": {
        "model": {"name": "sleep", "backend": "python", "repository": {"pvc": {"claimName": "models"}}},
        "sla": {"latencyP99Ms": 200, "networkOverheadMs": 20},
        "profile": [{"batchSize": b, "latencyMs": 41 + 6.2 * b} for b in (1, 2, 4, 8, 16)],
        "scaling": {"minReplicas": 1, "maxReplicas": 3, "targetUtilization": 0.8, "mode": "Auto"},
    },
    "status": {
        "observedGeneration": 1,
        "conditions": [{"type": ConditionType.PLANNED, "status": "True", "reason": ConditionReason.PLANNED}],
    },
}


def scale_inputs(signals: ModelSignals, *, replicas: int = 1) -> ScaleInputs:
    desired = planned_desired(SCALING_BODY)
    assert desired is not None
    deployment = {
        "metadata": {"name": "m-triton", "namespace": "ml", "managedFields": []},
        "spec": {"replicas": replicas, "template": {"metadata": {"annotations": {
            CONFIG_HASH_ANNOTATION: desired.config_hash}}}},
        "status": {"replicas": replicas, "readyReplicas": 1},
    }  # fmt: skip
    pod = {"metadata": {"name": "m-triton-0"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    status = SCALING_BODY["status"] | {"plan": desired.plan_status.model_dump(mode="json", exclude_none=True)}
    return ScaleInputs(SCALING_BODY | {"status": status}, desired, False, None, deployment, (pod,), signals)


SATURATED = ModelSignals(state=SignalState.OK, pods=1, request_rate_rps=70.0, inference_rate_rps=70.0,
                         avg_batch_size=4.0, batch_fill=0.25, queue_time_ms=0.5, pending_requests=0.0)  # fmt: skip


def test_decide_scale_is_a_function_of_its_inputs_and_memory() -> None:
    inputs = scale_inputs(SATURATED)
    memory = ScalingMemory(last_tick=T0 - 15, holding=1)
    frozen = copy.deepcopy((inputs, memory))
    plan = decide_scale(inputs, memory, now=T0, interval_s=15.0)
    assert plan == decide_scale(inputs, memory, now=T0, interval_s=15.0)
    assert (inputs, memory) == frozen, "nothing it was given changed"
    assert plan.scale == ("m-triton", 2)
    assert plan.status["appliedReplicas"] == 2
    assert [e[1] for e in plan.events] == [ScalingReason.SCALE_OUT_SATURATED]
    assert plan.metrics is not None
    assert (plan.metrics.elapsed_s, plan.metrics.gpu_holding_replicas) == (15.0, 1)


def with_metrics_condition(inputs: ScaleInputs, status: str, reason: str) -> ScaleInputs:
    conditions = [{"type": ConditionType.METRICS_AVAILABLE, "status": status, "reason": reason,
                   "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z"}]  # fmt: skip
    body = inputs.body | {"status": inputs.body["status"] | {"conditions": conditions}}
    return dataclasses.replace(inputs, body=body)


@pytest.mark.parametrize("reason", [SignalsReason.NO_READY_PODS, SignalsReason.NO_SERIES])
def test_a_new_models_pods_not_scraped_yet_post_no_event_a_lost_scrape_does(reason: str) -> None:
    """The expected gap of a new model is in its MetricsAvailable condition only; losing metrics is an Event."""
    unknown = ModelSignals.unknown(reason, "no pod scraped yet")
    new = decide_scale(scale_inputs(unknown), ScalingMemory(), now=T0, interval_s=15.0)
    assert new.status["lastScaleReason"] == ScalingReason.HOLD_METRICS_UNKNOWN
    assert new.events == ()
    metrics = find(new.status["conditions"], ConditionType.METRICS_AVAILABLE)
    assert metrics is not None
    assert (metrics["status"], metrics["reason"]) == ("False", reason)

    had = with_metrics_condition(scale_inputs(unknown), "True", "SignalsOk")
    lost = decide_scale(had, ScalingMemory(), now=T0, interval_s=15.0)
    assert [(e[0], e[1]) for e in lost.events] == [("Normal", ScalingReason.HOLD_METRICS_UNKNOWN)]


def test_the_memory_kept_depends_on_whether_the_status_write_landed() -> None:
    memory = ScalingMemory(last_tick=T0 - 15, holding=1)
    plan = decide_scale(scale_inputs(SATURATED), memory, now=T0, interval_s=15.0)
    landed = plan.memory_after(ScaleOutcome(written=True))
    assert (landed.last_tick, landed.history[-1].replicas) == (T0, 2)
    assert plan.memory_after(ScaleOutcome(written=False)) == memory, "a lost race keeps the previous votes"
    assert not plan.memory_after(ScaleOutcome(written=True, monitor_gone=True)).monitored


def test_an_unknown_signal_holds_and_says_why_once() -> None:
    unknown = ModelSignals.unknown(SignalsReason.PROMETHEUS_UNAVAILABLE, "connection refused")
    plan = decide_scale(scale_inputs(unknown), ScalingMemory(), now=T0, interval_s=15.0)
    assert plan.scale is None
    assert plan.status["lastScaleReason"] == ScalingReason.HOLD_METRICS_UNKNOWN
    assert [(e[0], e[1]) for e in plan.events] == [("Warning", ScalingReason.HOLD_METRICS_UNKNOWN)]
    assert "observed" not in plan.status, "unknown is not zero: no status.observed values"


# -- no I/O in the pure modules ----------------------------------------------------------------------------------

PURE_MODULES = ("desired.py", "status.py", "pods.py", "configs.py", "rollout.py")
IO = ("batchfill.adapters", "kopf", "kubernetes", "tritonclient", "prometheus_client", "prometheus_api_client",
      "requests", "urllib3", "socket", "subprocess", "threading", "time", "logging")  # fmt: skip


@pytest.mark.parametrize("module", PURE_MODULES)
def test_the_plan_and_status_modules_import_no_io(module: str) -> None:
    path = Path(batchfill.controller.__file__).parent / module
    seen: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            seen.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            seen.add(node.module)
    assert sorted(m for m in seen if any(m == f or m.startswith(f + ".") for f in IO)) == []
    assert seen, "the check read the module"
