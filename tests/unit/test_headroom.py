"""The rate variability and the target utilization in effect (policy/headroom.py): exact values and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfill.policy.headroom import (
    MIN_RATE_CHANGES,
    RATE_CHANGE_HORIZON_S,
    RATE_CHANGE_LAG_S,
    RATE_CHANGE_STEP_S,
    effective_target_utilization,
    fill_at_utilization,
    rate_change_rms,
)

NOW = 100_000


def series(rate_at: dict[int, float] | None = None, minutes: int = 40, base: float = 100.0) -> dict[int, float]:
    """A rate every 15 s for ``minutes`` up to NOW; ``rate_at`` overrides single times."""
    out = {NOW - k * RATE_CHANGE_STEP_S: base for k in range(minutes * 4 + 1)}
    out.update(rate_at or {})
    return out


def test_a_constant_rate_does_not_vary() -> None:
    assert rate_change_rms(series(), NOW) == (0.0, RATE_CHANGE_HORIZON_S // RATE_CHANGE_STEP_S)


def test_alternating_minutes_give_the_log_ratio() -> None:
    """Rates alternating 100 / 110 each minute, read at whole minutes only (every 4th step): every change is
    ln 1.1 in one direction or the other."""
    rates = {NOW - 60 * k: 110.0 if k % 2 else 100.0 for k in range(41)}
    rms, n = rate_change_rms(rates, NOW)
    assert n == 30 < MIN_RATE_CHANGES
    assert rms is None
    dense = {t: 110.0 if ((NOW - t) // 60) % 2 else 100.0 for t in series()}
    rms, n = rate_change_rms(dense, NOW)
    assert n == 120
    assert rms == pytest.approx(math.log(1.1))


def test_zero_nan_and_missing_rates_are_not_changes() -> None:
    idle = series(base=0.0)
    assert rate_change_rms(idle, NOW) == (None, 0)
    holes = series({NOW - 15 * k: math.nan for k in range(0, 120, 2)} | {NOW - 15 * 1: math.inf})
    rms, n = rate_change_rms(holes, NOW)
    assert rms is None
    assert n < MIN_RATE_CHANGES


def test_only_the_horizon_counts() -> None:
    # at the horizon's open end a rate is only the earlier end of changes that are in it
    assert rate_change_rms(series({NOW - RATE_CHANGE_HORIZON_S: 1000.0}), NOW)[0] != 0.0
    old_spike = series({NOW - RATE_CHANGE_HORIZON_S - RATE_CHANGE_LAG_S: 1000.0})
    assert rate_change_rms(old_spike, NOW)[0] == 0.0
    young_spike = series({NOW - RATE_CHANGE_HORIZON_S + RATE_CHANGE_STEP_S: 1000.0})
    rms, n = rate_change_rms(young_spike, NOW)
    # the spike is one change up (t) and, a lag later, one change down
    assert rms == pytest.approx(math.sqrt(2 * math.log(10) ** 2 / n))


@pytest.mark.parametrize(
    ("u", "u_max", "rms", "expected"),
    [
        (0.85, 0.95, None, 0.85),
        (0.85, 0.95, math.nan, 0.85),
        (0.85, 0.95, -0.1, 0.85),
        (0.85, 0.95, 0.0, 0.95),
        (0.85, 0.95, 0.05, math.exp(-0.1)),  # 0.905: two minutes' change of 5 %
        (0.85, 0.95, 0.1, 0.85),  # exp(-0.2) = 0.82: noisier keeps u
        (0.85, 0.85, 0.0, 0.85),
        (0.85, 0.5, 0.0, 0.85),
        (0.97, 0.95, 0.0, 0.97),
        (0.5, 1.0, 0.0, 1.0),
    ],
)
def test_effective_target_utilization(u: float, u_max: float, rms: float | None, expected: float) -> None:
    assert effective_target_utilization(u, u_max, rms) == pytest.approx(expected)


@settings(max_examples=300, deadline=None)
@given(
    u=st.floats(0.01, 1),
    u_max=st.floats(0.01, 1),
    a=st.floats(0, 10),
    b=st.floats(0, 10),
)
def test_property_bounded_and_more_variability_never_less_headroom(u: float, u_max: float, a: float, b: float) -> None:
    ua, ub = effective_target_utilization(u, u_max, a), effective_target_utilization(u, u_max, b)
    assert u <= ua <= max(u, u_max) <= 1
    if a <= b:
        assert ua >= ub


def test_fill_at_utilization() -> None:
    assert fill_at_utilization(0.3, 8, 0.8, 0.8) == pytest.approx(0.3)
    assert fill_at_utilization(0.3, 8, 0.8, 0.95) == pytest.approx((1 + 1.4 * 0.95 / 0.8) / 8)
    assert fill_at_utilization(0.9, 8, 0.5, 1.0) == 1.0  # clipped
    assert fill_at_utilization(0.3, 0, 0.8, 0.95) == 0.3  # no batching
    assert fill_at_utilization(0.3, 8, 0.0, 0.95) == 0.3
    # a fill below one sample a batch (no plan makes one) moves to one sample, never to 0 (a divisor in decide)
    assert fill_at_utilization(0.25, 2, 0.5, 1.0) == 0.5


def test_fill_between_two_simulated_points_is_their_chord() -> None:
    """tests/cluster/test_calm_headroom.py's plan: 0.175 at 0.8·C and 0.221 at 0.95·C, B 16. The proportional model
    alone gives (1 + 1.8·0.95/0.8)/16 = 0.196 at 0.95, which a real replica reached at 0.89·C."""
    upper = (0.95, 0.221)
    assert fill_at_utilization(0.175, 16, 0.8, 0.95) == pytest.approx(0.196, abs=5e-4)
    assert fill_at_utilization(0.175, 16, 0.8, 0.95, upper=upper) == pytest.approx(0.221)
    assert fill_at_utilization(0.175, 16, 0.8, 0.875, upper=upper) == pytest.approx(0.198)
    assert fill_at_utilization(0.175, 16, 0.8, 0.8, upper=upper) == pytest.approx(0.175)
    # beyond the upper point: the proportional model from it (samples beyond the first: 2.536 at 0.95)
    assert fill_at_utilization(0.175, 16, 0.8, 1.0, upper=upper) == pytest.approx((1 + 2.536 * 1.0 / 0.95) / 16)
    # below the lower point: from the lower one, as without the upper point
    assert fill_at_utilization(0.175, 16, 0.8, 0.6, upper=upper) == fill_at_utilization(0.175, 16, 0.8, 0.6)


@pytest.mark.parametrize(
    "upper",
    [(0.8, 0.3), (0.7, 0.3), (0.95, math.nan), (0.95, math.inf), (0.95, 0.1), (0.95, 1.5)],
    ids=["same-utilization", "lower-utilization", "nan", "inf", "fill-below-the-lower-point", "fill-above-1"],
)
def test_an_upper_point_that_cannot_be_a_higher_fill_is_ignored(upper: tuple[float, float]) -> None:
    assert fill_at_utilization(0.175, 16, 0.8, 0.9, upper=upper) == fill_at_utilization(0.175, 16, 0.8, 0.9)
