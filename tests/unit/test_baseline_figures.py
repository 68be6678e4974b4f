"""The figures the baselines are argued with, checked on this simulator: GPUs needed at 1,000 req/s with batching
off and with the plan, for a small and a large fixed cost, and where the HPA at 80 % GPU utilization settles
with batching off (and whether its replicas keep the SLA).

The figures to check (1,000 req/s): the ResNet-50-like profile {1: 2.1, 2: 2.6, 4: 3.5, 8: 5.4, 16: 9.3,
32: 17.5} ms, SLA 30 ms with 5 ms network, needs 3 GPUs with batching off and 1 with the plan; the large fixed
cost {1: 20, 8: 24, 16: 28, 32: 36, 64: 52} ms, SLA 150 ms with 10 ms, needs 30 with batching off and 1 with the
plan, and batching off behind the HPA at 80 % settles at about 25 replicas that each miss the SLA.

Measured here: 3 and 1; 31 and 1 (the planner's capacity search on 12,000 requests, confirmed on 40,000, gives
C = 32.6 req/s; on 2 million simulated requests one replica keeps its p99 within 140 ms up to about 34 req/s,
which needs the 30); and 25 replicas (the test allows
23 to 27, the counts within the HPA's 10 % tolerance of 25) whose p99 misses the 140 ms budget (196 to 572 ms
per tick, 94 % of requests within it) when the Service routes each request at random, as kube-proxy does, but
meets it (25 to 29 ms) under per-request round robin, which hands each replica every 25th request (Erlang
gaps, far smoother than Poisson).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from batchfill.compare.baselines import Batching, configuration
from batchfill.compare.run import Comparison, Options, compare, prepare
from batchfill.policy.plan import plan_batching
from batchfill.sim import traces
from tests.unit.test_compare_baselines import spec_of

RESNET = {1: 2.1, 2: 2.6, 4: 3.5, 8: 5.4, 16: 9.3, 32: 17.5}
LARGE_FIXED = {1: 20.0, 8: 24.0, 16: 28.0, 32: 36.0, 64: 52.0}
RATE_RPS = 1000.0


def gpus_at_rate(profile: dict[int, float], sla_ms: float, network_ms: float) -> tuple[int, int]:
    """(GPUs with batching off, GPUs with the plan) that serve RATE_RPS at their capacity at SLA."""
    spec = spec_of(profile, sla_ms, network_ms)
    plan = plan_batching(spec)
    off = configuration(Batching.OFF, spec, plan.to_status())
    return math.ceil(RATE_RPS / off.capacity_rps), math.ceil(RATE_RPS / plan.chosen.capacity_rps)


def test_small_fixed_cost_batching_off_needs_three_gpus_and_the_plan_one() -> None:
    assert gpus_at_rate(RESNET, 30.0, 5.0) == (3, 1)


def test_large_fixed_cost_batching_off_needs_thirty_gpus_and_the_plan_one() -> None:
    off, plan = gpus_at_rate(LARGE_FIXED, 150.0, 10.0)
    assert plan == 1
    assert 29 <= off <= 32, f"batching off needs {off} GPUs (stated: 30; measured here: 31)"


@pytest.fixture(scope="module")
def hpa_runs() -> dict[str, Comparison]:
    spec = spec_of(LARGE_FIXED, 150.0, 10.0)
    setup = prepare(spec)
    trace = traces.spike(RATE_RPS, RATE_RPS, start_s=0.0, length_s=1.0, duration_s=900.0, seed=5)
    return {
        balancing: compare(spec, trace, ["batching-off/hpa-gpu"], Options(balancing=balancing), setup=setup)
        for balancing in ("random", "round-robin")
    }


def settled(c: Comparison) -> list[Any]:
    # the fleet starts at ceil(λ / (u·C)) = 37; the first scale-down waits out the 300 s stabilization window
    return [k for k in c.runs[0].ticks if k.t_s >= 420.0]


@pytest.mark.parametrize("balancing", ["random", "round-robin"])
def test_hpa_at_80_percent_with_batching_off_settles_near_25_replicas(
    hpa_runs: dict[str, Comparison], balancing: str
) -> None:
    ticks = settled(hpa_runs[balancing])
    # 1,000 req/s x 20 ms = 20 busy GPUs; at 80 % that is 25 replicas, and the HPA keeps any count n with
    # |25 / n - 1| <= 0.1 (its tolerance): 23 to 27
    assert all(23 <= k.current <= 27 for k in ticks), sorted({k.current for k in ticks})
    assert len({k.current for k in ticks}) == 1, "settled: no change in the last 8 minutes"


def test_those_replicas_miss_the_sla_under_random_routing(hpa_runs: dict[str, Comparison]) -> None:
    c = hpa_runs["random"]
    budget = c.setup.plan.serverBudgetMs
    ticks = settled(c)
    # at 80 % busy each replica is an M/D/1 queue past its capacity at SLA (65 % busy): every tick's p99 is over T
    assert all(k.p99_ms is not None and k.p99_ms > budget for k in ticks), [k.p99_ms for k in ticks]
    assert all(k.within_sla is not None and k.within_sla < 0.99 for k in ticks)
    assert c.runs[0].slo_attainment < 0.99


def test_round_robin_hides_the_miss(hpa_runs: dict[str, Comparison]) -> None:
    c = hpa_runs["round-robin"]
    budget = c.setup.plan.serverBudgetMs
    ticks = settled(c)
    assert all(k.p99_ms is not None and k.p99_ms <= budget for k in ticks), [k.p99_ms for k in ticks]
