"""Seeded traces of the fleet simulator (sim.traces): rates, statistics, determinism, blocks and the rate file.

Statistical checks use fixed seeds and tolerances of at least 4 standard deviations, so they are deterministic
and would only fail on a real change of the generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfill.sim import traces
from batchfill.sim.traces import Trace


def _concat(trace: Trace, block_s: float) -> np.ndarray:
    parts = list(trace.blocks(block_s))
    return np.concatenate(parts) if parts else np.empty(0)


def _poisson_ok(count: int, expected: float, sigmas: float = 5.0) -> bool:
    return abs(count - expected) <= sigmas * math.sqrt(max(expected, 1.0)) + 1


# ---------------------------------------------------------------------------------------------------- diurnal


def test_diurnal_mean_rate_over_a_whole_period_is_mean_rps() -> None:
    # one compressed "day" of 3600 s at 50 req/s: 180,000 expected arrivals, sd 424 (0.24 %); tolerance 1.5 %
    trace = traces.diurnal(50.0, duration_s=3600.0, period_s=3600.0, peak_to_trough=5.0, seed=11)
    assert trace.mean_rps == pytest.approx(50.0, rel=1e-6), "nominal mean of the per-second rates"
    a = trace.arrivals()
    measured = len(a) / trace.duration_s
    assert measured == pytest.approx(50.0, rel=0.015), f"measured mean {measured:.3f} req/s, asked 50"


@pytest.mark.parametrize("ratio", [1.0, 2.0, 5.0, 10.0])
def test_diurnal_peak_over_trough_is_peak_to_trough(ratio: float) -> None:
    period = 86_400.0
    trace = traces.diurnal(100.0, peak_to_trough=ratio, peak_hour=14.0, period_s=period, seed=0)
    t = np.linspace(0.0, period, 86_401)
    r = trace.rate_at(t)
    peak_t = 14.0 / 24.0 * period
    peak, trough = float(trace.rate_at(np.array([peak_t]))[0]), float(trace.rate_at(np.array([peak_t + period / 2]))[0])
    assert peak / trough == pytest.approx(ratio, rel=1e-12), f"peak {peak} / trough {trough}"
    assert float(r.max()) == pytest.approx(peak, rel=1e-12), "the peak is at peak_hour"
    assert float(r.min()) == pytest.approx(trough, rel=1e-12), "the trough is half a period away"
    # the mean of the rate over a period is the mean asked for
    assert float(r[:-1].mean()) == pytest.approx(100.0, rel=1e-6)


def test_diurnal_rate_follows_the_squared_raised_cosine() -> None:
    trace = traces.diurnal(30.0, peak_to_trough=4.0, peak_hour=6.0, period_s=24.0, duration_s=24.0)
    trough = 30.0 / (1.0 + 3.0 * 3.0 / 8.0)
    # a quarter period from the peak: g = ((1 + cos(pi/2)) / 2)^2 = 1/4
    assert float(trace.rate_at(np.array([6.0 + 6.0]))[0]) == pytest.approx(trough * (1.0 + 3.0 / 4.0), rel=1e-12)


# ---------------------------------------------------------------------------------------------------- determinism

MAKERS: dict[str, Callable[[int], Trace]] = {
    "diurnal": lambda seed: traces.diurnal(20.0, duration_s=600.0, period_s=600.0, seed=seed),
    "bursty": lambda seed: traces.bursty(50.0, cv=4.0, duration_s=300.0, seed=seed),
    "spike": lambda seed: traces.spike(10.0, 80.0, start_s=100.0, length_s=60.0, duration_s=300.0, seed=seed),
    "replay": lambda seed: traces.replay([5.0, 0.0, 40.0, 12.5], seed=seed),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_same_seed_same_arrivals_other_seed_differs(kind: str) -> None:
    make = MAKERS[kind]
    a, b, c = make(7).arrivals(), make(7).arrivals(), make(8).arrivals()
    assert len(a) > 100, f"{kind}: too few arrivals ({len(a)}) for the check to mean anything"
    assert np.array_equal(a, b), f"{kind}: same seed gave different arrivals"
    assert not (len(a) == len(c) and np.array_equal(a, c)), f"{kind}: seeds 7 and 8 gave the same arrivals"
    # iterating the same trace object twice yields the same arrivals too
    t = make(7)
    assert np.array_equal(t.arrivals(), t.arrivals())


# ---------------------------------------------------------------------------------------------------- blocks

BLOCK_INVARIANT: dict[str, Trace] = {
    # 10,000 steps of 1 s: three 4096-step chunks, so chunk boundaries fall inside blocks
    "diurnal": traces.diurnal(5.0, duration_s=10_000.0, period_s=5_000.0, seed=3),
    "spike": traces.spike(20.0, 150.0, start_s=30.5, length_s=40.0, duration_s=200.0, seed=4),
    "replay": traces.replay([3.0, 30.0, 0.0, 7.0, 60.0], seed=5),
}


@pytest.mark.parametrize("kind", sorted(BLOCK_INVARIANT))
@pytest.mark.parametrize("block_s", [1.0, 7.0, 15.0, 45.0, 60.0, 1e6])
def test_block_length_does_not_change_the_draws(kind: str, block_s: float) -> None:
    trace = BLOCK_INVARIANT[kind]
    ref = _concat(trace, 60.0)
    got = _concat(trace, block_s)
    assert len(ref) > 0
    assert np.array_equal(got, ref), f"{kind}: blocks({block_s}) differ from blocks(60)"
    assert np.array_equal(_concat(trace, 15.0), ref), f"{kind}: blocks(15) differ from blocks(60)"


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    block_s=st.floats(0.25, 400.0, allow_nan=False),
    duration_s=st.floats(1.0, 500.0, allow_nan=False),
)
def test_spike_blocks_are_invariant_for_any_block_length(seed: int, block_s: float, duration_s: float) -> None:
    trace = traces.spike(5.0, 40.0, start_s=duration_s / 3, length_s=duration_s / 4, duration_s=duration_s, seed=seed)
    assert np.array_equal(_concat(trace, block_s), trace.arrivals())


def test_bursty_blocks_cut_one_stream_up_to_rounding() -> None:
    # the renewal trace draws one Gamma stream in order; block length changes only the summation order
    trace = traces.bursty(200.0, cv=2.0, duration_s=600.0, seed=9)
    a15, a60 = _concat(trace, 15.0), _concat(trace, 60.0)
    assert len(a15) == len(a60)
    np.testing.assert_allclose(a15, a60, rtol=0, atol=1e-9)


ALL_TRACES: dict[str, Trace] = {
    **BLOCK_INVARIANT,
    "bursty": traces.bursty(40.0, cv=4.0, duration_s=250.0, seed=1),
    "short-last-block": traces.spike(30.0, 30.0, start_s=0.0, length_s=10.0, duration_s=100.5, seed=2),
}


@pytest.mark.parametrize("kind", sorted(ALL_TRACES))
@pytest.mark.parametrize("block_s", [15.0, 60.0, 13.0])
def test_every_block_is_sorted_and_inside_its_interval(kind: str, block_s: float) -> None:
    trace = ALL_TRACES[kind]
    blocks = list(trace.blocks(block_s))
    assert len(blocks) == math.ceil(trace.duration_s / block_s), f"{kind}: one block per interval"
    for k, b in enumerate(blocks):
        lo, hi = k * block_s, min((k + 1) * block_s, trace.duration_s)
        assert np.all(np.diff(b) >= 0), f"{kind}: block {k} not sorted"
        if len(b):
            assert b[0] >= lo, f"{kind}: block {k} starts at {b[0]} before {lo}"
            assert b[-1] < hi, f"{kind}: block {k} ends at {b[-1]}, not before {hi}"


@pytest.mark.parametrize("block_s", [0.0, -15.0, math.nan, math.inf])
def test_bad_block_length_raises(block_s: float) -> None:
    with pytest.raises(ValueError, match="block_s"):
        traces.spike(1.0, 1.0, start_s=0.0, length_s=1.0, duration_s=10.0).blocks(block_s)


# ---------------------------------------------------------------------------------------------------- bursty


@pytest.mark.parametrize(("cv", "seed"), [(4.0, 0), (4.0, 1), (1.0, 2), (2.0, 3)])
def test_bursty_inter_arrival_cv_and_mean_rate(cv: float, seed: int) -> None:
    # 600 s at 1000 req/s: ~600,000 gaps. sd of the sample CV is ~0.7 % at cv 4 (Gamma kurtosis 6 cv^2);
    # sd of the count ~ sqrt(n) cv (0.5 % at cv 4). Tolerances: 5 % on the CV, 3 % on the rate.
    trace = traces.bursty(1000.0, cv=cv, duration_s=600.0, seed=seed)
    a = trace.arrivals()
    gaps = np.diff(a)
    measured_cv = float(gaps.std() / gaps.mean())
    rate = len(a) / trace.duration_s
    assert measured_cv == pytest.approx(cv, rel=0.05), f"inter-arrival CV {measured_cv:.3f}, asked {cv}"
    assert rate == pytest.approx(1000.0, rel=0.03), f"mean rate {rate:.1f} req/s, asked 1000"
    assert trace.mean_rps == 1000.0
    assert np.all(trace.rate_at(np.array([0.0, 100.0])) == 1000.0)


# ---------------------------------------------------------------------------------------------------- spike


def test_spike_rate_inside_and_outside_the_interval() -> None:
    trace = traces.spike(20.0, 200.0, start_s=100.0, length_s=50.0, duration_s=400.0, seed=6)
    a = trace.arrivals()
    inside = int(np.count_nonzero((a >= 100.0) & (a < 150.0)))
    outside = len(a) - inside
    assert _poisson_ok(inside, 200.0 * 50.0), f"{inside} arrivals in the spike, expected ~10000"
    assert _poisson_ok(outside, 20.0 * 350.0), f"{outside} arrivals outside, expected ~7000"
    assert trace.name == "spike"
    assert trace.mean_rps == pytest.approx((20.0 * 350.0 + 200.0 * 50.0) / 400.0)
    assert trace.rate_at(np.array([99.9, 100.0, 149.9, 150.0])).tolist() == [20.0, 200.0, 200.0, 20.0]


def test_spike_reaching_the_end_is_a_step() -> None:
    trace = traces.spike(10.0, 50.0, start_s=60.0, length_s=1e9, duration_s=120.0, seed=0)
    assert trace.name == "step"
    a = trace.arrivals()
    assert _poisson_ok(int(np.count_nonzero(a >= 60.0)), 50.0 * 60.0)
    assert _poisson_ok(int(np.count_nonzero(a < 60.0)), 10.0 * 60.0)


def test_zero_rate_spike_has_no_arrivals() -> None:
    assert len(traces.spike(0.0, 0.0, start_s=0.0, length_s=5.0, duration_s=50.0).arrivals()) == 0


# ---------------------------------------------------------------------------------------------------- replay


def test_replay_per_minute_counts_follow_the_rates() -> None:
    rates = [0.0, 10.0, 50.0, 5.0, 100.0, 0.5, 0.0, 25.0]
    trace = traces.replay(rates, seed=12)
    assert trace.duration_s == 60.0 * len(rates)
    assert trace.mean_rps == pytest.approx(float(np.mean(rates)))
    a = trace.arrivals()
    counts = np.bincount((a // 60.0).astype(np.int64), minlength=len(rates))
    assert len(counts) == len(rates), "no arrival past the last minute"
    for m, (r, c) in enumerate(zip(rates, counts.tolist(), strict=True)):
        if r == 0:
            assert c == 0, f"minute {m}: rate 0 but {c} arrivals"
        else:
            assert _poisson_ok(c, 60.0 * r), f"minute {m}: {c} arrivals at {r} req/s (expected {60 * r:g})"
    assert trace.rate_at(np.array([0.0, 61.0, 179.9, 1e6])).tolist() == [0.0, 10.0, 50.0, 25.0]


@pytest.mark.parametrize(
    ("rates", "match"),
    [
        ([], "at least one"),
        ([1.0, -1.0], "minute 1"),
        ([math.nan], "minute 0"),
        ([1.0, 2.0, math.inf], "minute 2"),
        ([2e7], "minute 0"),
    ],
)
def test_replay_rejects_bad_rates(rates: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        traces.replay(rates)


# ---------------------------------------------------------------------------------------------------- rate file


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1\n2.5\n0\n", [1.0, 2.5, 0.0]),
        ("# a comment\n\n  3  \n# another\n4\n\n", [3.0, 4.0]),
        ("minute,rps\n0,10\n1,20.5\n2,0\n", [10.0, 20.5, 0.0]),
        ("# exported\nminute, rps\n0, 1\n1 , 2\n", [1.0, 2.0]),
        ("0,5\n1,6\n", [5.0, 6.0]),
        ("1e2\n", [100.0]),
    ],
)
def test_parse_rate_file_reads_plain_and_csv(text: str, expected: list[float]) -> None:
    assert traces.parse_rate_file(text) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1\n2\nabc\n", r"^line 3: 'abc' is not a rate"),
        # a typo in the first value of a plain file is an error, not a header: it would shift the replay
        ("1O0\n200\n", r"^line 1: '1O0' is not a rate"),
        ("# header comment\nrps\n5\n", r"^line 2: 'rps' is not a rate"),
        ("minute,rps\n0,1\nminute,rps\n", r"^line 3: 'minute,rps' is not a rate"),
        ("minute,rps\n0,1\n2,3\n", r"^line 3: minute 2 out of order, expected 1"),
        ("minute,rps\n1,5\n", r"^line 2: minute 1 out of order, expected 0"),
        ("1\n-2\n", r"^line 2: rate -2.0 req/s must be finite and >= 0"),
        ("1\nnan\n", r"^line 2: rate nan"),
        ("# c\n\n0,1,2\n", r"^line 3: '0,1,2' has 3 fields"),
        ("minute,rps\nx,1\n", r"^line 2: minute 'x' is not a number"),
        ("", r"no rates"),
        ("# only comments\n\n", r"no rates"),
        ("minute,rps\n", r"no rates"),
    ],
)
def test_parse_rate_file_errors_name_the_line(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        traces.parse_rate_file(text)


# ---------------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: traces.diurnal(-1.0), "mean_rps"),
        (lambda: traces.diurnal(0.0), "mean_rps"),
        (lambda: traces.diurnal(math.nan), "mean_rps"),
        (lambda: traces.diurnal(1.0, duration_s=0.0), "duration_s"),
        (lambda: traces.diurnal(1.0, peak_to_trough=0.5), "peak_to_trough"),
        (lambda: traces.diurnal(1.0, peak_hour=25.0), "peak_hour"),
        (lambda: traces.diurnal(1.0, period_s=math.inf), "period_s"),
        (lambda: traces.bursty(1.0, cv=0.0, duration_s=10.0), "cv"),
        (lambda: traces.bursty(1.0, cv=math.nan, duration_s=10.0), "cv"),
        (lambda: traces.bursty(-1.0, cv=1.0, duration_s=10.0), "mean_rps"),
        (lambda: traces.bursty(1.0, cv=1.0, duration_s=-10.0), "duration_s"),
        (lambda: traces.spike(-1.0, 1.0, start_s=0.0, length_s=1.0, duration_s=10.0), "base_rps"),
        (lambda: traces.spike(1.0, math.nan, start_s=0.0, length_s=1.0, duration_s=10.0), "peak_rps"),
        (lambda: traces.spike(1.0, 1.0, start_s=11.0, length_s=1.0, duration_s=10.0), "start_s"),
        (lambda: traces.spike(1.0, 1.0, start_s=0.0, length_s=0.0, duration_s=10.0), "length_s"),
    ],
)
def test_constructor_errors_name_the_parameter(make: Callable[[], Trace], param: str) -> None:
    with pytest.raises(ValueError, match=rf"^{param}="):
        make()
