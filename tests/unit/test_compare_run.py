"""The comparison (compare.run, compare.report) on the seed example: setup, static peak, policies, rows, checks,
and a miniature of the cost benchmark's claim."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from batchfill.api.spec import BatchedModelSpec
from batchfill.api.validate import load_model
from batchfill.compare.autoscalers import BatchfillAutoscaler, HorizontalPodAutoscaler, StaticAutoscaler
from batchfill.compare.report import MIN_SLO_ATTAINMENT, checks, markdown_table, rows
from batchfill.compare.run import (
    POLICIES,
    CompareError,
    Comparison,
    Options,
    Setup,
    arrivals_per_minute,
    compare,
    make_autoscaler,
    prepare,
    static_peak_replicas,
)
from batchfill.policy.plan import plan_batching, replicas_for
from batchfill.sim import traces
from batchfill.sim.fleet import Observation, lower_bound_gpu_seconds

ROOT = Path(__file__).resolve().parents[2]
SEED_DOC: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())


def spec_of(doc: dict[str, Any], **scaling: Any) -> BatchedModelSpec:
    d = copy.deepcopy(doc)
    d["spec"].setdefault("scaling", {}).update(scaling)
    return load_model(d).spec


@pytest.fixture(scope="module")
def spec() -> BatchedModelSpec:
    return spec_of(SEED_DOC)


@pytest.fixture(scope="module")
def setup(spec: BatchedModelSpec) -> Setup:
    return prepare(spec, seed=0)


SHORT = traces.spike(150.0, 320.0, start_s=120.0, length_s=90.0, duration_s=330.0, seed=4)


@pytest.fixture(scope="module")
def short(spec: BatchedModelSpec, setup: Setup) -> Comparison:
    return compare(spec, SHORT, POLICIES, setup=setup)


def obs(**kw: Any) -> Observation:
    base: dict[str, Any] = {
        "now_s": 0.0,
        "current": 4,
        "ready": 4,
        "starting": 0,
        "window_s": 60.0,
        "request_rate_rps": 100.0,
        "completed": 6000,
        "avg_batch_size": 2.0,
        "queue_time_ms": 5.0,
        "p99_ms": 30.0,
        "pending_requests": 0,
        "gpu_utilization": 0.5,
    }
    return Observation(**{**base, **kw})


# ---------------------------------------------------------------------------------------------------- prepare


def test_prepare_uses_the_plan_and_its_capacity(spec: BatchedModelSpec, setup: Setup) -> None:
    result = plan_batching(spec, seed=0)
    assert setup.capacity_rps == result.chosen.capacity_rps
    assert setup.plan == result.to_status()
    assert setup.batcher == result.chosen.batcher
    assert setup.fill_at_target == result.batch_fill_at_target
    u = spec.scaling.targetUtilization
    assert setup.per_replica_target_rps == pytest.approx(u * setup.capacity_rps)
    assert setup.gpus_per_replica == 1
    # the profile 1: 10 ms, 4: 28 ms, 8: 50 ms, interpolated linearly up to the planned max batch size
    cap = setup.batcher.batch_cap
    assert len(setup.latency_ms) == cap + 1
    expected = [0.0, 10.0, 16.0, 22.0, 28.0, 33.5, 39.0, 44.5, 50.0][: cap + 1]
    assert list(setup.latency_ms) == pytest.approx(expected)


def test_prepare_targets_are_plausible(setup: Setup) -> None:
    budget = setup.plan.serverBudgetMs
    assert budget == 90.0
    # one replica at u·C keeps the SLA, so its mean queue time is well inside T and its GPU is busy but not full
    assert 0.001 <= setup.queue_ms_at_target < budget / 4, setup.queue_ms_at_target
    assert 0.3 < setup.gpu_busy_at_target <= 1.0, setup.gpu_busy_at_target
    assert setup.fill_at_target is not None
    assert 0.0 < setup.fill_at_target <= 1.0


def test_prepare_without_profile_raises() -> None:
    doc = copy.deepcopy(SEED_DOC)
    del doc["spec"]["profile"]
    with pytest.raises(CompareError, match=r"spec\.profile is required"):
        prepare(load_model(doc).spec)


# ---------------------------------------------------------------------------------------------------- static peak


@pytest.mark.parametrize(
    ("minutes", "duration", "capacity", "expected"),
    [
        ([600, 6000, 3000], 180.0, 30.0, 4),  # peak 100 req/s / 30 -> ceil(3.33)
        ([600, 5400, 3000], 180.0, 30.0, 3),  # peak 90 req/s / 30 = 3 exactly
        ([0, 0], 120.0, 10.0, 1),  # no traffic: still one replica
        ([60, 60], 90.0, 1.0, 2),  # the last minute is 30 s long: 60 arrivals are 2 req/s
        ([6601], 60.0, 110.0, 2),
    ],
)
def test_static_peak_replicas(minutes: list[int], duration: float, capacity: float, expected: int) -> None:
    assert static_peak_replicas(np.asarray(minutes, dtype=np.int64), duration, capacity) == expected


def test_arrivals_per_minute_counts_the_trace() -> None:
    trace = traces.replay([1.0, 0.0, 3.0], seed=1)
    a = trace.arrivals()
    assert arrivals_per_minute(trace).tolist() == np.bincount((a // 60).astype(np.int64), minlength=3).tolist()


# ---------------------------------------------------------------------------------------------------- autoscalers


def test_make_autoscaler_knows_every_policy(setup: Setup) -> None:
    kinds = {
        "batchfill": BatchfillAutoscaler,
        "hpa-gpu": HorizontalPodAutoscaler,
        "keda-rps": HorizontalPodAutoscaler,
        "keda-queue": HorizontalPodAutoscaler,
        "static-peak": StaticAutoscaler,
    }
    assert set(kinds) == set(POLICIES)
    for name in POLICIES:
        auto = make_autoscaler(name, setup, Options(), 3)
        assert isinstance(auto, kinds[name]), name
        assert auto.name == name


def test_make_autoscaler_unknown_name_names_the_choices(setup: Setup) -> None:
    with pytest.raises(CompareError, match="unknown policy 'nope'") as e:
        make_autoscaler("nope", setup, Options(), 3)
    for name in POLICIES:
        assert name in str(e.value)


def test_baselines_use_their_documented_targets(setup: Setup) -> None:
    s = setup.spec.scaling
    gpu = make_autoscaler("hpa-gpu", setup, Options(hpa_gpu_target=0.5), 3)
    assert gpu.decide(obs(current=4, gpu_utilization=0.75)).replicas == 6  # ceil(4 x 0.75 / 0.5)
    rps = make_autoscaler("keda-rps", setup, Options(), 3)
    assert rps.decide(obs(current=2, request_rate_rps=3 * setup.per_replica_target_rps)).replicas == 3
    queue = make_autoscaler("keda-queue", setup, Options(), 3)
    assert queue.decide(obs(current=2, ready=2, queue_time_ms=2 * setup.queue_ms_at_target)).replicas == 4
    static = make_autoscaler("static-peak", setup, Options(), 7)
    assert static.decide(obs()).replicas == 7
    assert isinstance(gpu, HorizontalPodAutoscaler)
    assert (gpu.min_replicas, gpu.max_replicas) == (s.minReplicas, s.maxReplicas)


# ---------------------------------------------------------------------------------------------------- compare


def test_compare_runs_every_policy_in_order(short: Comparison, setup: Setup) -> None:
    assert [r.policy for r in short.runs] == list(POLICIES)
    assert short.setup is setup, "a given setup is reused, not planned again"
    minutes = arrivals_per_minute(SHORT)
    for r in short.runs:
        assert r.requests == int(minutes.sum()), r.policy
        assert r.arrivals_per_minute.tolist() == minutes.tolist(), r.policy
        assert r.requests == int(r.latency_histogram.sum()) + r.refused, r.policy
    assert short.mean_rps == pytest.approx(minutes.sum() / SHORT.duration_s)
    spans = np.array([60.0] * (len(minutes) - 1) + [SHORT.duration_s - 60.0 * (len(minutes) - 1)])
    assert spans[-1] == 30.0, "the last minute of the 330 s trace is partial"
    assert short.peak_rps == pytest.approx(float((minutes / spans).max()))
    assert short.static_replicas == static_peak_replicas(minutes, SHORT.duration_s, setup.capacity_rps)
    static = short.run("static-peak")
    assert static is not None
    assert static.gpu_seconds == pytest.approx(short.static_replicas * SHORT.duration_s)
    assert static.scale_events == 0
    assert short.lower_bound_gpu_seconds == pytest.approx(
        lower_bound_gpu_seconds(minutes, setup.capacity_rps, 1, duration_s=SHORT.duration_s)
    )
    assert short.fractional_bound_gpu_seconds <= short.lower_bound_gpu_seconds
    assert short.run("nope") is None
    # the autoscaled fleets start at the load-proportional count for the first minute
    s = setup.spec.scaling
    first = replicas_for(
        minutes[0] / 60.0, setup.capacity_rps, s.targetUtilization, max(1, s.minReplicas), s.maxReplicas
    )
    ours = short.run("batchfill")
    assert ours is not None
    assert ours.ticks[0].current == first


def test_compare_keeps_the_order_asked(spec: BatchedModelSpec, setup: Setup) -> None:
    trace = traces.spike(50.0, 50.0, start_s=0.0, length_s=1.0, duration_s=60.0, seed=0)
    c = compare(spec, trace, ["static-peak", "batchfill"], setup=setup)
    assert [r.policy for r in c.runs] == ["static-peak", "batchfill"]


@pytest.mark.parametrize(
    ("policies", "options", "match"),
    [
        (["batchfill", "nope"], None, "unknown policy 'nope'; choose from batchfill, hpa-gpu"),
        (["batchfill"], Options(hpa_gpu_target=0.0), "hpa_gpu_target=0.0"),
        (["batchfill"], Options(hpa_gpu_target=1.5), "hpa_gpu_target=1.5"),
    ],
)
def test_compare_rejects(
    spec: BatchedModelSpec, setup: Setup, policies: list[str], options: Options | None, match: str
) -> None:
    with pytest.raises(CompareError, match=match):
        compare(spec, SHORT, policies, options, setup=setup)


def test_rows_have_every_policy_then_the_two_lower_bounds(short: Comparison) -> None:
    table = rows(short)
    assert [r.policy for r in table] == [*POLICIES, "lower bound", "lower bound, fractional"]
    lb, static = short.lower_bound_gpu_seconds, short.static_replicas * short.duration_s
    for row, run in zip(table, short.runs, strict=False):
        assert row.gpu_hours == pytest.approx(run.gpu_seconds / 3600.0)
        assert row.vs_lower_bound == pytest.approx(run.gpu_seconds / lb)
        assert row.vs_static == pytest.approx(run.gpu_seconds / static)
        assert row.slo_attainment == run.slo_attainment
        assert row.p99_ms == run.latency_quantile_ms(0.99)
        assert row.scale_events == run.scale_events
    bound, fractional = table[-2], table[-1]
    assert bound.vs_lower_bound == 1.0
    assert fractional.vs_lower_bound is not None
    assert fractional.vs_lower_bound <= 1.0
    assert (bound.slo_attainment, bound.p99_ms, bound.scale_events) == (None, None, None)
    static_row = table[POLICIES.index("static-peak")]
    assert static_row.vs_static == pytest.approx(1.0)
    md = markdown_table(short)
    assert md.count("\n") == len(table) + 1
    assert "| lower bound, fractional |" in md


def test_checks_report_numbers(short: Comparison) -> None:
    found = checks(short)
    targets = [k.target for k in found]
    assert len(found) == 4, targets
    assert targets[0] == "GPU-hours <= 1.15 x lower bound"
    assert targets[1] == "SLO attainment >= 99.9%"
    assert targets[2].startswith(">= 40% fewer GPU-hours than static peak")
    assert targets[3].startswith("fewer GPU-hours than HPA")
    for k in found:
        assert re.search(r"\d", k.measured), k
    for k in found[:3]:
        assert ("missed by" in k.measured) == (not k.met), k
    ours = short.run("batchfill")
    assert ours is not None
    assert found[1].met == (ours.slo_attainment >= MIN_SLO_ATTAINMENT)
    assert f"{ours.gpu_seconds / short.lower_bound_gpu_seconds:.3f} x" in found[0].measured


def test_checks_need_batchfill(spec: BatchedModelSpec, setup: Setup) -> None:
    trace = traces.spike(50.0, 50.0, start_s=0.0, length_s=1.0, duration_s=60.0, seed=0)
    assert checks(compare(spec, trace, ["static-peak"], setup=setup)) == []


def test_compare_is_deterministic(spec: BatchedModelSpec, setup: Setup) -> None:
    trace = traces.spike(120.0, 260.0, start_s=60.0, length_s=60.0, duration_s=180.0, seed=9)
    a = compare(spec, trace, ["batchfill", "hpa-gpu"], setup=setup)
    b = compare(spec, trace, ["batchfill", "hpa-gpu"], setup=setup)
    assert [(r.gpu_seconds, r.within_sla, r.refused, r.ticks) for r in a.runs] == [
        (r.gpu_seconds, r.within_sla, r.refused, r.ticks) for r in b.runs
    ]


# ---------------------------------------------------------------------------------------------------- the claim


@pytest.mark.slow
def test_miniature_benchmark_batchfill_beats_static_peak_at_sla() -> None:
    """A compressed day (2 h period) at a mean of 4 replicas' capacity: batchfill holds fewer GPU-hours than
    static peak provisioning and keeps >= 99.9 % of requests within the SLA (measured: ~10.2 vs 18.0 GPU-h,
    SLO ~100 %, 1.15 x the whole-replica lower bound)."""
    spec = spec_of(SEED_DOC, maxReplicas=64)
    st = prepare(spec, seed=0)
    trace = traces.diurnal(4 * st.capacity_rps, duration_s=7200.0, period_s=7200.0, seed=1)
    c = compare(spec, trace, ["batchfill", "static-peak"], setup=st)
    ours, static = c.run("batchfill"), c.run("static-peak")
    assert ours is not None
    assert static is not None
    summary = (
        f"batchfill {ours.gpu_hours:.2f} GPU-h, SLO {ours.slo_attainment:.5%}; static-peak {static.gpu_hours:.2f} "
        f"GPU-h ({c.static_replicas} replicas); lower bound {c.lower_bound_gpu_seconds / 3600:.2f} GPU-h"
    )
    assert ours.gpu_seconds < static.gpu_seconds, summary
    assert ours.slo_attainment >= MIN_SLO_ATTAINMENT, summary
    assert ours.refused == 0, summary
    assert math.isfinite(ours.gpu_seconds / c.lower_bound_gpu_seconds)
