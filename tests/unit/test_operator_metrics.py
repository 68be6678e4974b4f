"""The operator's gauges an external autoscaler scales on (README "Keeping your autoscaler"): the recommended
replicas in every scaling.mode, and none while the load is not measurable."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from batchfill.adapters import operator_metrics
from batchfill.api.reasons import ScalingReason
from batchfill.policy.scaling import Decision
from batchfill.policy.signals import ModelSignals, SignalState

LABELS = {"namespace": "recipe", "name": "m"}
OK = ModelSignals(SignalState.OK, pods=3, request_rate_rps=60.0, batch_fill=0.5, queue_time_ms=1.0, p99_ms=10.0)


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    yield
    operator_metrics.forget(LABELS["namespace"], LABELS["name"])


def tick(decision: Decision, signals: ModelSignals = OK) -> None:
    operator_metrics.observe_tick(
        LABELS["namespace"], LABELS["name"], decision=decision, signals=signals, replicas=decision.current_replicas,
        ready=decision.current_replicas, capacity_rps=31.9, server_budget_ms=450.0, gpus_per_replica=1,
        elapsed_s=0.0,
    )  # fmt: skip


def sample(metric: str) -> float | None:
    return operator_metrics.REGISTRY.get_sample_value(metric, LABELS)


def test_off_exports_the_recommendation_while_desired_is_the_current_count() -> None:
    # decide() in Off: desired = current (3), the load-proportional recommendation (5) kept
    tick(Decision(3, 3, 5, ScalingReason.SCALING_OFF, "scaling.mode Off: keeping 3 (would be 5)", ()))
    assert sample("batchfill_desired_replicas") == 3
    assert sample("batchfill_recommended_replicas") == 5
    assert sample("batchfill_capacity_per_replica") == 31.9
    assert sample("batchfill_replicas") == 3


def test_recommendation_series_goes_when_the_load_is_unknown_and_with_the_model() -> None:
    tick(Decision(3, 3, 5, ScalingReason.SCALING_OFF, "", ()))
    unknown = ModelSignals(SignalState.UNKNOWN, pods=0)
    tick(Decision(3, 3, None, ScalingReason.SCALING_OFF, "", ()), unknown)
    assert sample("batchfill_recommended_replicas") is None, "a stale count an autoscaler would act on"
    assert sample("batchfill_desired_replicas") == 3
    tick(Decision(1, 1, 0, ScalingReason.SCALING_OFF, "", ()))  # idle: a measured 0, not unknown
    assert sample("batchfill_recommended_replicas") == 0
    operator_metrics.forget(LABELS["namespace"], LABELS["name"])
    assert sample("batchfill_recommended_replicas") is None


def test_a_scaling_tick_in_off_exports_what_auto_would_scale_to() -> None:
    """The controller's tick in Off under a load of 1.5 replicas' worth (70 req/s over u x C = 0.8 x 58.4): the
    recommendation is 2, the desired count stays the current 1 and no replica is written."""
    from .test_controller_loops import HIGH, NS, SCALING_SPEC, T0, FakeKube, FakePrometheus, planned_model, scaling_loop

    kube = FakeKube()
    pods = planned_model(kube, "off", SCALING_SPEC, mode="Off")
    prom = FakePrometheus()
    prom.serve(pods, **HIGH)
    try:
        scaling_loop(kube, prom).tick(T0)
        labels = {"namespace": NS, "name": "off"}
        value = operator_metrics.REGISTRY.get_sample_value
        assert value("batchfill_recommended_replicas", labels) == 2  # ceil(70 / 46.72)
        assert value("batchfill_desired_replicas", labels) == 1
        assert value("batchfill_capacity_per_replica", labels) == 58.4
        assert not [c for c in kube.calls if c[0] == "scale_deployment"]
    finally:
        operator_metrics.forget(NS, "off")
