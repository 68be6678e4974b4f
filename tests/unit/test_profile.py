from __future__ import annotations

import pytest

from batchfill.api.spec import ProfilePoint
from batchfill.policy.profile import LatencyProfile


def prof(*pairs: tuple[int, float]) -> LatencyProfile:
    return LatencyProfile.from_points([ProfilePoint(batchSize=b, latencyMs=lat) for b, lat in pairs])


def test_linear_between_points_and_flat_below_the_first() -> None:
    p = prof((2, 10), (4, 28), (8, 50))
    assert p.latency_ms(1) == 10
    assert p.latency_ms(3) == 19
    assert p.latency_ms(6) == 39
    assert p.table(8)[1:] == [10, 10, 19, 28, 33.5, 39, 44.5, 50]


def test_never_extrapolated() -> None:
    p = prof((1, 10), (8, 50))
    with pytest.raises(ValueError, match="never extrapolated"):
        p.latency_ms(9)
    with pytest.raises(ValueError, match="never extrapolated"):
        p.table(9)


def test_noisy_profile_is_made_monotone_upwards() -> None:
    p = prof((1, 10), (4, 30), (8, 25))  # a faster batch of 8 is noise: planned as 30 ms
    assert p.latencies_ms == (10, 30, 30)
    assert p.latency_ms(6) == 30


def test_largest_within_budget() -> None:
    p = prof((1, 10), (4, 28), (8, 50))
    assert p.largest_within(45) == 7  # l(7) = 44.5
    assert p.largest_within(50) == 8
    assert p.largest_within(9.9) == 0
    assert p.largest_within(100, cap=5) == 5
