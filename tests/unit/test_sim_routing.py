"""Load balancing in the fleet (sim.routing): random picks deal every arrival once, keep Poisson shares Poisson,
are reproducible, and drive the fleet exactly as ``simulate_batcher`` per replica on the same picks."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from batchfill.sim.batcher import BatcherConfig, simulate_batcher
from batchfill.sim.fleet import _HIST_BINS, FleetConfig, Observation, ScaleDecision, histogram_bins, simulate_fleet
from batchfill.sim.routing import RANDOM, ROUND_ROBIN, random_shares
from batchfill.sim.traces import Trace

TABLE = (0.0, 10.0, 14.0, 18.0, 22.0)
BATCHER = BatcherConfig(max_batch_size=4, max_queue_delay_us=2_000)


def poisson_s(rate_rps: float, duration_s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.cumsum(rng.exponential(1.0 / rate_rps, size=int(rate_rps * duration_s * 1.2) + 10))
    return a[a < duration_s]


def gap_cv(a: np.ndarray) -> float:
    gaps = np.diff(a)
    return float(gaps.std() / gaps.mean())


def test_random_shares_deal_every_arrival_once_and_stay_sorted() -> None:
    a = poisson_s(1000.0, 20.0, seed=1)
    shares = random_shares(a, 7, np.random.default_rng(3))
    assert len(shares) == 7
    assert all(np.all(np.diff(s) >= 0) for s in shares)
    assert np.array_equal(np.sort(np.concatenate(shares)), a)
    # each replica gets about 1/7 of the requests (binomial: within 5 standard deviations)
    sd = (len(a) * (1 / 7) * (6 / 7)) ** 0.5
    assert all(abs(len(s) - len(a) / 7) < 5 * sd for s in shares)


def test_random_shares_of_poisson_traffic_are_poisson_and_round_robin_is_smoother() -> None:
    a = poisson_s(1000.0, 200.0, seed=2)
    n = 25
    shares = random_shares(a, n, np.random.default_rng(4))
    # exponential gaps have CV 1; every n-th gap of a Poisson stream is Erlang-n, CV 1/sqrt(n) = 0.2
    assert all(abs(gap_cv(s) - 1.0) < 0.1 for s in shares)
    assert all(abs(gap_cv(a[j::n]) - n**-0.5) < 0.03 for j in range(n))


def test_random_shares_are_reproducible_from_the_generator() -> None:
    a = poisson_s(500.0, 10.0, seed=5)
    one = random_shares(a, 4, np.random.default_rng(9))
    two = random_shares(a, 4, np.random.default_rng(9))
    other = random_shares(a, 4, np.random.default_rng(10))
    assert all(np.array_equal(x, y) for x, y in zip(one, two, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(one, other, strict=True))


class Static:
    name = "static"

    def __init__(self, n: int) -> None:
        self.n = n

    def decide(self, obs: Observation) -> ScaleDecision:
        return ScaleDecision(self.n, "Static")


def fixed_trace(a: np.ndarray, duration_s: float) -> Trace:
    def blocks_from(block_s: float) -> Iterator[np.ndarray]:
        k = 0
        while k * block_s < duration_s:
            yield a[(a >= k * block_s) & (a < min((k + 1) * block_s, duration_s))]
            k += 1

    return Trace("fixed", "fixed", duration_s, a.size / duration_s, lambda t: 0.0, blocks_from)


@pytest.mark.parametrize("n", [2, 3])
def test_random_balancing_in_the_fleet_is_simulate_batcher_on_the_same_picks(n: int) -> None:
    a = poisson_s(300.0, 240.0, seed=n)
    cfg = FleetConfig(BATCHER, TABLE, 40.0, initial_replicas=n, balancing=RANDOM, balancing_seed=11)
    run = simulate_fleet(fixed_trace(a, 240.0), cfg, Static(n))
    # the fleet draws one pick per request, block by block (blocks of scrape_s), from one generator
    rng = np.random.default_rng(11)
    per: list[list[np.ndarray]] = [[] for _ in range(n)]
    for k in range(16):
        block = a[(a >= 15.0 * k) & (a < 15.0 * (k + 1))]
        for j, share in enumerate(random_shares(block, n, rng)):
            per[j].append(share)
    lats = [simulate_batcher((np.concatenate(p) * 1000.0).tolist(), BATCHER, TABLE).latencies_ms for p in per]
    expected = np.bincount(histogram_bins(np.concatenate(lats)), minlength=_HIST_BINS)
    assert np.array_equal(run.latency_histogram, expected)
    rr = simulate_fleet(fixed_trace(a, 240.0), FleetConfig(BATCHER, TABLE, 40.0, initial_replicas=n), Static(n))
    assert not np.array_equal(rr.latency_histogram, run.latency_histogram), "random differs from round robin"
    again = simulate_fleet(fixed_trace(a, 240.0), cfg, Static(n))
    assert np.array_equal(again.latency_histogram, run.latency_histogram)


def test_fleet_config_rejects_an_unknown_balancing() -> None:
    with pytest.raises(ValueError, match=r"FleetConfig.balancing='least-request': choose from round-robin, random"):
        FleetConfig(BATCHER, TABLE, 40.0, balancing="least-request")
    assert FleetConfig(BATCHER, TABLE, 40.0).balancing == ROUND_ROBIN
