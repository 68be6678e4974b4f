"""Cost per model on a shared pod (batchfill.policy.cost) and its export (operator_metrics.observe_cost), and GPU-hours
counted in units of the configured GPU resource (a MIG slice is a unit)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from batchfill.adapters import operator_metrics
from batchfill.api.reasons import ScalingReason
from batchfill.policy import cost
from batchfill.policy.cost import ExecutionCounters, add_splits, split_gpu_time
from batchfill.policy.scaling import Decision
from batchfill.policy.signals import ModelSignals, SignalState

NS = "cost-test"


def c(infer_us: float, input_us: float = 0.0, output_us: float = 0.0) -> ExecutionCounters:
    return ExecutionCounters(compute_input_us=input_us, compute_infer_us=infer_us, compute_output_us=output_us)


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    yield
    for name in ("a", "b", "mig"):
        operator_metrics.forget(NS, name)


def test_split_by_execution_time_input_infer_and_output_counted() -> None:
    before = {"a": c(1_000_000), "b": c(0)}
    # a: +3 s of infer; b: +0.5 s infer + 0.25 s input + 0.25 s output = 1 s
    after = {"a": c(4_000_000), "b": c(500_000, 250_000, 250_000)}
    split = split_gpu_time(3600.0, before, after)
    assert split.reason == cost.SPLIT_BY_EXECUTION
    assert split.gpu_seconds == {"a": 2700.0, "b": 900.0}
    assert split.unattributed_gpu_seconds == 0.0
    assert split.execution_us == {"a": 3_000_000, "b": 1_000_000}


def test_a_reset_counter_counts_from_zero_and_a_new_model_from_its_first_sample() -> None:
    before = {"a": c(9_000_000)}
    after = {"a": c(1_000_000), "b": c(3_000_000)}  # a reloaded (reset to 0, then 1 s); b loaded in the interval
    split = split_gpu_time(400.0, before, after)
    assert split.gpu_seconds == {"a": 100.0, "b": 300.0}


def test_an_idle_interval_is_split_evenly_among_the_loaded_models() -> None:
    same = {"a": c(5), "b": c(7)}
    split = split_gpu_time(60.0, same, same)
    assert (split.reason, split.gpu_seconds) == (cost.SPLIT_IDLE_EVENLY, {"a": 30.0, "b": 30.0})


@pytest.mark.parametrize(
    ("before", "after", "reason"),
    [
        ({"a": c(1), "b": c(1)}, {"a": c(5)}, cost.UNATTRIBUTED_UNLOADED),  # b's series went: its time unknown
        ({}, {}, cost.UNATTRIBUTED_NO_MODEL),
        ({"a": c(1)}, {"a": c(math.nan)}, cost.UNATTRIBUTED_UNKNOWN_COUNTER),
        ({"a": c(math.inf)}, {"a": c(5)}, cost.UNATTRIBUTED_UNKNOWN_COUNTER),
        ({}, {"a": c(5), "b": c(-1)}, cost.UNATTRIBUTED_UNKNOWN_COUNTER),
    ],
)
def test_unknowns_leave_the_whole_interval_unattributed(
    before: dict[str, ExecutionCounters], after: dict[str, ExecutionCounters], reason: str
) -> None:
    split = split_gpu_time(120.0, before, after)
    assert (split.reason, dict(split.gpu_seconds), split.unattributed_gpu_seconds) == (reason, {}, 120.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_pod_gpu_seconds_is_an_error(bad: float) -> None:
    with pytest.raises(ValueError, match="pod_gpu_seconds"):
        split_gpu_time(bad, {}, {"a": c(1)})


def test_splits_add_up_over_pods() -> None:
    pod1 = split_gpu_time(100.0, {}, {"a": c(1), "b": c(3)})
    pod2 = split_gpu_time(50.0, {"a": c(1)}, {"a": c(math.nan)})
    per_model, unattributed = add_splits([pod1, pod2])
    assert per_model == {"a": 25.0, "b": 75.0}
    assert unattributed == 50.0
    assert sum(per_model.values()) + unattributed == 150.0


def _sample(metric: str, **labels: str) -> float | None:
    return operator_metrics.REGISTRY.get_sample_value(metric, labels)


def test_observe_cost_exports_hours_share_and_the_unattributed_rest() -> None:
    pool = "p-share"
    operator_metrics.observe_cost(NS, pool, [split_gpu_time(3600.0, {}, {"a": c(3), "b": c(1)})])
    assert _sample("batchfill_model_gpu_hours_total", namespace=NS, name="a") == pytest.approx(0.75)
    assert _sample("batchfill_model_gpu_hours_total", namespace=NS, name="b") == pytest.approx(0.25)
    assert _sample("batchfill_model_gpu_share", namespace=NS, name="a") == pytest.approx(0.75)
    unknown = split_gpu_time(1800.0, {"a": c(1)}, {"a": c(math.nan)})
    operator_metrics.observe_cost(NS, pool, [split_gpu_time(1800.0, {}, {"a": c(1)}), unknown])
    assert _sample("batchfill_model_gpu_hours_total", namespace=NS, name="a") == pytest.approx(1.25)
    assert _sample("batchfill_model_gpu_share", namespace=NS, name="a") is None, "no share on a partial split"
    unattributed = _sample(
        "batchfill_pool_unattributed_gpu_hours_total", namespace=NS, pool=pool, reason=cost.UNATTRIBUTED_UNKNOWN_COUNTER
    )
    assert unattributed == pytest.approx(0.5)
    operator_metrics.forget(NS, "a")
    assert _sample("batchfill_model_gpu_hours_total", namespace=NS, name="a") is None


def test_gpu_hours_count_units_of_the_configured_resource() -> None:
    """Two replicas of two MIG slices each for half an hour: 2 slice-hours, and the unit is named."""
    mig = "nvidia.com/mig-1g.10gb"
    signals = ModelSignals(SignalState.OK, pods=2, request_rate_rps=1.0, batch_fill=0.1, queue_time_ms=1, p99_ms=2)
    decision = Decision(2, 2, 2, ScalingReason.SCALING_OFF, "", ())
    for elapsed in (0.0, 1800.0):
        operator_metrics.observe_tick(
            NS, "mig", decision=decision, signals=signals, replicas=2, ready=2, capacity_rps=10.0,
            server_budget_ms=50.0, gpus_per_replica=2, elapsed_s=elapsed, gpu_holding_replicas=2, gpu_resource=mig,
        )  # fmt: skip
    assert _sample("batchfill_gpu_hours_total", namespace=NS, name="mig") == pytest.approx(2.0)
    assert _sample("batchfill_gpu_resource", namespace=NS, name="mig", resource=mig) == 2
    operator_metrics.observe_tick(
        NS, "mig", decision=decision, signals=signals, replicas=2, ready=2, capacity_rps=10.0, server_budget_ms=50.0,
        gpus_per_replica=1, elapsed_s=0.0, gpu_holding_replicas=2,
    )  # fmt: skip
    assert _sample("batchfill_gpu_resource", namespace=NS, name="mig", resource=mig) is None
    assert _sample("batchfill_gpu_resource", namespace=NS, name="mig", resource="nvidia.com/gpu") == 1
