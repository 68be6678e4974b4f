"""The autoscalers of the comparison (compare.autoscalers): the documented HPA algorithm, its metric sources,
and batchfill's policy wrapped for the fleet simulator.

HPA reference (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details):
``desired = ceil(current · metric / target)``, kept when the ratio is within 10 %; default behavior scales up by
at most max(100 %, 4 pods) per 15 s and down to the highest recommendation of the last 300 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from batchfill.api.spec import ScalingSpec
from batchfill.api.status import PlanStatus
from batchfill.compare.autoscalers import (
    BatchfillAutoscaler,
    HorizontalPodAutoscaler,
    HpaReason,
    MetricSource,
    StaticAutoscaler,
    gpu_utilization_metric,
    queue_time_metric,
    request_rate_metric,
    signals_from,
)
from batchfill.policy.scaling import (
    Decision,
    PlanNumbers,
    Recommendation,
    Replicas,
    Saturation,
    ScalingInput,
    decide,
)
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.sim import traces
from batchfill.sim.batcher import BatcherConfig
from batchfill.sim.fleet import FleetConfig, Observation, ScaleDecision, simulate_fleet


def obs(**kw: Any) -> Observation:
    """An observation of 4 Ready replicas with traffic; override any field."""
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
    base.update(kw)
    return Observation(**base)


def hpa(metric: MetricSource, lo: int = 1, hi: int = 100) -> HorizontalPodAutoscaler:
    return HorizontalPodAutoscaler("hpa", metric, lo, hi)


GPU80 = gpu_utilization_metric(0.8)
RPS100 = request_rate_metric(100.0)
QUEUE10 = queue_time_metric(10.0)


# ---------------------------------------------------------------------------------------------------- metric sources


@pytest.mark.parametrize(
    ("metric", "o", "expected"),
    [
        # GPU (Pods metric, averageValue): desired = current · util / target, ratio = util / target
        (GPU80, obs(current=4, gpu_utilization=0.9), (4.5, 1.125)),
        (GPU80, obs(current=5, ready=3, gpu_utilization=0.4), (2.5, 0.5)),
        (GPU80, obs(gpu_utilization=None), None),
        (GPU80, obs(current=0, ready=0, gpu_utilization=0.0), None),
        # requests/s (external metric, AverageValue): desired = total / target, ratio against current
        (RPS100, obs(current=4, ready=2, request_rate_rps=460.0), (4.6, 1.15)),
        (RPS100, obs(current=3, request_rate_rps=0.0), (0.0, 0.0)),
        # queue time (external metric, Value): desired = ready · value / target
        (QUEUE10, obs(current=5, ready=3, queue_time_ms=20.0), (6.0, 2.0)),
        (QUEUE10, obs(queue_time_ms=None), None),
    ],
)
def test_metric_source_arithmetic(metric: MetricSource, o: Observation, expected: tuple[float, float] | None) -> None:
    got = metric(o)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert got == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------------------------------------------- one tick


@pytest.mark.parametrize(
    ("metric", "o", "replicas", "reason"),
    [
        # GPU: ceil(current · util / target)
        (GPU80, obs(current=4, gpu_utilization=0.86), 4, HpaReason.WITHIN_TOLERANCE),  # ratio 1.075
        (GPU80, obs(current=4, gpu_utilization=0.88), 4, HpaReason.WITHIN_TOLERANCE),  # ratio 1.1: boundary kept
        (GPU80, obs(current=4, gpu_utilization=0.9), 5, HpaReason.SCALE_UP),  # ceil(4.5)
        (GPU80, obs(current=4, gpu_utilization=0.74), 4, HpaReason.WITHIN_TOLERANCE),  # ratio 0.925
        (GPU80, obs(current=4, gpu_utilization=0.6), 3, HpaReason.SCALE_DOWN),  # ceil(3.0)
        (GPU80, obs(current=4, gpu_utilization=0.61), 4, HpaReason.WITHIN_TOLERANCE),  # ratio 0.7625 but ceil(3.05) = 4
        # requests/s: ceil(total / target), tolerance measured against current (not ready)
        (RPS100, obs(current=4, ready=2, request_rate_rps=430.0), 4, HpaReason.WITHIN_TOLERANCE),  # 430/400 = 1.075
        (RPS100, obs(current=4, ready=2, request_rate_rps=460.0), 5, HpaReason.SCALE_UP),
        (RPS100, obs(current=4, request_rate_rps=250.0), 3, HpaReason.SCALE_DOWN),  # ceil(2.5)
        # queue time (Value): ceil(ready · value / target)
        (QUEUE10, obs(current=5, ready=3, queue_time_ms=20.0), 6, HpaReason.SCALE_UP),
        (QUEUE10, obs(current=4, ready=4, queue_time_ms=10.5), 4, HpaReason.WITHIN_TOLERANCE),
        (QUEUE10, obs(current=4, ready=4, queue_time_ms=5.0), 2, HpaReason.SCALE_DOWN),
        # a metric that cannot be computed holds (the HPA's FailedGetMetric)
        (GPU80, obs(gpu_utilization=None), 4, HpaReason.FAILED_GET_METRIC),
        (QUEUE10, obs(current=7, queue_time_ms=None), 7, HpaReason.FAILED_GET_METRIC),
        # the HPA does not act on a Deployment scaled to zero
        (RPS100, obs(current=0, ready=0, request_rate_rps=500.0), 0, HpaReason.SCALING_DISABLED),
    ],
)
def test_first_tick(metric: MetricSource, o: Observation, replicas: int, reason: str) -> None:
    d = hpa(metric).decide(o)
    assert (d.replicas, d.reason) == (replicas, reason)


@pytest.mark.parametrize(
    ("current", "wanted", "limit"),
    [
        (1, 50, 5),  # max(2 x 1, 1 + 4)
        (2, 50, 6),  # max(4, 6)
        (4, 50, 8),  # max(8, 8)
        (5, 50, 10),  # max(10, 9)
        (10, 50, 20),  # max(20, 14)
        (10, 19, 19),  # within the limit: all of it
    ],
)
def test_scale_up_is_limited_per_tick(current: int, wanted: int, limit: int) -> None:
    # request-rate metric: total = wanted x target gives exactly `wanted`
    d = hpa(RPS100).decide(obs(current=current, ready=current, request_rate_rps=100.0 * wanted))
    assert d.replicas == limit
    assert d.reason == (HpaReason.SCALE_UP if wanted <= limit else HpaReason.SCALE_UP_LIMITED)


def test_scale_up_limit_repeats_every_tick() -> None:
    auto = hpa(RPS100)
    current, seen = 1, []
    for k in range(5):
        current = auto.decide(obs(now_s=15.0 * k, current=current, ready=current, request_rate_rps=6000.0)).replicas
        seen.append(current)
    assert seen == [5, 10, 20, 40, 60]


@pytest.mark.parametrize(
    ("o", "lo", "hi", "replicas", "reason"),
    [
        (obs(current=4, gpu_utilization=0.0), 2, 10, 2, HpaReason.SCALE_DOWN),  # rec 0 -> minReplicas
        # rec 5 -> max 4
        (obs(current=4, gpu_utilization=1.0, request_rate_rps=0), 1, 4, 4, HpaReason.WITHIN_TOLERANCE),
        (obs(current=10, gpu_utilization=0.8), 1, 6, 6, HpaReason.SCALE_DOWN),  # within tolerance but above max
        (obs(current=1, gpu_utilization=0.8), 3, 10, 3, HpaReason.SCALE_UP),  # below min
        (obs(current=4, gpu_utilization=8.0), 1, 7, 7, HpaReason.SCALE_UP),  # rec 40 -> 7, within the step limit
    ],
)
def test_min_and_max_bound_the_recommendation(o: Observation, lo: int, hi: int, replicas: int, reason: str) -> None:
    d = hpa(GPU80, lo, hi).decide(o)
    assert (d.replicas, d.reason) == (replicas, reason)


def test_scale_down_waits_for_the_high_recommendation_to_age_out() -> None:
    auto = hpa(RPS100)
    assert auto.decide(obs(now_s=0.0, current=10, request_rate_rps=1000.0)).replicas == 10
    current = 10
    for t in np.arange(15.0, 300.0, 15.0):
        d = auto.decide(obs(now_s=float(t), current=current, request_rate_rps=200.0))
        assert (d.replicas, d.reason) == (10, HpaReason.SCALE_DOWN_STABILIZED), f"t={t}: the 10 of t=0 is within 300 s"
    d = auto.decide(obs(now_s=300.0, current=10, request_rate_rps=200.0))
    assert (d.replicas, d.reason) == (2, HpaReason.SCALE_DOWN), "at t=300 the recommendation of t=0 is 300 s old: gone"


def test_scale_down_takes_the_highest_recommendation_of_the_window() -> None:
    auto = hpa(RPS100)
    for t, rps in [(0.0, 1000.0), (100.0, 700.0), (200.0, 400.0)]:
        auto.decide(obs(now_s=t, current=10, request_rate_rps=rps))
    assert auto.decide(obs(now_s=250.0, current=10, request_rate_rps=300.0)).replicas == 10
    # t=0 ages out; highest left: 7 (t=100)
    assert auto.decide(obs(now_s=310.0, current=10, request_rate_rps=300.0)).replicas == 7
    # t=100 ages out at 400; left: 4 (t=200) and 3
    assert auto.decide(obs(now_s=400.0, current=7, request_rate_rps=300.0)).replicas == 4


def test_failed_metric_records_no_recommendation() -> None:
    auto = hpa(QUEUE10)
    auto.decide(obs(now_s=0.0, current=4, queue_time_ms=None))
    assert len(auto.recommendations) == 0
    d = auto.decide(obs(now_s=15.0, current=4, queue_time_ms=2.5))
    assert (d.replicas, d.reason) == (1, HpaReason.SCALE_DOWN), "nothing held the scale-down back"


def test_static_autoscaler_always_answers_its_count() -> None:
    auto = StaticAutoscaler(3)
    assert auto.name == "static"
    for o in [obs(current=1), obs(current=9, gpu_utilization=None), obs(current=0, ready=0)]:
        assert auto.decide(o) == ScaleDecision(3, "Static")


# ---------------------------------------------------------------------------------------------------- batchfill

PLAN = PlanStatus(
    maxBatchSize=4,
    preferredBatchSizes=[4],
    maxQueueDelayMicroseconds=2_000,
    instanceCount=1,
    serverBudgetMs=40.0,
    capacityPerReplicaRps=150.0,
    predictedP99Ms=35.0,
    minClientTimeoutMs=50.0,
    rule="test plan",
    batchFillAtTarget=0.6,
)
SCALING = ScalingSpec(minReplicas=1, maxReplicas=12, targetUtilization=0.8, scaleDownStabilizationSeconds=120)


@pytest.mark.parametrize(
    ("o", "max_batch", "state", "fill"),
    [
        (obs(completed=0, request_rate_rps=0.0, avg_batch_size=None, pending_requests=3), 4, SignalState.IDLE, None),
        (obs(avg_batch_size=2.0), 4, SignalState.OK, 0.5),
        (obs(avg_batch_size=9.0), 8, SignalState.OK, 1.0),  # capped at 1
        (obs(avg_batch_size=1.0), 0, SignalState.OK, None),  # batching off: no fill
        (obs(avg_batch_size=None), 4, SignalState.OK, None),
    ],
)
def test_signals_from(o: Observation, max_batch: int, state: SignalState, fill: float | None) -> None:
    s = signals_from(o, max_batch)
    assert s.state == state
    assert s.batch_fill == fill
    assert s.pods == o.ready
    assert s.window_s == o.window_s
    assert s.pending_requests == float(o.pending_requests)
    if state == SignalState.IDLE:
        assert (s.request_rate_rps, s.inference_rate_rps) == (0.0, 0.0)
        assert (s.avg_batch_size, s.queue_time_ms, s.p99_ms) == (None, None, None)
    else:
        assert s.request_rate_rps == s.inference_rate_rps == o.request_rate_rps
        assert (s.avg_batch_size, s.queue_time_ms, s.p99_ms) == (o.avg_batch_size, o.queue_time_ms, o.p99_ms)


def expected_signals(o: Observation) -> ModelSignals:
    """The operator's signals for ``o``, written out independently of signals_from."""
    if o.completed == 0:
        return ModelSignals(
            state=SignalState.IDLE,
            window_s=o.window_s,
            pods=o.ready,
            request_rate_rps=0.0,
            inference_rate_rps=0.0,
            pending_requests=float(o.pending_requests),
        )
    return ModelSignals(
        state=SignalState.OK,
        window_s=o.window_s,
        pods=o.ready,
        request_rate_rps=o.request_rate_rps,
        inference_rate_rps=o.request_rate_rps,
        avg_batch_size=o.avg_batch_size,
        batch_fill=None if o.avg_batch_size is None else min(1.0, o.avg_batch_size / PLAN.maxBatchSize),
        queue_time_ms=o.queue_time_ms,
        p99_ms=o.p99_ms,
        pending_requests=float(o.pending_requests),
    )


def replay_decide(observations: list[Observation]) -> list[tuple[int, str]]:
    """policy.scaling.decide called directly on each observation, carrying the history and the saturation."""
    history: tuple[Recommendation, ...] = ()
    saturation: Saturation | None = None
    numbers = PlanNumbers(
        capacity_rps=150.0, max_batch_size=4, max_queue_delay_us=2_000, server_budget_ms=40.0, batch_fill_at_target=0.6
    )
    out = []
    for o in observations:
        reps = Replicas(current=o.current, ready=o.ready, starting=o.starting)
        d = decide(ScalingInput(o.now_s, expected_signals(o), numbers, SCALING, reps, history, saturation))
        history, saturation = d.history, d.saturation
        out.append((d.desired_replicas, d.reason))
    return out


def test_batchfill_equals_decide_on_a_scripted_sequence() -> None:
    seq = [
        obs(now_s=15.0, current=2, ready=2, request_rate_rps=100.0, avg_batch_size=1.2),
        obs(now_s=30.0, current=2, ready=2, request_rate_rps=400.0, avg_batch_size=3.5, queue_time_ms=12.0),
        obs(now_s=45.0, current=4, ready=2, starting=2, request_rate_rps=420.0, avg_batch_size=3.9),
        obs(now_s=60.0, current=4, ready=4, request_rate_rps=420.0, avg_batch_size=2.4, p99_ms=38.0),
        obs(now_s=75.0, current=4, ready=4, request_rate_rps=150.0, avg_batch_size=1.1),
        obs(now_s=90.0, current=4, ready=4, completed=0, request_rate_rps=0.0, avg_batch_size=None),
        *[
            obs(now_s=90.0 + 15.0 * k, current=4, ready=4, completed=0, request_rate_rps=0.0, avg_batch_size=None)
            for k in range(1, 12)
        ],
        obs(now_s=300.0, current=1, ready=1, request_rate_rps=900.0, avg_batch_size=4.0, queue_time_ms=50.0),
        obs(now_s=315.0, current=2, ready=1, starting=1, request_rate_rps=900.0, avg_batch_size=4.0),
    ]
    auto = BatchfillAutoscaler(PLAN, SCALING)
    got = [(d.replicas, d.reason) for d in (auto.decide(o) for o in seq)]
    assert got == replay_decide(seq)
    # the sequence exercised more than one rule
    assert len({r for _, r in got}) >= 4, got
    assert auto.history, "history is carried"


@dataclass
class Recording:
    """Wraps an autoscaler inside simulate_fleet and keeps what it saw and said."""

    inner: BatchfillAutoscaler
    name: str = "recording"
    seen: list[Observation] = field(default_factory=list)
    said: list[tuple[int, str]] = field(default_factory=list)

    def decide(self, o: Observation) -> ScaleDecision:
        d = self.inner.decide(o)
        self.seen.append(o)
        self.said.append((d.replicas, d.reason))
        return d


def test_batchfill_equals_decide_on_simulated_observations() -> None:
    # a fleet whose replicas serve up to 4 per 22 ms; 100 -> 600 req/s spike, then quiet
    trace = traces.spike(100.0, 600.0, start_s=120.0, length_s=180.0, duration_s=900.0, seed=2)
    config = FleetConfig(
        batcher=BatcherConfig(max_batch_size=4, preferred_batch_sizes=(4,), max_queue_delay_us=2_000),
        latency_ms=(0.0, 10.0, 14.0, 18.0, 22.0),
        budget_ms=40.0,
        startup_s=30.0,
    )
    rec = Recording(BatchfillAutoscaler(PLAN, SCALING))
    run = simulate_fleet(trace, config, rec)
    assert len(rec.seen) == 59
    assert rec.said == replay_decide(rec.seen)
    assert run.scale_events >= 2, "the spike made it scale out and back in"
    reasons = {r for _, r in rec.said}
    assert any(r.startswith("ScaleOut") for r in reasons), reasons
    assert any(r.startswith("ScaleIn") for r in reasons), reasons


def test_batchfill_history_is_what_decide_returned() -> None:
    auto = BatchfillAutoscaler(PLAN, SCALING)
    o = obs(now_s=15.0, current=2, ready=2, request_rate_rps=100.0)
    auto.decide(o)
    assert auto.history[-1] == Recommendation(15.0, auto.history[-1].replicas, 2)
    first = auto.history
    auto.decide(replace(o, now_s=30.0))
    assert auto.history[: len(first)] == first
    assert auto.history[-1].time == 30.0


def test_ratio_at_the_tolerance_edge_keeps_the_count() -> None:
    # ratio 0.9: |ratio - 1| <= 0.1, so 4 is kept (without the tolerance ceil(3.6) would also give 4; at 0.85
    # it gives ceil(3.4) = 4 too, so the edge is checked on 10 replicas: 900 / 1000 -> 10, 890 / 1000 -> 9)
    assert hpa(RPS100).decide(obs(current=10, request_rate_rps=900.0)).replicas == 10
    assert hpa(RPS100).decide(obs(current=10, request_rate_rps=890.0)).replicas == 9


def test_gpu_utilization_scale_down_waits_out_the_stabilization_window() -> None:
    # 10 replicas 90 % busy at t=0 (rec ceil(10 x 0.9 / 0.8) = 12, limited to the step), then 20 % busy: the
    # proportional count ceil(10 x 0.2 / 0.8) = 3 applies only when the t=0 recommendation is 300 s old
    auto = hpa(GPU80)
    assert auto.decide(obs(now_s=0.0, current=10, gpu_utilization=0.9)).replicas == 12
    for t in np.arange(15.0, 300.0, 15.0):
        d = auto.decide(obs(now_s=float(t), current=10, gpu_utilization=0.2))
        assert (d.replicas, d.reason) == (10, HpaReason.SCALE_DOWN_STABILIZED), f"t={t}"
    d = auto.decide(obs(now_s=300.0, current=10, gpu_utilization=0.2))
    assert (d.replicas, d.reason) == (3, HpaReason.SCALE_DOWN)


@pytest.mark.parametrize(
    ("util", "replicas"),
    [
        (0.721, 10),  # ratio 0.90125: within the tolerance, kept (0.72 / 0.8 is 0.8999... in floats, as in Go)
        (0.71, 9),  # ratio 0.8875: ceil(8.875)
        (0.88, 10),  # ratio 1.1: kept
        (0.89, 12),  # ratio 1.1125: ceil(11.125)
    ],
)
def test_gpu_utilization_tolerance_is_ten_percent_of_the_target(util: float, replicas: int) -> None:
    assert hpa(GPU80).decide(obs(current=10, gpu_utilization=util)).replicas == replicas


def test_batchfill_reads_the_rate_variability_of_its_own_ticks() -> None:
    """Ticks every 15 s at a constant rate: no estimate until 60 changes over 60 s exist (the 64th tick), then 0
    (u' = maxTargetUtilization); an hour of ticks keeps only the horizon and the lag."""
    auto = BatchfillAutoscaler(PLAN, SCALING)
    got = [auto.rate_variability(obs(now_s=15.0 * k)) for k in range(1, 241)]
    assert got[:63] == [None] * 63
    assert got[63:] == [0.0] * (240 - 63)
    assert len(auto.rates) == (1800 + 60) // 15
    seen: list[ScalingInput] = []

    def spy(inp: ScalingInput) -> Decision:
        seen.append(inp)
        return decide(inp)

    auto.step(obs(now_s=15.0 * 241), SCALING, PlanNumbers.from_status(PLAN), spy)
    assert seen[0].signals.rate_change_rms == 0.0
    swinging = BatchfillAutoscaler(PLAN, SCALING)
    for k in range(1, 241):
        swinging.rate_variability(obs(now_s=15.0 * k, request_rate_rps=100.0 * (1.5 if (k // 4) % 2 else 1.0)))
    noisy = swinging.rate_variability(obs(now_s=15.0 * 241, request_rate_rps=100.0))
    assert noisy == pytest.approx(math.log(1.5))  # every 60 s change is 1.5 x up or down
