"""The profile fitted from Triton's batch_stats and the replan rule (policy/profile_fit.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfill.api.reasons import ReplanReason
from batchfill.api.spec import ProfilePoint
from batchfill.policy.profile import LatencyProfile
from batchfill.policy.profile_fit import BatchTotals, FittedPoint, decide_replan, fit_profile, largest_disagreement


def totals(**by_size: tuple[int, float]) -> list[BatchTotals]:
    """b<size>=(executions, mean ms) -> BatchTotals."""
    return [BatchTotals(int(k[1:]), n, round(n * ms * 1e6)) for k, (n, ms) in by_size.items()]


def test_means_of_sizes_with_enough_executions() -> None:
    got = fit_profile(totals(b1=(200, 12.0), b2=(150, 14.0), b3=(5, 99.0)), min_executions=100)
    assert got == [FittedPoint(1, 12.0, 200), FittedPoint(2, 14.0, 150)]


def test_totals_of_one_size_from_several_pods_are_summed_before_dividing() -> None:
    # pod A: 100 runs at 10 ms, pod B: 300 runs at 14 ms -> 13 ms, not the 12 ms mean of means
    got = fit_profile([BatchTotals(4, 100, 10**9), BatchTotals(4, 300, 300 * 14 * 10**6)], min_executions=10)
    assert got == [FittedPoint(4, 13.0, 400)]


def test_garbage_is_ignored_not_divided() -> None:
    bad = [BatchTotals(0, 10, 10**7), BatchTotals(2, 0, 0), BatchTotals(3, -5, 10**7), BatchTotals(5, 10, 0)]
    assert fit_profile(bad, min_executions=1) == []


def test_a_line_extends_the_profile_to_the_planned_maximum() -> None:
    # exact line 10 + 2 b measured at 1, 2, 4
    got = fit_profile(totals(b1=(300, 12.0), b2=(200, 14.0), b4=(100, 18.0)), min_executions=50, up_to=16)
    assert got[-1].extrapolated
    assert got[-1].executions == 0
    assert got[-1].batch_size == 16
    assert got[-1].latency_ms == pytest.approx(42.0)


def test_no_extrapolation_from_one_size_or_below_the_largest_measured() -> None:
    assert [p.batch_size for p in fit_profile(totals(b1=(300, 12.0)), min_executions=50, up_to=8)] == [1]
    got = fit_profile(totals(b1=(300, 12.0), b8=(100, 40.0)), min_executions=50, up_to=8)
    assert not any(p.extrapolated for p in got)


def test_a_falling_measurement_extrapolates_flat_never_below_the_largest_mean() -> None:
    got = fit_profile(totals(b1=(300, 15.0), b2=(300, 14.0)), min_executions=50, up_to=8)
    assert got[-1].latency_ms == pytest.approx(14.5)  # slope clipped to 0: the weighted mean ...
    got = fit_profile(totals(b1=(10, 15.0), b2=(1000, 14.0)), min_executions=5, up_to=8)
    assert got[-1].latency_ms >= 14.0  # ... and never below the largest measured size's mean


@settings(max_examples=200, deadline=None)
@given(
    alpha=st.floats(0.1, 100),
    beta=st.floats(0, 20),
    sizes=st.lists(st.integers(1, 32), min_size=2, max_size=6, unique=True),
    up_to=st.integers(33, 128),
)
def test_extrapolation_of_an_exact_line_is_exact(alpha: float, beta: float, sizes: list[int], up_to: int) -> None:
    data = [BatchTotals(b, 100, round(100 * (alpha + beta * b) * 1e6)) for b in sizes]
    got = fit_profile(data, min_executions=1, up_to=up_to)
    assert got[-1].latency_ms == pytest.approx(alpha + beta * up_to, rel=1e-6, abs=1e-4)


DECLARED = LatencyProfile.from_points(
    [ProfilePoint(batchSize=1, latencyMs=10), ProfilePoint(batchSize=8, latencyMs=50)]
)


def test_largest_disagreement_interpolates_the_declared_profile() -> None:
    d = largest_disagreement(DECLARED, [FittedPoint(1, 10.5, 100), FittedPoint(4, 33.0, 100)])
    assert d is not None
    assert (d.batch_size, d.declared_ms, d.measured_ms) == (4, pytest.approx(10 + 40 * 3 / 7), 33.0)


def test_extrapolated_and_out_of_range_points_are_not_compared() -> None:
    assert largest_disagreement(DECLARED, [FittedPoint(16, 99.0, 0, True), FittedPoint(9, 60.0, 100)]) is None


def decide(**kw: object) -> tuple[bool, str, str]:
    args: dict[str, object] = {
        "declared": DECLARED,
        "measured": [FittedPoint(1, 10.2, 500), FittedPoint(8, 56.0, 100)],
        "adopted": None,
        "tolerance": 0.15,
        "interval_s": 900.0,
        "last_replan_s": None,
        "now_s": 10_000.0,
    }
    args.update(kw)
    d = decide_replan(**args)  # type: ignore[arg-type]
    return d.replan, d.reason, d.message


def test_declared_profile_within_tolerance_is_kept() -> None:
    replan, reason, message = decide()
    assert (replan, reason) == (False, ReplanReason.PROFILE_AGREES)
    assert message == "batch 8: declared 50 ms, measured 56 ms (+12.0%, tolerance ±15%)"


def test_declared_profile_beyond_tolerance_is_replanned_with_old_and_new_values() -> None:
    replan, reason, message = decide(measured=[FittedPoint(8, 60.0, 100)])
    assert (replan, reason) == (True, ReplanReason.PROFILE_DISAGREES)
    assert message == "batch 8: declared 50 ms, measured 60 ms (+20.0%, tolerance ±15%)"


def test_faster_than_declared_also_counts() -> None:
    assert decide(measured=[FittedPoint(8, 40.0, 100)])[:2] == (True, ReplanReason.PROFILE_DISAGREES)


def test_at_most_one_replan_per_interval() -> None:
    replan, reason, _ = decide(measured=[FittedPoint(8, 80.0, 100)], last_replan_s=9_500.0)
    assert (replan, reason) == (False, ReplanReason.REPLAN_INTERVAL_NOT_ELAPSED)
    assert decide(measured=[FittedPoint(8, 80.0, 100)], last_replan_s=9_000.0)[0]


def test_without_a_declared_profile_the_first_measurement_is_adopted() -> None:
    replan, reason, message = decide(declared=None)
    assert (replan, reason) == (True, ReplanReason.PROFILE_MEASURED)
    assert "1: 10.2 ms" in message


def test_after_adoption_the_adopted_profile_is_the_reference() -> None:
    adopted = [FittedPoint(1, 10.2, 500), FittedPoint(8, 58.0, 100)]
    assert decide(declared=None, adopted=adopted)[:2] == (False, ReplanReason.PROFILE_AGREES)
    assert decide(declared=None, adopted=adopted, measured=[FittedPoint(8, 70.0, 100)])[:2] == (
        True,
        ReplanReason.PROFILE_DISAGREES,
    )


def test_nothing_measured_waits() -> None:
    assert decide(measured=[])[:2] == (False, ReplanReason.AWAITING_MEASUREMENT)
    assert decide(measured=[FittedPoint(16, 80.0, 0, True)])[:2] == (False, ReplanReason.AWAITING_MEASUREMENT)


def test_a_first_adoption_waits_for_two_sizes_when_the_plan_can_batch() -> None:
    one = [FittedPoint(1, 10.2, 500)]
    assert decide(declared=None, measured=one, min_sizes=2)[:2] == (False, ReplanReason.AWAITING_MEASUREMENT)
    assert decide(declared=None, measured=[*one, FittedPoint(2, 12.0, 100)], min_sizes=2)[0]
    assert decide(declared=None, measured=one, min_sizes=1)[0]  # a model that cannot batch
    assert decide(measured=one, min_sizes=2)[:2] == (
        False,
        ReplanReason.PROFILE_AGREES,
    )  # a declared profile compares at once
