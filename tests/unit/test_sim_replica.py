"""The resumable batcher (sim.replica) against the one-shot batcher (sim.batcher.simulate_batcher).

Cutting the arrivals into intervals must not change a single dispatch: the latencies are compared exactly, and
every per-interval counter is recomputed from simulate_batcher's batches started in that interval.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfill.sim.batcher import BatcherConfig, BatcherRun, simulate_batcher
from batchfill.sim.replica import Interval, ReplicaBatcher

# l(b) = 4 + 3 b ms for b = 1..16
TABLE = [0.0] + [4.0 + 3.0 * b for b in range(1, 17)]
BUDGET_MS = 30.0


def arrivals_ms(seed: int, n: int, rate_per_ms: float, ties: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.cumsum(rng.exponential(1.0 / rate_per_ms, size=n))
    return np.floor(a) if ties else a  # flooring to whole ms makes equal arrival times


def run_in_intervals(
    a: np.ndarray, cuts: list[float], config: BatcherConfig, *, drain: bool = True
) -> tuple[ReplicaBatcher, list[Interval], list[int]]:
    """Feed ``a`` cut at ``cuts`` (increasing), then drain with until = inf; also returns ``pending`` after each."""
    rb = ReplicaBatcher(config, TABLE, BUDGET_MS)
    out: list[Interval] = []
    pending: list[int] = []
    lo = 0.0
    for cut in [*cuts, math.inf] if drain else cuts:
        i, j = int(np.searchsorted(a, lo, side="left")), int(np.searchsorted(a, cut, side="left"))
        out.append(rb.advance(a[i:j], cut))
        pending.append(rb.pending)
        lo = cut
    return rb, out, pending


def expected_interval(ref: BatcherRun, a: np.ndarray, lo: float, hi: float) -> dict[str, float]:
    """What simulate_batcher's batches starting in ``[lo, hi)`` add up to."""
    sizes, starts = ref.batch_sizes, ref.dispatch_ms
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    sel = (starts >= lo) & (starts < hi)
    idx = np.concatenate([np.arange(f, f + s) for f, s in zip(first[sel], sizes[sel], strict=True)] or [[]])
    idx = idx.astype(np.int64)
    start_per_req = np.repeat(starts, sizes)
    lat = ref.latencies_ms[idx]
    return {
        "completed": int(sizes[sel].sum()),
        "executions": int(sel.sum()),
        "queue_ms": float((start_per_req[idx] - a[idx]).sum()),
        "busy_ms": float(np.asarray(TABLE)[sizes[sel]].sum()),
        "within_budget": int(np.count_nonzero(lat <= BUDGET_MS)),
        "dispatched_before_hi": int(sizes[starts < hi].sum()),
        "last_end": float((starts + np.asarray(TABLE)[sizes])[starts < hi].max()) if (starts < hi).any() else -math.inf,
    }


@st.composite
def configs(draw: st.DrawFn) -> BatcherConfig:
    mbs = draw(st.sampled_from([0, 1, 2, 4, 8, 16]))
    prefs: tuple[int, ...] = ()
    if mbs > 1 and draw(st.booleans()):
        prefs = tuple(sorted(draw(st.sets(st.integers(1, mbs), min_size=1, max_size=3))))
    delay = draw(st.sampled_from([0, 100, 2_000, 10_000, 50_000]))
    return BatcherConfig(mbs, prefs, delay, executors=draw(st.sampled_from([1, 2])))


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 400),
    rate_per_ms=st.sampled_from([0.01, 0.1, 0.3, 1.0]),
    ties=st.booleans(),
    config=configs(),
    cut_fractions=st.lists(st.floats(0.0, 1.2, allow_nan=False), max_size=12),
)
def test_cut_arrivals_give_exactly_simulate_batchers_latencies_and_counters(
    seed: int,
    n: int,
    rate_per_ms: float,
    ties: bool,
    config: BatcherConfig,
    cut_fractions: list[float],
) -> None:
    a = arrivals_ms(seed, n, rate_per_ms, ties)
    span = float(a[-1]) + 1.0 if n else 100.0
    cuts = sorted({round(f * span, 3) for f in cut_fractions if f > 0})
    rb, intervals, pending = run_in_intervals(a, cuts, config)
    ref = simulate_batcher(a.tolist(), config, TABLE)

    got = np.concatenate([iv.latencies_ms for iv in intervals]) if intervals else np.empty(0)
    assert np.array_equal(got, ref.latencies_ms), "cutting the arrivals changed the latencies"
    assert rb.pending == 0, "advance(until=inf) drains the queue"
    assert sum(iv.completed for iv in intervals) == n
    assert sum(iv.executions for iv in intervals) == len(ref.batch_sizes)

    lo = 0.0
    for k, (iv, hi) in enumerate(zip(intervals, [*cuts, math.inf], strict=True)):
        exp = expected_interval(ref, a, lo, hi)
        where = f"interval {k} [{lo}, {hi})"
        assert iv.completed == exp["completed"], where
        assert iv.executions == exp["executions"], where
        assert iv.busy_ms == pytest.approx(exp["busy_ms"], rel=1e-12, abs=1e-9), where
        assert iv.queue_ms == pytest.approx(exp["queue_ms"], rel=1e-9, abs=1e-6), where
        assert iv.within_budget == exp["within_budget"], where
        arrived = int(np.searchsorted(a, hi, side="left"))
        assert iv.pending == arrived - exp["dispatched_before_hi"], f"{where}: pending"
        assert pending[k] == iv.pending, f"{where}: ReplicaBatcher.pending after the call"
        assert iv.last_end_ms == exp["last_end"], f"{where}: last_end_ms"
        assert len(iv.latencies_ms) == iv.completed
        lo = hi


def test_many_cuts_across_the_compaction_threshold() -> None:
    # 20,000 arrivals at ~0.8/ms in 1-s intervals: dispatched arrivals are compacted away several times
    a = arrivals_ms(5, 20_000, 0.8, ties=False)
    config = BatcherConfig(max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=3_000, executors=2)
    cuts = [float(c) for c in range(1000, int(a[-1]) + 1000, 1000)]
    rb, intervals, _ = run_in_intervals(a, cuts, config)
    ref = simulate_batcher(a.tolist(), config, TABLE)
    assert np.array_equal(np.concatenate([iv.latencies_ms for iv in intervals]), ref.latencies_ms)
    assert rb.pending == 0


def test_pending_counts_requests_not_yet_dispatched() -> None:
    # batches of up to 8 or a 10 ms delay; l(b) = 4 + 3b. Arrivals at 0, 1, 2 wait for the delay (dispatch at 10).
    config = BatcherConfig(max_batch_size=8, max_queue_delay_us=10_000)
    rb = ReplicaBatcher(config, TABLE, BUDGET_MS)
    iv = rb.advance(np.array([0.0, 1.0, 2.0]), 5.0)
    assert (iv.completed, iv.executions, iv.pending, rb.pending) == (0, 0, 3, 3)
    assert iv.last_end_ms == -math.inf, "nothing executed yet"
    iv = rb.advance(np.array([6.0]), 10.0)
    assert (iv.completed, rb.pending) == (0, 4), "the dispatch at exactly until_ms belongs to the next interval"
    iv = rb.advance(np.array([10.0, 11.0]), 12.0)
    # the dispatch at 10 takes every request that arrived by 10 (0, 1, 2, 6, 10): busy until 10 + l(5) = 29;
    # the one at 11 waits behind it
    assert iv.completed == 5
    assert iv.executions == 1
    assert (iv.pending, rb.pending) == (1, 1)
    assert iv.latencies_ms.tolist() == [29.0, 28.0, 27.0, 23.0, 19.0]
    assert iv.queue_ms == pytest.approx(10 + 9 + 8 + 4 + 0)
    assert iv.busy_ms == 19.0
    assert iv.within_budget == 5
    assert iv.last_end_ms == 29.0
    iv = rb.advance([], math.inf)
    # at 29 the waiting request starts alone: 29 + l(1) - 11 = 25 ms
    assert iv.latencies_ms.tolist() == [25.0]
    assert iv.queue_ms == 18.0
    assert iv.within_budget == 1
    assert (iv.pending, rb.pending) == (0, 0)
    assert iv.last_end_ms == 36.0


def test_advance_with_infinity_drains_everything_at_once() -> None:
    a = arrivals_ms(1, 500, 2.0, ties=True)  # far beyond capacity: a long queue builds
    config = BatcherConfig(max_batch_size=4, max_queue_delay_us=1_000)
    rb = ReplicaBatcher(config, TABLE, BUDGET_MS)
    iv = rb.advance(a, math.inf)
    ref = simulate_batcher(a.tolist(), config, TABLE)
    assert iv.completed == 500
    assert rb.pending == 0
    assert np.array_equal(iv.latencies_ms, ref.latencies_ms)
    assert iv.within_budget == int(np.count_nonzero(ref.latencies_ms <= BUDGET_MS))
    empty = rb.advance(np.empty(0), math.inf)
    assert (empty.completed, empty.executions, empty.pending) == (0, 0, 0)
    assert empty.last_end_ms == iv.last_end_ms, "last_end_ms is remembered across calls"


def test_short_latency_table_raises() -> None:
    with pytest.raises(ValueError, match="need 8"):
        ReplicaBatcher(BatcherConfig(max_batch_size=8), [0.0, 1.0, 2.0], 10.0)
