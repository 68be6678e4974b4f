"""The two ways batchfill measures a profile agree on the real tritonserver, and either plan keeps its promise.

1. `batchfill profile`'s measurement (:mod:`batchfill.adapters.profiler`: one request of b samples at a time,
   each execution read from Triton's statistics, the p90 as the value);
2. the operator's fit (:func:`batchfill.policy.profile_fit.fit_profile`) of the ``batch_stats`` that live
   Poisson traffic leaves behind under the dynamic batcher (means per batch size, a weighted line to B).

They agree within ``AGREEMENT`` at every batch size the live traffic formed often enough, and at the line's
extrapolated largest size within ``EXTRAPOLATION_AGREEMENT``. Then, for each profile, plan -> render -> load
into the real server -> Poisson load at 90 % of the stated capacity: the server p99 stays within T.
"""

from __future__ import annotations

import time

import pytest

from batchfill.adapters.profiler import connect, input_maker, measure, read_model_info
from batchfill.adapters.triton_stats import delta, read_model_stats, summary_quantile_ms
from batchfill.api.spec import BatchedModelSpec
from batchfill.cli.profile import profile_points
from batchfill.policy.plan import plan_batching
from batchfill.policy.profile import LatencyProfile
from batchfill.policy.profile_fit import BatchTotals, FittedPoint, fit_profile
from batchfill.render import render_model_config
from batchfill.testbed.loadgen import grpc_fp32_input, run_poisson
from batchfill.testbed.triton_local import LocalTriton

from .conftest import SLEEP_DIMS, SLEEP_INPUT, load_model, sleep_config_pb, with_parameters

pytestmark = pytest.mark.component

ALPHA_MS, BETA_MS = 10.0, 2.0
MAX_BATCH = 16
SLA_P99_MS, NETWORK_MS = 80.0, 10.0
#: p90 of single executions vs the mean of batcher-formed executions: the sleep model's executions vary by well
#: under a millisecond, and a batch of b single requests costs ~0.06 ms per request more than one request of b
#: samples (test_sleep_model_profile), so 10 % covers both with room for a noisy 2-core machine.
AGREEMENT = 0.10
#: The line through small batches vs the measured largest size: the sleep model is exactly linear, so only noise
#: and the per-request cost separate them.
EXTRAPOLATION_AGREEMENT = 0.15
LIVE_RATE_RPS, LIVE_SECONDS = 250.0, 15.0
MIN_EXECUTIONS = 15


def _spec(name: str, points: list[dict[str, float]]) -> BatchedModelSpec:
    return BatchedModelSpec.model_validate(
        {
            "model": {
                "name": name,
                "backend": "python",
                "inputs": [{"name": SLEEP_INPUT, "dataType": "TYPE_FP32", "dims": SLEEP_DIMS}],
                "outputs": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": SLEEP_DIMS}],
            },
            "sla": {"latencyP99Ms": SLA_P99_MS, "networkOverheadMs": NETWORK_MS},
            "profile": points,
            # 5 % of T kept back (spec.batching.safetyMarginPercent), as on any shared machine: without it the
            # server p99 at 90 % of capacity was 67-72.5 ms against T = 70 in four runs
            "batching": {"maxBatchSize": MAX_BATCH, "safetyMarginPercent": 5},
            "triton": {"gpusPerReplica": 0},
        }
    )


@pytest.fixture(scope="module")
def cli_profile(triton: LocalTriton) -> LatencyProfile:
    return _cli_profile(triton, "agree_cli")


def _cli_profile(triton: LocalTriton, name: str) -> LatencyProfile:
    load_model(triton, name, with_parameters(sleep_config_pb(name, MAX_BATCH), alpha_ms=ALPHA_MS, beta_ms=BETA_MS),
               "sleep_model")  # fmt: skip
    client = connect(triton.http_url)
    try:
        info = read_model_info(client, triton.http_url, name)
        runs = measure(client, info, input_maker(info, triton.http_url), [1, 2, 4, 8, 16], warmup=3, repeats=15)
    finally:
        client.close()
    points = profile_points(runs, 0.9)
    print("batchfill profile (p90):", points)
    return LatencyProfile.from_points(_spec("x", points).profile or [])


@pytest.fixture(scope="module")
def fitted(triton: LocalTriton) -> list[FittedPoint]:
    return _fitted(triton, "agree_live")


def _fitted(triton: LocalTriton, name: str) -> list[FittedPoint]:
    """The operator's fit of the statistics that live Poisson traffic leaves under the dynamic batcher."""
    config = sleep_config_pb(name, MAX_BATCH, preferred=list(range(1, MAX_BATCH + 1)), queue_delay_us=100)
    load_model(triton, name, with_parameters(config, alpha_ms=ALPHA_MS, beta_ms=BETA_MS), "sleep_model")
    make = grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS)
    run_poisson(triton.grpc_url, name, make, 50, count=30)  # warm-up, excluded by the baseline below
    client = triton.http_client()
    before = read_model_stats(client, name)
    result = run_poisson(triton.grpc_url, name, make, LIVE_RATE_RPS, duration_s=LIVE_SECONDS, seed=3)
    time.sleep(0.3)
    d = delta(before, read_model_stats(client, name))
    client.close()
    assert result.failed == 0, result.errors
    totals = [BatchTotals(b, s.executions, s.total_ns) for b, s in d.batches.items()]
    points = fit_profile(totals, min_executions=MIN_EXECUTIONS, up_to=MAX_BATCH)
    print("fitted from batch_stats:", [(p.batch_size, round(p.latency_ms, 2), p.executions) for p in points])
    return points


def _misses(cli_profile: LatencyProfile, fitted: list[FittedPoint]) -> list[str]:
    misses = []
    for p in fitted:
        reference = cli_profile.latency_ms(p.batch_size)
        allowed = EXTRAPOLATION_AGREEMENT if p.extrapolated else AGREEMENT
        diff = (p.latency_ms - reference) / reference
        print(f"b={p.batch_size}: fit {p.latency_ms:.2f} ms vs batchfill profile {reference:.2f} ms ({diff:+.1%})")
        if abs(diff) > allowed:
            misses.append(f"b={p.batch_size}{' (extrapolated)' if p.extrapolated else ''}: {diff:+.1%} > {allowed:.0%}")
    return misses


def test_the_fit_and_batchfill_profile_agree(
    triton: LocalTriton, cli_profile: LatencyProfile, fitted: list[FittedPoint]
) -> None:
    """On a shared 2-core machine a neighbour's burst inflates one measurement's p90 (the fit read 16-29 % under
    the profile once, at a load average of 8): a disagreement is measured twice more, on fresh copies; two methods
    that really disagree miss every time."""
    measured = [p for p in fitted if not p.extrapolated]
    assert len(measured) >= 3, f"live traffic formed too few batch sizes often enough: {fitted}"
    misses = _misses(cli_profile, fitted)
    for attempt in range(2, 4):
        if not misses:
            break
        print(f"attempt {attempt}: {misses}")
        misses = _misses(_cli_profile(triton, f"agree_cli_{attempt}"), _fitted(triton, f"agree_live_{attempt}"))
    assert not misses, misses


@pytest.mark.parametrize("source", ["cli", "fit"])
def test_a_plan_from_either_profile_keeps_p99_within_t_at_90_percent(
    triton: LocalTriton, cli_profile: LatencyProfile, fitted: list[FittedPoint], source: str
) -> None:
    if source == "cli":
        points = [
            {"batchSize": b, "latencyMs": v}
            for b, v in zip(cli_profile.batch_sizes, cli_profile.latencies_ms, strict=True)
        ]
    else:
        points = [{"batchSize": p.batch_size, "latencyMs": round(p.latency_ms, 3)} for p in fitted]
    name = f"agree_plan_{source}"
    plan = plan_batching(_spec(name, points)).to_status()
    make = grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS)
    rate = 0.9 * plan.capacityPerReplicaRps
    # A shared 2-core machine: a neighbour's burst only ever adds latency, and at 90 % load a stall takes
    # seconds to drain, so a run over T or with a lagging sender is repeated (3 runs at most, on a freshly loaded
    # copy so Triton's 60 s summary holds that run alone). A plan that does not fit misses on every run.
    for attempt in range(1, 4):
        copy = f"{name}_{attempt}"
        load_model(triton, copy, with_parameters(render_model_config(_spec(copy, points), plan,
                   instance_kind="KIND_CPU"), alpha_ms=ALPHA_MS, beta_ms=BETA_MS), "sleep_model")  # fmt: skip
        run_poisson(triton.grpc_url, copy, make, 50, count=30)
        result = run_poisson(triton.grpc_url, copy, make, rate, duration_s=20.0, seed=11)
        time.sleep(0.2)
        p99 = summary_quantile_ms(triton.metrics_text(), copy, 0.99)
        triton.http_client().unload_model(copy)
        print(f"{source} attempt {attempt}: plan B={plan.maxBatchSize}, capacity {plan.capacityPerReplicaRps} "
              f"req/s; at {rate:.1f} req/s server p99 {p99} ms vs T {plan.serverBudgetMs} ms, send lag p99 "
              f"{result.send_lag_p99_ms:.1f} ms")  # fmt: skip
        assert result.failed == 0, result.errors
        assert p99 is not None
        if p99 <= plan.serverBudgetMs and not result.generator_saturated:
            break
    assert not result.generator_saturated
    assert p99 <= plan.serverBudgetMs, f"{source}: server p99 {p99:.1f} ms > T {plan.serverBudgetMs} ms"
