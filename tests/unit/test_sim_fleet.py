"""The fleet simulator (sim.fleet): conservation, GPU time, routing, start-up, scale-in, observations, bounds.

Traces are built from fixed arrival arrays (or low-rate seeded traces) and autoscalers are scripted test doubles
of the ``Autoscaler`` protocol, so every expectation is computed by hand or by ``simulate_batcher`` per replica.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from batchfill.sim import traces
from batchfill.sim.batcher import BatcherConfig, simulate_batcher
from batchfill.sim.fleet import (
    _HIST_BINS,
    FleetConfig,
    FleetRun,
    Observation,
    ScaleDecision,
    histogram_bins,
    lower_bound_gpu_seconds,
    simulate_fleet,
)
from batchfill.sim.traces import Trace

# l(b) = 6 + 4 b ms for b = 1..4; budget 40 ms
TABLE = (0.0, 10.0, 14.0, 18.0, 22.0)
BATCHER = BatcherConfig(max_batch_size=4, max_queue_delay_us=2_000)
BUDGET_MS = 40.0


def config(**kw: Any) -> FleetConfig:
    base: dict[str, Any] = {"batcher": BATCHER, "latency_ms": TABLE, "budget_ms": BUDGET_MS}
    return FleetConfig(**{**base, **kw})


def fixed_trace(arrivals_s: np.ndarray | list[float], duration_s: float, name: str = "fixed") -> Trace:
    """A Trace over fixed, sorted arrival times (seconds)."""
    a = np.sort(np.asarray(arrivals_s, dtype=np.float64))
    assert a.size == 0 or (a[0] >= 0 and a[-1] < duration_s)

    def blocks_from(block_s: float) -> Iterator[np.ndarray]:
        k = 0
        while k * block_s < duration_s:
            lo, hi = k * block_s, min((k + 1) * block_s, duration_s)
            yield a[(a >= lo) & (a < hi)]
            k += 1

    return Trace(
        name=name,
        description=name,
        duration_s=duration_s,
        mean_rps=a.size / duration_s,
        rate_at=lambda t: np.full_like(np.asarray(t, dtype=np.float64), a.size / duration_s),
        blocks_from=blocks_from,
    )


def poisson_s(rate_rps: float, duration_s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.cumsum(rng.exponential(1.0 / rate_rps, size=int(rate_rps * duration_s * 1.2) + 10))
    return a[a < duration_s]


@dataclass
class Scripted:
    """Autoscaler test double: ``script(now_s, obs) -> replicas``; records every observation and answer."""

    script: Callable[[float, Observation], int]
    name: str = "scripted"
    seen: list[Observation] = field(default_factory=list)

    def decide(self, obs: Observation) -> ScaleDecision:
        self.seen.append(obs)
        return ScaleDecision(self.script(obs.now_s, obs), "Scripted")

    def at(self, now_s: float) -> Observation:
        return next(o for o in self.seen if o.now_s == now_s)


def constant(n: int) -> Scripted:
    return Scripted(lambda _t, _o: n, name=f"static-{n}")


def schedule(*steps: tuple[float, int], start: int = 1) -> Scripted:
    """Replica count ``n`` from tick time ``t`` on, for each (t, n); ``start`` before the first."""

    def script(now: float, _obs: Observation) -> int:
        n = start
        for t, m in steps:
            if now >= t:
                n = m
        return n

    return Scripted(script)


def hist_of(*latency_arrays: np.ndarray) -> np.ndarray:
    lat = np.concatenate(latency_arrays) if latency_arrays else np.empty(0)
    return np.bincount(histogram_bins(lat), minlength=_HIST_BINS)


def batcher_latencies(arrivals_s: np.ndarray) -> np.ndarray:
    return simulate_batcher((arrivals_s * 1000.0).tolist(), BATCHER, TABLE).latencies_ms


def figures(run: FleetRun) -> tuple[Any, ...]:
    return (
        run.gpu_seconds,
        run.requests,
        run.within_sla,
        run.refused,
        run.scale_events,
        run.peak_replicas,
        run.latency_histogram.tolist(),
        run.arrivals_per_minute.tolist(),
        run.ticks,
    )


# ---------------------------------------------------------------------------------------------------- conservation


@pytest.mark.parametrize(
    ("name", "auto", "initial"),
    [
        ("static", constant(2), 2),
        ("up-down", schedule((30.0, 4), (120.0, 1), (180.0, 3), start=2), 2),
        ("through zero", schedule((60.0, 0), (90.0, 2), start=1), 1),
        ("from zero", schedule((15.0, 3), start=0), 0),
        ("oscillating", Scripted(lambda t, _o: 1 + int(t // 15) % 4), 1),
    ],
)
def test_every_arrival_is_served_or_refused(name: str, auto: Scripted, initial: int) -> None:
    # 300 s at ~150 req/s; one replica serves ~4 / 22 ms = 180 req/s at most, so single-replica spells queue
    a = poisson_s(150.0, 300.0, seed=3)
    run = simulate_fleet(fixed_trace(a, 300.0), config(initial_replicas=initial, startup_s=20.0), auto)
    served = int(run.latency_histogram.sum())
    assert run.requests == len(a), name
    assert run.requests == served + run.refused, f"{name}: {run.requests} != {served} served + {run.refused} refused"
    assert 0 <= run.within_sla <= served, name
    assert int(run.arrivals_per_minute.sum()) == len(a), name
    assert run.slo_attainment == pytest.approx(run.within_sla / run.requests)


# ---------------------------------------------------------------------------------------------------- static fleets


@pytest.mark.parametrize(("n", "gpus", "duration"), [(1, 1, 120.0), (3, 1, 300.0), (2, 4, 95.0), (5, 2, 61.0)])
def test_static_replicas_hold_n_times_duration_gpu_seconds(n: int, gpus: int, duration: float) -> None:
    a = poisson_s(40.0, duration, seed=n)
    run = simulate_fleet(fixed_trace(a, duration), config(initial_replicas=n, gpus_per_replica=gpus), constant(n))
    assert run.gpu_seconds == pytest.approx(n * duration * gpus, rel=1e-12)
    assert run.gpu_hours == pytest.approx(n * duration * gpus / 3600.0)
    assert run.scale_events == 0
    assert run.peak_replicas == n
    assert run.refused == 0
    assert run.goodput_per_gpu_rps == pytest.approx(run.within_sla / run.gpu_seconds)
    # one tick per tick_s strictly inside the trace
    assert [k.t_s for k in run.ticks] == [15.0 * i for i in range(1, math.ceil(duration / 15.0))]


def test_one_static_replica_is_simulate_batcher_on_the_same_arrivals() -> None:
    a = poisson_s(120.0, 600.0, seed=21)
    run = simulate_fleet(fixed_trace(a, 600.0), config(), constant(1))
    lat = batcher_latencies(a)
    assert np.array_equal(run.latency_histogram, hist_of(lat)), "histogram of the very same latencies"
    assert run.within_sla == int(np.count_nonzero(lat <= BUDGET_MS))
    for q in (0.01, 0.5, 0.9, 0.99, 0.999, 1.0):
        exact = float(np.quantile(lat, q, method="inverted_cdf"))
        got = run.latency_quantile_ms(q)
        assert got is not None
        assert exact * (1 - 1e-12) <= got <= exact * (1 + 1e-3) * (1 + 1e-12), f"q={q}: {got} vs exact {exact}"


@pytest.mark.parametrize("n", [2, 3])
def test_round_robin_deals_arrivals_in_turn(n: int) -> None:
    # heavy enough that batches form, so a different assignment would give different latencies
    a = poisson_s(300.0, 240.0, seed=n)
    run = simulate_fleet(fixed_trace(a, 240.0), config(initial_replicas=n), constant(n))
    per_replica = [batcher_latencies(a[j::n]) for j in range(n)]
    assert np.array_equal(run.latency_histogram, hist_of(*per_replica)), "arrival i goes to replica i mod n"
    # the check discriminates: one replica taking everything would look different
    assert not np.array_equal(run.latency_histogram, hist_of(batcher_latencies(a)))


def test_latency_quantile_of_an_empty_run_is_none() -> None:
    run = simulate_fleet(fixed_trace([], 60.0), config(), constant(1))
    assert run.latency_quantile_ms(0.99) is None
    assert run.slo_attainment == 1.0
    assert run.requests == 0


def test_latency_quantile_zero_is_the_smallest_latency() -> None:
    a = np.arange(0.0, 30.0, 1.0)  # one request a second, each alone: latency 2 ms delay + l(1) = 12 ms
    run = simulate_fleet(fixed_trace(a, 30.0), config(), constant(1))
    got = run.latency_quantile_ms(0.0)
    assert got is not None
    assert 12.0 <= got <= 12.0 * 1.001


# ---------------------------------------------------------------------------------------------------- start-up


@pytest.mark.parametrize("startup_s", [30.0, 20.0, 0.0])
def test_a_new_replica_gets_no_traffic_before_ready_and_holds_gpus_from_creation(startup_s: float) -> None:
    duration = 180.0
    a = poisson_s(250.0, duration, seed=8)
    auto = schedule((15.0, 2), start=1)
    run = simulate_fleet(fixed_trace(a, duration), config(startup_s=startup_s), auto)
    ready = 15.0 + startup_s
    before, after = a[a < ready], a[a >= ready]
    # replica 0 serves everything before `ready`, then replicas 0 and 1 alternate
    expected = hist_of(batcher_latencies(np.concatenate([before, after[0::2]])), batcher_latencies(after[1::2]))
    assert np.array_equal(run.latency_histogram, expected), f"replica 1 serving before t={ready}?"
    assert run.gpu_seconds == pytest.approx(duration + (duration - 15.0)), "GPU time counts from creation"
    assert run.scale_events == 1
    assert run.peak_replicas == 2
    if startup_s >= 15.0:
        obs = auto.at(30.0)
        assert (obs.current, obs.ready, obs.starting) == (2, 1, 1)


def test_refused_while_no_replica_is_ready() -> None:
    a = np.arange(0.05, 120.0, 0.1)  # 10 req/s
    auto = schedule((15.0, 1), start=0)
    run = simulate_fleet(fixed_trace(a, 120.0), config(initial_replicas=0, startup_s=30.0), auto)
    refused = int(np.count_nonzero(a < 45.0))
    assert run.refused == refused, "arrivals before the first replica is Ready (t=45) are refused"
    assert int(run.latency_histogram.sum()) == len(a) - refused
    assert run.within_sla == len(a) - refused, "light load: every served request is within the SLA"
    assert run.slo_attainment == pytest.approx((len(a) - refused) / len(a))
    assert run.gpu_seconds == pytest.approx(120.0 - 15.0)
    first = auto.at(15.0)
    assert (first.current, first.ready, first.starting) == (0, 0, 0)
    assert first.gpu_utilization is None, "no replica, no GPU utilization"


def test_max_replicas_caps_what_the_autoscaler_asks() -> None:
    run = simulate_fleet(fixed_trace([], 60.0), config(max_replicas=3, initial_replicas=5), constant(100))
    assert run.peak_replicas == 3
    assert run.gpu_seconds == pytest.approx(3 * 60.0), "initial replicas are capped too"
    assert all(k.desired == 3 for k in run.ticks)


# ---------------------------------------------------------------------------------------------------- scale-in


def test_scale_in_drains_the_removed_replicas_queue() -> None:
    # 3 replicas at ~500 req/s (near their capacity): queues are non-empty when 2 are removed at t=60
    duration = 120.0
    a = poisson_s(500.0, duration, seed=4)
    auto = schedule((60.0, 1), start=3)
    run = simulate_fleet(fixed_trace(a, duration), config(initial_replicas=3), auto)
    assert run.refused == 0
    assert int(run.latency_histogram.sum()) == len(a), "every request, queued on a removed replica or not, completes"
    assert run.scale_events == 1
    # removed replicas hold their GPU until their last execution ends, a little after t=60
    assert duration + 2 * 60.0 < run.gpu_seconds < duration + 2 * 61.0
    # routing: round robin over 3 until t=60 (the one kept is the oldest, replica 0), then replica 0 alone
    first, rest = a[a < 60.0], a[a >= 60.0]
    expected = hist_of(
        batcher_latencies(np.concatenate([first[0::3], rest])),
        batcher_latencies(first[1::3]),
        batcher_latencies(first[2::3]),
    )
    assert np.array_equal(run.latency_histogram, expected)


def test_scale_in_removes_the_most_recently_ready_replica_first() -> None:
    # max_batch_size 1, l(1) = 40 s: each request holds its replica's GPU for 40 s, so a removed replica's
    # GPU time ends 40 s after its request started, which tells which replica was removed.
    long = (0.0, 40_000.0)
    cfg = config(batcher=BatcherConfig(max_batch_size=1), latency_ms=long, budget_ms=1e6, startup_s=30.0)
    # replica 1 created at 15 (Ready 45), replica 2 created at 30 (Ready 60); at t=75 back to 2 replicas
    auto = schedule((15.0, 2), (30.0, 3), (75.0, 2), start=1)
    # no arrival before 60; then one each for replicas 0, 1, 2 in turn
    run = simulate_fleet(fixed_trace([61.0, 62.0, 63.0], 150.0), cfg, auto)
    # replica 2 removed at 75 and gone when its request ends at 63 + 40 = 103
    assert run.gpu_seconds == pytest.approx(150.0 + (150.0 - 15.0) + (103.0 - 30.0))
    assert (auto.at(90.0).current, auto.at(90.0).ready) == (2, 2)


def test_scale_in_removes_a_starting_replica_before_a_ready_one() -> None:
    a = np.arange(0.5, 150.0, 1.0)
    # replica 1 is created at 15 and would be Ready at 75; at t=30 back to 1: replica 1 goes, replica 0 stays
    auto = schedule((15.0, 2), (30.0, 1), start=1)
    run = simulate_fleet(fixed_trace(a, 150.0), config(startup_s=60.0), auto)
    assert run.refused == 0, "had the Ready replica been removed, nothing would be Ready until t=75"
    assert run.gpu_seconds == pytest.approx(150.0 + 15.0), "the starting replica is gone at once"
    obs = auto.at(45.0)
    assert (obs.current, obs.ready, obs.starting) == (1, 1, 0)


def test_scale_in_among_starting_replicas_removes_the_newest() -> None:
    # replicas 1 (Ready at 75) and 2 (Ready at 90) are both starting when the count goes 3 -> 2 at t=45
    auto = schedule((15.0, 2), (30.0, 3), (45.0, 2), start=1)
    simulate_fleet(fixed_trace([], 150.0), config(startup_s=60.0), auto)
    assert auto.at(60.0).starting == 1
    assert auto.at(75.0).ready == 2, "replica 1 (the older) was kept: Ready at 75"


# ---------------------------------------------------------------------------------------------------- observations


def test_request_rate_is_the_arrival_rate_in_steady_state() -> None:
    a = np.arange(0.005, 300.0, 0.01)  # exactly 100 req/s
    auto = constant(2)
    simulate_fleet(fixed_trace(a, 300.0), config(initial_replicas=2), auto)
    for obs in auto.seen:
        # the operator's Σ increase / window: before a whole window of history exists, the rate reads low
        # (15 s of requests over 60 s at the first tick), which is why compare.run starts decisions after a window
        full = min(1.0, obs.now_s / 60.0)
        assert obs.request_rate_rps == pytest.approx(100.0 * full, rel=0.02), f"t={obs.now_s}: {obs.request_rate_rps}"
        assert (obs.current, obs.ready, obs.starting) == (2, 2, 0)
        assert obs.window_s == 60.0
        assert obs.avg_batch_size is not None
        assert obs.queue_time_ms is not None
        assert obs.p99_ms is not None
    late = auto.at(150.0)
    assert late.completed == pytest.approx(6000, abs=4), "requests in the last 60 s"
    # 50 req/s per replica, one every 20 ms: each runs alone after the 2 ms delay, l(1) = 10 ms
    assert late.avg_batch_size == pytest.approx(1.0)
    assert late.queue_time_ms == pytest.approx(2.0)
    assert late.p99_ms == pytest.approx(12.0)
    assert late.gpu_utilization == pytest.approx(50 * 0.010, rel=0.01), "busy fraction of each replica"
    assert late.pending_requests == 0


def test_starting_replica_reports_zero_gpu_utilization() -> None:
    a = np.arange(0.01, 120.0, 0.02)  # 50 req/s, each request alone: one replica busy 50 x 10 ms = 50 %
    auto = schedule((15.0, 2), start=1)
    simulate_fleet(fixed_trace(a, 120.0), config(startup_s=60.0), auto)
    before, starting = auto.at(15.0), auto.at(30.0)
    assert before.current == 1
    assert before.gpu_utilization is not None
    assert starting.gpu_utilization is not None
    assert (starting.current, starting.starting) == (2, 1)
    # the mean over both replicas: the Ready one's busy fraction and 0 for the one loading its model
    assert before.gpu_utilization == pytest.approx(0.5, rel=0.01)
    assert starting.gpu_utilization == pytest.approx(0.25, rel=0.01)


def test_without_traffic_the_signals_are_none() -> None:
    auto = constant(2)
    simulate_fleet(fixed_trace([], 90.0), config(initial_replicas=2), auto)
    assert len(auto.seen) == 5
    for obs in auto.seen:
        assert obs.completed == 0
        assert obs.request_rate_rps == 0.0
        assert obs.avg_batch_size is None
        assert obs.queue_time_ms is None
        assert obs.p99_ms is None
        assert obs.gpu_utilization == 0.0
        assert obs.pending_requests == 0


def test_tick_records_offered_rate_and_decision() -> None:
    a = np.arange(0.05, 60.0, 0.1)  # 10 req/s
    auto = schedule((30.0, 2), start=1)
    run = simulate_fleet(fixed_trace(a, 60.0), config(startup_s=15.0), auto)
    assert [k.t_s for k in run.ticks] == [15.0, 30.0, 45.0]
    assert [k.offered_rps for k in run.ticks] == pytest.approx([10.0, 10.0, 10.0])
    assert [k.desired for k in run.ticks] == [1, 2, 2]
    assert [k.current for k in run.ticks] == [1, 1, 2]
    assert [k.ready for k in run.ticks] == [1, 1, 2]
    assert all(k.reason == "Scripted" for k in run.ticks)
    assert all(k.within_sla == 1.0 for k in run.ticks)


# ---------------------------------------------------------------------------------------------------- lower bound


@pytest.mark.parametrize(
    ("minutes", "capacity", "gpus", "duration", "whole", "expected"),
    [
        # rates 2, 1, 1 req/s (the last minute is 30 s long): ceil(rate / 1) x span
        ([120, 60, 30], 1.0, 1, 150.0, True, 2 * 60 + 1 * 60 + 1 * 30),
        # C = 1.5: whole replicas 2, 1, 1; fractional = arrivals / C
        ([120, 60, 30], 1.5, 1, 150.0, True, 2 * 60 + 1 * 60 + 1 * 30),
        ([120, 60, 30], 1.5, 1, 150.0, False, 210 / 1.5),
        # exactly at capacity: no extra replica for rounding
        ([600, 1200], 10.0, 1, 120.0, True, 60 + 2 * 60),
        ([600, 1201], 10.0, 1, 120.0, True, 60 + 3 * 60),
        # an idle minute needs nothing; GPUs per replica multiply
        ([0, 60, 0], 2.0, 4, 180.0, True, 60 * 4),
        ([0, 60, 0], 2.0, 4, 180.0, False, 0.5 * 60 * 4),
        ([], 1.0, 1, 0.0, True, 0.0),
    ],
)
def test_lower_bound_hand_computed(
    minutes: list[int], capacity: float, gpus: int, duration: float, whole: bool, expected: float
) -> None:
    got = lower_bound_gpu_seconds(minutes, capacity, gpus, duration_s=duration, whole_replicas=whole)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("capacity", [0.0, -1.0, math.nan, math.inf])
def test_lower_bound_bad_capacity_raises(capacity: float) -> None:
    with pytest.raises(ValueError, match="capacity_rps"):
        lower_bound_gpu_seconds([60], capacity, 1, duration_s=60.0)


# ---------------------------------------------------------------------------------------------------- determinism


def test_same_inputs_same_run() -> None:
    trace = traces.spike(80.0, 400.0, start_s=60.0, length_s=60.0, duration_s=240.0, seed=5)

    def load_following(_t: float, obs: Observation) -> int:
        return max(1, math.ceil(obs.request_rate_rps / 120.0))

    runs = [simulate_fleet(trace, config(startup_s=20.0), Scripted(load_following)) for _ in range(2)]
    assert figures(runs[0]) == figures(runs[1])
    assert runs[0].scale_events > 0, "the script did scale"


def test_progress_is_called_with_each_tick_time() -> None:
    seen: list[float] = []
    simulate_fleet(fixed_trace([], 75.0), config(), constant(1), progress=seen.append)
    assert seen == [15.0, 30.0, 45.0, 60.0]


# ---------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"budget_ms": 0.0}, "FleetConfig.budget_ms"),
        ({"budget_ms": math.nan}, "FleetConfig.budget_ms"),
        ({"tick_s": -15.0}, "FleetConfig.tick_s"),
        ({"scrape_s": math.inf}, "FleetConfig.scrape_s"),
        ({"window_s": 0.0}, "FleetConfig.window_s"),
        ({"p99_window_s": -1.0}, "FleetConfig.p99_window_s"),
        ({"startup_s": -1.0}, "FleetConfig.startup_s"),
        ({"startup_s": math.inf}, "FleetConfig.startup_s"),
        ({"tick_s": 20.0, "scrape_s": 15.0}, "tick_s=20.0 must be a multiple of scrape_s=15.0"),
        ({"gpus_per_replica": -1}, "gpus_per_replica"),
        ({"initial_replicas": -1}, "initial_replicas"),
        ({"max_replicas": 0}, "max_replicas"),
    ],
)
def test_fleet_config_rejects(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        config(**kw)


def test_tick_may_be_a_multiple_of_scrape() -> None:
    auto = constant(1)
    simulate_fleet(fixed_trace([], 120.0), config(tick_s=30.0, scrape_s=15.0), auto)
    assert [o.now_s for o in auto.seen] == [30.0, 60.0, 90.0]
