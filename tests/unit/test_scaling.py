"""The scaling decision (policy.scaling): exact tables, tick sequences for the field cases, and properties.

Reference plan: capacity at SLA C = 50 rps per replica, max_batch_size 8, queue delay 100 µs, T = 90 ms.
With targetUtilization 0.8 one replica is meant to carry u·C = 40 rps, so ``needed = rate / 40``.
Risk thresholds: p99 ≥ 81 ms (0.9·T) or queue time beyond the delay ≥ 22.5 ms (T/4).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from batchfill.api.reasons import ScalingReason, SignalsReason
from batchfill.api.spec import ScalingMode, ScalingSpec
from batchfill.api.status import PlanStatus
from batchfill.policy.scaling import (
    Decision,
    PlanNumbers,
    Recommendation,
    Replicas,
    Saturation,
    ScalingInput,
    compact_history,
    decide,
    expand_history,
    history_horizon_s,
    history_to_store,
)
from batchfill.policy.signals import ModelSignals, SignalState

R = ScalingReason  # short, for the tables

NOW = 10_000.0
PLAN = PlanNumbers(capacity_rps=50.0, max_batch_size=8, max_queue_delay_us=100, server_budget_ms=90.0)
PENDING_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def ok(rate: float, fill: float = 0.5, queue: float = 2.0, p99: float | None = 40.0, **kw: Any) -> ModelSignals:
    """Traffic at ``rate`` rps, one sample per request, average batch = fill · 8."""
    return ModelSignals(
        state=SignalState.OK,
        pods=kw.pop("pods", 2),
        request_rate_rps=rate,
        inference_rate_rps=kw.pop("inference", rate),
        avg_batch_size=kw.pop("batch", fill * 8),
        batch_fill=fill,
        queue_time_ms=queue,
        p99_ms=p99,
        **kw,
    )


#: The batch fill of a light load: 40 rps over 3 or 4 replicas fills about 1 of 8 per batch, so one replica can
#: carry it without saturating (fill·ready/n stays below the saturation fill 0.8 on the scale-in target n).
LIGHT = 0.15

IDLE = ModelSignals(state=SignalState.IDLE, pods=3, request_rate_rps=0.0, inference_rate_rps=0.0, queue_time_ms=0.0)
UNKNOWN = ModelSignals.unknown(SignalsReason.PROMETHEUS_UNAVAILABLE, "connection refused")


def run(
    signals: ModelSignals,
    current: int,
    ready: int | None = None,
    *,
    starting: int = 0,
    pending: int = 0,
    failing: int = 0,
    history: tuple[Recommendation, ...] | None = None,
    now: float = NOW,
    plan: PlanNumbers = PLAN,
    saturation: Saturation | None = None,
    **scaling: Any,
) -> Decision:
    """One decision; by default the previous tick (15 s ago, same Ready count) voted for 0 (nothing held back)."""
    spec = ScalingSpec(**{"minReplicas": 1, "maxReplicas": 8, "targetUtilization": 0.8, **scaling})
    ready = current if ready is None else ready
    if history is None:
        history = (Recommendation(now - 15, 0, ready),)
    reps = Replicas(
        current, ready, starting, pending, PENDING_GPU if pending else "", failing, CRASHING if failing else ""
    )
    return decide(ScalingInput(now, signals, plan, spec, reps, history, saturation))


CRASHING = "m-triton-7d59-x2: CrashLoopBackOff (triton exited 1, 3 restarts)"


def votes(*pairs: tuple[float, int]) -> tuple[Recommendation, ...]:
    """History entries (seconds before NOW, replicas); ready as voted."""
    return tuple(Recommendation(NOW - ago, n, n) for ago, n in pairs)


QUIET = None  # run()'s default history: nothing holds a scale-in back


@pytest.mark.parametrize(
    ("signals", "current", "ready", "history", "desired", "reason", "recommendation"),
    [
        # saturated: 100 rps needs 2.5 -> 3; the running 2 are full
        pytest.param(ok(100, fill=0.9), 2, 2, QUIET, 3, R.SCALE_OUT_SATURATED, 3, id="ramp-saturated"),
        # saturated although the plan says 60 rps fits on 2: the measured fill wins, one more
        pytest.param(ok(60, fill=0.85), 2, 2, QUIET, 3, R.SCALE_OUT_SATURATED, 2, id="saturated-plan-optimistic"),
        # 240 rps needs 6, but one tick at most doubles: 2 -> 4
        pytest.param(ok(240, fill=0.95), 2, 2, QUIET, 4, R.SCALE_OUT_SATURATED, 6, id="step-bound-doubling"),
        # high rate by the plan, but low fill, short queue, p99 fine: the running replicas keep up
        pytest.param(ok(200, fill=0.3), 2, 2, QUIET, 2, R.HOLD_NOT_SATURATED, 5, id="high-rate-low-fill"),
        # too little headroom: 100 rps needs 3, and at 1/u = 1.25 x the load a fill of 0.7 (5.6 of 8 per batch)
        # would reach the saturation fill 0.8 (its 4.6 samples beyond the first grow to 5.75 >= 5.4)
        pytest.param(ok(100, fill=0.7), 2, 2, QUIET, 3, R.SCALE_OUT_LOW_HEADROOM, 3, id="low-headroom"),
        # the same rate at a fill of 0.6: its 3.8 samples beyond the first grow to 4.75 < 5.4, room enough
        pytest.param(ok(100, fill=0.6), 2, 2, QUIET, 2, R.HOLD_NOT_SATURATED, 3, id="headroom-enough"),
        # a fill within the headroom, but the rate fits the running count within the tolerance (84 rps: 2.1)
        pytest.param(ok(84, fill=0.7), 2, 2, QUIET, 2, R.HOLD_WITHIN_TOLERANCE, 3, id="low-headroom-rate-fits"),
        # the step is on the way (1 of 3 starting): the rate asks for no more than the 3, so no second step
        pytest.param(ok(100, fill=0.7), 3, 2, QUIET, 3, R.HOLD_WITHIN_TOLERANCE, 3, id="low-headroom-in-flight"),
        # SLA at risk at a moderate rate (p99 85 ≥ 81, requests queue 15 ms ≥ T/8): one more replica
        pytest.param(
            ok(60, fill=0.5, queue=15.0, p99=85), 2, 2, QUIET, 3, R.SCALE_OUT_SLA_AT_RISK, 2, id="p99-at-risk"
        ),
        # the same p99 while the window's queue time is 2 ms: the summary's older minute, not the load now
        pytest.param(ok(60, fill=0.5, p99=85), 2, 2, QUIET, 2, R.HOLD_WITHIN_TOLERANCE, 2, id="stale-p99"),
        # no p99 summary, but requests wait 25 ms beyond the 0.1 ms delay (≥ 22.5)
        pytest.param(ok(60, queue=25.0, p99=None), 2, 2, QUIET, 3, R.SCALE_OUT_SLA_AT_RISK, 2, id="queue-at-risk"),
        # 40 rps fits on 1, but 3 was recommended 200 s ago (window 300 s)
        pytest.param(ok(40), 3, 3, votes((200, 3)), 3, R.HOLD_STABILIZING, 1, id="scale-in-waits"),
        # the 3 was recommended exactly 300 s ago: out of the window, scale in
        pytest.param(
            ok(40, LIGHT), 3, 3, votes((300, 3), (100, 1)), 1, R.SCALE_IN_LOAD_FITS, 1, id="scale-in-after-window"
        ),
        # the window's largest vote (2) limits the scale-in
        pytest.param(
            ok(40, LIGHT), 4, 4, votes((250, 2), (100, 1)), 2, R.SCALE_IN_LOAD_FITS, 1, id="scale-in-to-window-max"
        ),
        # a fresh start (no history, or a gap longer than the window) never scales in on its first tick
        pytest.param(ok(40), 3, 3, (), 3, R.HOLD_STABILIZING, 1, id="restart-no-history"),
        pytest.param(IDLE, 3, 3, votes((290, 3)), 3, R.HOLD_STABILIZING, 0, id="idle-stabilizing"),
        pytest.param(IDLE, 3, 3, votes((300, 3), (15, 1)), 1, R.SCALE_IN_IDLE, 0, id="idle-scale-in"),
        pytest.param(IDLE, 1, 1, QUIET, 1, R.HOLD_IDLE, 0, id="idle-at-min"),
        pytest.param(UNKNOWN, 4, 4, votes((100, 1)), 4, R.HOLD_METRICS_UNKNOWN, None, id="unknown-holds"),
        # a scale-out is in flight (1 of 3 starting): the same saturation adds nothing
        pytest.param(ok(100, fill=0.9), 3, 2, QUIET, 3, R.HOLD_CAPACITY_ON_THE_WAY, 3, id="in-flight-same-load"),
        # ... but a load beyond what is on the way (200 rps -> 5) still scales, bounded by doubling
        pytest.param(ok(200, fill=0.9), 3, 2, QUIET, 5, R.SCALE_OUT_SATURATED, 5, id="in-flight-more-load"),
        # 37 rps per replica on 10: needs 9.25, within 10 % of 10 -> keep
        pytest.param(ok(370), 10, 10, QUIET, 10, R.HOLD_WITHIN_TOLERANCE, 10, id="tolerance-holds"),
        # 350 -> 8.75, 12.5 % below 10 -> 9
        pytest.param(ok(350), 10, 10, QUIET, 9, R.SCALE_IN_LOAD_FITS, 9, id="tolerance-exceeded"),
    ],
)
def test_decision_table(
    signals: ModelSignals,
    current: int,
    ready: int,
    history: tuple[Recommendation, ...],
    desired: int,
    reason: str,
    recommendation: int | None,
) -> None:
    d = run(signals, current, ready, history=history, maxReplicas=16)
    assert (d.desired_replicas, d.reason, d.recommendation) == (desired, reason, recommendation)
    assert d.apply == (desired != current)
    assert d.metrics_available == (signals.state != SignalState.UNKNOWN)
    assert d.history[-1] == Recommendation(NOW, d.history[-1].replicas, ready)
    assert all(NOW - 300 < h.time <= NOW for h in d.history)
    assert "nan" not in d.message.lower()


def test_flags_and_message_carry_the_numbers() -> None:
    d = run(ok(100, fill=0.9, queue=3.0, p99=60.0), 2)
    assert (d.saturated, d.sla_at_risk, d.low_concurrency, d.capacity_limited) == (True, False, False, False)
    assert d.message == (
        "saturated: 2 -> 3; load 100 rps on 2 Ready of 2 replicas at 50 rps each (target 80%: needs 2.50); "
        "fill 0.9, avg batch 7.2, queue 3 ms (delay 0.1 ms), p99 60 ms vs T 90 ms"
    )


def test_c04_low_concurrency_is_not_overload() -> None:
    """One sequential client at 10 rps, max_batch_size 32, delay 50 ms: queue 50 ms ≈ delay, batches of 1."""
    c04 = PlanNumbers(capacity_rps=200.0, max_batch_size=32, max_queue_delay_us=50_000, server_budget_ms=90.0)
    signals = ok(10, fill=1 / 32, batch=1.0, queue=50.0, p99=55.0)
    d = run(signals, 1, plan=c04)
    assert (d.desired_replicas, d.reason, d.low_concurrency, d.sla_at_risk) == (1, R.HOLD_WITHIN_TOLERANCE, True, False)
    # more replicas than the load needs fall to minReplicas; never up
    assert run(signals, 3, plan=c04).desired_replicas == 1
    # even a p99 near T (85 ≥ 81) is waiting for partners (queue ≈ delay), not for a GPU: never a scale-out
    d = run(ok(10, fill=1 / 32, batch=1.0, queue=50.0, p99=85.0), 2, plan=c04, history=votes((15, 2)))
    assert (d.desired_replicas, d.sla_at_risk, d.low_concurrency) == (2, False, True)
    assert not d.reason.startswith("ScaleOut")
    # queue well beyond the delay is waiting for a GPU again: no longer low concurrency
    assert run(ok(10, fill=1 / 32, batch=1.0, queue=80.0, p99=85.0), 2, plan=c04).low_concurrency is False


def test_samples_count_not_requests() -> None:
    """Requests of 4 samples (docs/field-cases.md#average-batch-size): the batcher fills samples, so 50 req/s are
    200 samples/s -> 5."""
    d = run(ok(50, inference=200, fill=0.9), 2)
    assert (d.recommendation, d.desired_replicas) == (5, 4)


def test_without_batching_load_per_replica_is_the_saturation_evidence() -> None:
    plan = PlanNumbers(capacity_rps=50.0, max_batch_size=0, max_queue_delay_us=0, server_budget_ms=90.0)
    none = ModelSignals(state=SignalState.OK, pods=2, request_rate_rps=90.0, queue_time_ms=1.0, p99_ms=30.0)
    assert run(none, 2, plan=plan).reason == R.SCALE_OUT_SATURATED  # 45 rps/replica ≥ 40
    assert run(replace_rate(none, 70.0), 2, plan=plan).reason == R.HOLD_WITHIN_TOLERANCE  # needs 1.75


def replace_rate(s: ModelSignals, rate: float) -> ModelSignals:
    return ModelSignals(
        state=s.state, pods=s.pods, request_rate_rps=rate, queue_time_ms=s.queue_time_ms, p99_ms=s.p99_ms
    )


def test_pending_for_gpu_is_reported_and_blocks_scale_out() -> None:
    d = run(ok(200, fill=0.95), 3, 2, pending=1)
    assert (d.desired_replicas, d.reason, d.capacity_limited) == (3, R.HOLD_REPLICAS_PENDING, True)
    assert (d.pending_replicas, d.pending_reason) == (1, PENDING_GPU)
    assert d.message.endswith("; 1 Pending: " + PENDING_GPU)
    # the pending pod is removed again when the load fits on fewer
    d = run(ok(30, LIGHT), 3, 2, pending=1)
    assert (d.desired_replicas, d.reason) == (1, R.SCALE_IN_LOAD_FITS)


@pytest.mark.parametrize(
    ("signals", "current", "kw", "desired", "reason", "limited"),
    [
        pytest.param(UNKNOWN, 10, {}, 8, R.ABOVE_MAX_REPLICAS, False, id="above-max-even-unknown"),
        pytest.param(UNKNOWN, 0, {}, 1, R.BELOW_MIN_REPLICAS, False, id="below-min-even-unknown"),
        pytest.param(ok(20), 1, {"minReplicas": 2}, 2, R.BELOW_MIN_REPLICAS, False, id="below-min"),
        pytest.param(ok(400, fill=0.95), 8, {}, 8, R.AT_MAX_REPLICAS, True, id="saturated-at-max"),
        pytest.param(ok(400, fill=0.95), 6, {}, 8, R.SCALE_OUT_SATURATED, True, id="capped-at-max"),
        pytest.param(UNKNOWN, 0, {"minReplicas": 0}, 0, R.HOLD_SCALED_TO_ZERO, False, id="zero-unknown"),
        pytest.param(ok(5.0), 0, {"minReplicas": 0}, 1, R.SCALE_OUT_FROM_ZERO, False, id="zero-with-demand"),
        pytest.param(IDLE, 0, {"minReplicas": 0}, 0, R.HOLD_IDLE, False, id="zero-idle"),
        pytest.param(ok(50), 2, {"maxReplicas": 1, "minReplicas": 3}, 1, R.ABOVE_MAX_REPLICAS, False, id="min-gt-max"),
    ],
)
def test_bounds(
    signals: ModelSignals, current: int, kw: dict[str, Any], desired: int, reason: str, limited: bool
) -> None:
    d = run(signals, current, **kw)
    assert (d.desired_replicas, d.reason, d.capacity_limited) == (desired, reason, limited)


def test_no_capacity_holds() -> None:
    plan = PlanNumbers(capacity_rps=0.0, max_batch_size=8, max_queue_delay_us=100, server_budget_ms=90.0)
    d = run(ok(100, fill=0.9), 2, plan=plan)
    assert (d.desired_replicas, d.reason, d.recommendation) == (2, R.HOLD_NO_CAPACITY, None)


def test_modes() -> None:
    auto = run(ok(100, fill=0.9), 2)
    advise = run(ok(100, fill=0.9), 2, mode=ScalingMode.ADVISE)
    off = run(ok(100, fill=0.9), 2, mode=ScalingMode.OFF)
    assert (auto.desired_replicas, auto.reason, auto.apply) == (3, R.SCALE_OUT_SATURATED, True)
    assert (advise.desired_replicas, advise.reason, advise.apply) == (3, R.SCALE_OUT_SATURATED, False)
    assert advise.history == auto.history
    assert (off.desired_replicas, off.reason, off.apply) == (2, R.SCALING_OFF, False)
    assert off.message == "scaling.mode Off: keeping 2 (would be 3, ScaleOutSaturated)"
    # Off never touches replicas, not even outside the bounds
    assert run(UNKNOWN, 0, mode=ScalingMode.OFF).desired_replicas == 0


def ticks(
    series: list[tuple[float, ModelSignals, int]], current: int, pending: int = 0, **scaling: Any
) -> list[Decision]:
    """Apply decisions every 15 s; phases of (seconds, signals, Ready count or -1 for all). Replicas beyond the
    Ready ones are Pending unschedulable when ``pending`` is set, else starting."""
    out: list[Decision] = []
    history: tuple[Recommendation, ...] = votes((0, current))
    t = 0.0
    for duration, signals, ready_or_all in series:
        end = t + duration
        while t < end:
            ready = current if ready_or_all < 0 else ready_or_all
            waiting = current - ready
            d = run(
                signals,
                current,
                ready,
                starting=0 if pending else waiting,
                pending=waiting if pending else 0,
                history=history,
                now=NOW + t,
                **scaling,
            )
            out.append(d)
            current, history = d.desired_replicas, d.history
            t += 15
    return out


def test_c11_idle_scales_in_after_the_window_exactly() -> None:
    """3 replicas, traffic stops at t = 0 (last busy tick), idle for 10 min: 3 -> 1 at t = 300 s, not before."""
    ds = ticks([(600, IDLE, -1)], 3)
    first = next(i for i, d in enumerate(ds) if d.desired_replicas == 1)
    assert first * 15 == 300
    assert {d.reason for d in ds[:first]} == {R.HOLD_STABILIZING}
    assert ds[first].reason == R.SCALE_IN_IDLE
    assert {d.reason for d in ds[first + 1 :]} == {R.HOLD_IDLE}
    assert ticks([(600, IDLE, -1)], 3, minReplicas=0)[first].desired_replicas == 0


def test_c12_outage_holds_then_resumes_without_a_burst() -> None:
    """4 replicas at peak; Prometheus down 10 min; load back lower: no scale-in until a full window of data."""
    ds = ticks([(600, UNKNOWN, -1), (600, ok(40, LIGHT), -1)], 4)
    outage, after = ds[:40], ds[40:]
    assert {(d.desired_replicas, d.reason, d.apply) for d in outage} == {(4, R.HOLD_METRICS_UNKNOWN, False)}
    assert not any(d.metrics_available for d in outage)
    first = next(i for i, d in enumerate(after) if d.changes_replicas)
    assert 600 + first * 15 == 585 + 300  # a full window after the last tick without data
    assert (after[first].desired_replicas, after[first].reason) == (1, R.SCALE_IN_LOAD_FITS)
    # docs/field-cases.md C11 vs C12: same replicas and history, idle scales in, unknown holds
    h = votes((300, 4), (15, 1))
    assert run(IDLE, 4, history=h).desired_replicas == 1
    assert run(UNKNOWN, 4, history=h).desired_replicas == 4


def test_slow_model_load_does_not_chain_scale_ups() -> None:
    """The new replica needs 3 min to load; the 60 s signal window then still shows the old saturation."""
    hot, cooled = ok(100, fill=0.9), ok(100, fill=0.6)
    ds = ticks([(15, hot, 2), (165, hot, 2), (60, hot, 3), (120, cooled, 3)], 2)
    assert [d.desired_replicas for d in ds] == [3] * len(ds)
    reasons = [d.reason for d in ds]
    assert reasons[0] == R.SCALE_OUT_SATURATED
    assert set(reasons[1:12]) == {R.HOLD_CAPACITY_ON_THE_WAY}
    assert set(reasons[12:16]) == {R.HOLD_SETTLING}
    assert set(reasons[16:]) == {R.HOLD_WITHIN_TOLERANCE}  # 100 rps needs 2.5 -> 3


def test_pending_gpu_does_not_chain_scale_ups() -> None:
    """No free GPU: the third replica stays Pending for 10 min while the two Ready ones stay saturated."""
    ds = ticks([(600, ok(100, fill=0.95), 2)], 2, pending=1)
    assert (ds[0].desired_replicas, ds[0].reason) == (3, R.SCALE_OUT_SATURATED)
    assert {(d.desired_replicas, d.reason, d.capacity_limited, d.pending_replicas) for d in ds[1:]} == {
        (3, R.HOLD_REPLICAS_PENDING, True, 1)
    }
    # more load does not add pods that cannot be scheduled either
    assert run(ok(300, fill=0.95), 3, 2, pending=1).reason == R.HOLD_REPLICAS_PENDING


def test_oscillating_load_does_not_flap() -> None:
    """75 rps (needs 1.9 -> 2) and 90 rps (2.25 -> 3) alternate on 3 replicas: the window keeps 3."""
    ds = ticks([(15, ok(75), -1), (15, ok(90), -1)] * 30, 3)
    assert {d.desired_replicas for d in ds} == {3}


# --- properties -------------------------------------------------------------------------------------------------

finite = st.floats(0, 1e12, allow_nan=False, allow_infinity=False)
maybe = st.none() | finite
weird = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -1.0, 1e-300, 1e300])


@st.composite
def inputs(draw: st.DrawFn) -> ScalingInput:
    state = draw(st.sampled_from(SignalState))
    signals = (
        ModelSignals.unknown(SignalsReason.NO_SERIES, "")
        if state == SignalState.UNKNOWN
        else ModelSignals(
            state=state,
            pods=draw(st.integers(0, 50)),
            request_rate_rps=0.0 if state == SignalState.IDLE else draw(maybe),
            inference_rate_rps=draw(maybe),
            avg_batch_size=draw(maybe),
            batch_fill=draw(st.none() | st.floats(0, 1)),
            queue_time_ms=draw(maybe),
            p99_ms=draw(maybe),
            pending_requests=draw(maybe),
            rate_change_rms=draw(maybe),
        )
    )
    plan = PlanNumbers(
        draw(weird),
        draw(st.integers(0, 64)),
        draw(st.integers(0, 10**7)),
        draw(weird),
        batch_fill_at_target=draw(st.none() | weird),
        batch_fill_at_max_target=draw(st.none() | weird),
    )
    lo = draw(st.integers(0, 20))
    spec = ScalingSpec(
        minReplicas=lo,
        maxReplicas=draw(st.integers(max(lo, 1), 40)),
        targetUtilization=draw(st.floats(0.01, 1)),
        maxTargetUtilization=draw(st.floats(0.01, 1)),
        scaleDownStabilizationSeconds=draw(st.integers(0, 900)),
        mode=draw(st.sampled_from(ScalingMode)),
    )
    current = draw(st.integers(0, 50))
    replicas = Replicas(current, draw(st.integers(0, current)), pending=draw(st.integers(0, 3)))
    now = draw(st.floats(0, 1e6))
    history = tuple(
        Recommendation(now - draw(st.floats(-10, 1000)), draw(st.integers(0, 50)), draw(st.integers(0, 50)))
        for _ in range(draw(st.integers(0, 6)))
    )
    return ScalingInput(now, signals, plan, spec, replicas, history)


@settings(max_examples=400, deadline=None)
@given(inputs())
def test_property_bounds_unknown_determinism(inp: ScalingInput) -> None:
    d = decide(inp)
    s, current = inp.scaling, inp.replicas.current
    if s.mode == ScalingMode.OFF:
        assert (d.desired_replicas, d.apply) == (current, False)
    else:
        assert s.minReplicas <= d.desired_replicas <= s.maxReplicas
    if s.minReplicas <= current <= s.maxReplicas:
        assert d.desired_replicas <= max(2 * current, 1)  # step bound
        if inp.signals.state == SignalState.UNKNOWN:
            assert d.desired_replicas == current
    assert d.apply == (s.mode == ScalingMode.AUTO and d.desired_replicas != current)
    assert decide(inp) == d
    assert d.history[-1].time == inp.now
    assert all(inp.now - max(s.scaleDownStabilizationSeconds, 60) < h.time <= inp.now for h in d.history)
    assert "nan" not in d.message.lower()
    assert "inf " not in d.message.lower()
    assert d.recommendation is None or 0 <= d.recommendation <= 1_000_000
    u = d.target_utilization
    assert u is not None
    assert s.targetUtilization <= u <= max(s.targetUtilization, s.maxTargetUtilization)
    if inp.signals.state == SignalState.UNKNOWN or inp.signals.rate_change_rms is None:
        assert u == s.targetUtilization


def test_plan_numbers_from_status() -> None:
    status = PlanStatus(
        maxBatchSize=8,
        maxQueueDelayMicroseconds=100,
        instanceCount=1,
        serverBudgetMs=90.0,
        capacityPerReplicaRps=50.0,
        predictedP99Ms=88.0,
        minClientTimeoutMs=110.0,
        rule="work-conserving",
    )
    assert PlanNumbers.from_status(status) == PLAN


def test_saturation_is_the_fill_the_plan_predicts_at_target_not_the_target_utilization() -> None:
    """With work-conserving batching a replica at u·C runs batches well below max_batch_size (the seed example
    predicts 0.225 at 85 %), so fill ≥ u would never fire; the plan's predicted fill is the threshold."""
    plan = PlanNumbers(capacity_rps=50.0, max_batch_size=8, max_queue_delay_us=100, server_budget_ms=90.0,
                       batch_fill_at_target=0.3)  # fmt: skip
    below = run(ok(50.0, fill=0.25), 1, plan=plan)
    assert (below.saturated, below.desired_replicas, below.reason) == (False, 1, R.HOLD_NOT_SATURATED)
    at = run(ok(50.0, fill=0.3), 1, plan=plan)
    assert (at.saturated, at.desired_replicas, at.reason) == (True, 2, R.SCALE_OUT_SATURATED)
    # the same fill without the plan's number falls back to u = 0.8: not saturated
    assert run(ok(50.0, fill=0.3), 1).saturated is False


def test_evidence_waits_for_triton_p99_summary_window_after_a_replica_joins() -> None:
    """Triton's p99 summary keeps the time before a scale-out for ~60 s, longer than a 10 s signal window: a
    high p99 right after the second replica joined is old news, not a reason for a third (seen on the real
    operator: 1 -> 2 -> 3 for 1.5 replicas' worth of load)."""
    window = 10.0
    hot = ok(60.0, fill=0.3, queue=15.0, p99=95.0, window_s=window)  # p99 ≥ 0.9·T; load needs 2 at u·C = 40
    joined = (Recommendation(NOW - 40, 2, 1), Recommendation(NOW - 30, 2, 2))  # 2nd Ready 30 s ago
    held = run(hot, 2, 2, history=joined)
    assert (held.desired_replicas, held.reason) == (2, R.HOLD_SETTLING)
    later = (Recommendation(NOW - 70, 2, 1), Recommendation(NOW - 61, 2, 2))  # 61 s ago: the summary moved on
    acted = run(hot, 2, 2, history=later)
    assert (acted.desired_replicas, acted.reason) == (3, R.SCALE_OUT_SLA_AT_RISK)


def test_fill_evidence_settles_for_the_signal_window_only() -> None:
    """Fill describes the window, not Triton's minute-long summary: 30 s after the 2nd replica joined, a
    saturated pair scales to 3 at once (measured on real servers: 12 s faster on a ramp than waiting 60 s)."""
    full = ok(60.0, fill=0.9, window_s=10.0)
    joined = (Recommendation(NOW - 40, 2, 1), Recommendation(NOW - 30, 2, 2))
    d = run(full, 2, 2, history=joined)
    assert (d.desired_replicas, d.reason) == (3, R.SCALE_OUT_SATURATED)
    recent = (Recommendation(NOW - 8, 2, 1), Recommendation(NOW - 3, 2, 2))  # joined < 8 s ago: inside the window
    assert run(full, 2, 2, history=recent).reason == R.HOLD_SETTLING


# --- the window after a restart: status.scalingHistory ------------------------------------------------------


#: Load phases: (rate, ticks), so that a drop lasts long enough for a scale-in to be held back or happen.
PHASES = st.lists(
    st.tuples(st.sampled_from([0.0, 20.0, 60.0, 120.0, 200.0, 300.0]), st.integers(min_value=1, max_value=12)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@example(phases=[(300.0, 10), (0.0, 30)], restart_at=12, window=60)  # without the restored window: 3 ticks late
@given(phases=PHASES, restart_at=st.integers(min_value=1, max_value=90), window=st.sampled_from([0, 60, 120, 300]))
def test_a_restart_that_restores_the_compact_history_decides_as_if_nothing_happened(
    phases: list[tuple[float, int]], restart_at: int, window: int
) -> None:
    """Ticks every 15 s; at one tick the operator restarts and has only status.scalingHistory (compact): every
    decision from then on equals the uninterrupted run's."""
    rates = [rate for rate, ticks in phases for _ in range(ticks)]
    step = 15.0
    spec = ScalingSpec(minReplicas=1, maxReplicas=8, targetUtilization=0.8, scaleDownStabilizationSeconds=window)
    horizon = history_horizon_s(window, 60.0)

    def tick(t: float, rate: float, current: int, history: tuple[Recommendation, ...]) -> Decision:
        signals = ok(rate, fill=min(1.0, rate / 400), pods=current) if rate else IDLE
        return decide(ScalingInput(t, signals, PLAN, spec, Replicas(current, current, 0, 0, ""), history))

    def replay(restart: int | None) -> list[tuple[int, str]]:
        current, history, stored, out = 2, (), (), []
        for i, rate in enumerate(rates):
            t = NOW + i * step
            if i == restart:
                history = expand_history(stored, t, horizon, step)
            d = tick(t, rate, current, history)
            out.append((d.desired_replicas, d.reason))
            history = d.history
            stored = history_to_store(stored, compact_history(d.history, t, horizon)) or stored
            current = d.desired_replicas
        return out

    assert replay(restart_at) == replay(None)


def test_the_compact_history_changes_only_when_the_vote_or_ready_count_does() -> None:
    steady = tuple(Recommendation(NOW + 15 * i, 3, 3) for i in range(30))
    horizon = 300.0
    compact = compact_history(steady, NOW + 15 * 29, horizon)
    assert compact == (Recommendation(NOW, 3, 3),)  # one entry for 7 minutes of the same vote
    changed = (*steady, Recommendation(NOW + 15 * 30, 4, 3))
    assert compact_history(changed, NOW + 450, horizon) == (Recommendation(NOW, 3, 3), Recommendation(NOW + 450, 4, 3))
    # once the change is older than the horizon, the vote before it is dropped
    later = compact_history(changed, NOW + 450 + horizon, horizon)
    assert later == (Recommendation(NOW + 450, 4, 3),)
    assert expand_history(later, NOW + 800, horizon, 15.0)[0].time > NOW + 800 - horizon


def test_expand_history_rejects_a_non_positive_step() -> None:
    with pytest.raises(ValueError, match="step_s=0"):
        expand_history((Recommendation(NOW, 1, 1),), NOW + 30, 300.0, 0.0)


def test_votes_that_only_aged_out_are_not_written() -> None:
    stored = (Recommendation(NOW, 1, 0), Recommendation(NOW + 15, 1, 1))
    aged = (Recommendation(NOW + 15, 1, 1),)  # the first vote left the window; nothing new happened
    assert history_to_store(stored, aged) is None
    changed = (Recommendation(NOW + 15, 1, 1), Recommendation(NOW + 400, 2, 1))
    assert history_to_store(stored, changed) == changed
    assert history_to_store((), aged) == aged
    assert history_to_store(stored, ()) is None


def test_a_failing_replica_is_no_capacity_on_the_way_and_is_made_up_for() -> None:
    sat = ok(60, fill=0.95)  # needs 2 replicas at 40 rps each
    # 2 replicas, 1 Ready, the other crash-looping: not "on the way"; the step adds one beside the target
    d = run(sat, 2, 1, failing=1)
    assert (d.desired_replicas, d.reason, d.apply) == (3, R.SCALE_OUT_SATURATED, True)
    assert CRASHING in d.message
    # the same with the second replica merely starting: capacity on the way, hold
    d = run(sat, 2, 1, starting=1)
    assert (d.desired_replicas, d.reason) == (2, R.HOLD_CAPACITY_ON_THE_WAY)


def test_no_replica_ready_and_some_failing_holds_instead_of_adding_more_of_the_same() -> None:
    d = run(ok(100, fill=0.95), 2, 0, failing=2)
    assert (d.desired_replicas, d.reason, d.apply) == (2, R.HOLD_REPLICAS_FAILING, False)
    assert "2 failing" in d.message


def test_failing_replicas_change_nothing_when_the_load_fits() -> None:
    d = run(ok(10, fill=0.2), 3, 2, failing=1)
    assert d.reason not in (R.SCALE_OUT_SATURATED, R.HOLD_REPLICAS_FAILING)
    assert d.desired_replicas <= 3


def test_a_backlog_the_replicas_cannot_serve_in_time_scales_out_before_queue_time_shows_it() -> None:
    """Issue 15 item 2: queue time is recorded on completion, so a sudden overload first shows as pending requests.
    2 Ready replicas at C = 50 rps serve 100 requests per second: 300 waiting is ~3 s of work, far beyond
    D + T (0.1 + 90 ms)."""
    lagging = ok(60, fill=0.5, queue=2.0, p99=40.0, pending_requests=300)
    d = run(lagging, 2)
    assert (d.reason, d.desired_replicas, d.sla_at_risk) == (R.SCALE_OUT_SLA_AT_RISK, 3, True)
    assert "backlog 300 requests, ~3e+03 ms to serve" in d.message
    # a backlog the replicas serve within T (8 requests: 80 ms) is a burst in a batcher's queue
    calm = run(ok(60, fill=0.5, queue=2.0, p99=40.0, pending_requests=8), 2)
    assert not calm.sla_at_risk
    assert calm.reason != R.SCALE_OUT_SLA_AT_RISK


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(1.0, 2_000.0),
    fill=st.floats(0.0, 1.0),
    current=st.integers(1, 30),
    u=st.floats(0.3, 1.0),
    fill_at_target=st.none() | st.floats(0.05, 1.0),
)
def test_property_low_headroom_needs_the_rate_and_the_fill_and_steps_once(
    rate: float, fill: float, current: int, u: float, fill_at_target: float | None
) -> None:
    """ScaleOutLowHeadroom (rule 4) fires only while the load-proportional count is beyond the tolerance above
    the running count and the fill's samples beyond the first, grown by 1/u, reach the saturation fill's; it
    steps to no more than that count, and once its replicas are Ready the same load does not fire it again."""
    plan = PlanNumbers(capacity_rps=50.0, max_batch_size=8, max_queue_delay_us=100, server_budget_ms=90.0,
                       batch_fill_at_target=fill_at_target)  # fmt: skip
    signals = ok(rate, fill=fill)
    d = run(signals, current, plan=plan, targetUtilization=u, maxReplicas=64)
    needed = rate / (u * 50.0)
    saturation_fill = u if fill_at_target is None else fill_at_target
    fires = (
        d.recommendation is not None
        and needed > current
        and abs(needed / current - 1) > 0.1  # the HPA tolerance, as decide computes it
        and saturation_fill * 8 - 1 > 0
        and fill < saturation_fill
        and fill * 8 - 1 >= u * (saturation_fill * 8 - 1)
    )
    assert (d.reason == R.SCALE_OUT_LOW_HEADROOM) == fires
    if fires:
        assert d.recommendation is not None
        assert current < d.desired_replicas <= min(d.recommendation, 2 * current)
        after = run(signals, d.recommendation, plan=plan, targetUtilization=u, maxReplicas=64)
        assert after.reason != R.SCALE_OUT_LOW_HEADROOM


# -- the target utilization in effect (policy/headroom.py) ------------------------------------------------------
CALM, NOISY = 0.02, 0.5  # rate variability: 2 % and 50 % per minute


def test_calm_traffic_runs_nearer_capacity_noisy_traffic_keeps_the_user_s_headroom() -> None:
    """90 rps on 3 replicas: at u = 0.8 it needs 2.25 (3 replicas); on calm traffic u' = 0.95 and it needs 1.89."""
    noisy = run(ok(90.0, fill=LIGHT, rate_change_rms=NOISY), 3)
    assert (noisy.desired_replicas, noisy.reason, noisy.target_utilization) == (3, R.HOLD_WITHIN_TOLERANCE, 0.8)
    calm = run(ok(90.0, fill=LIGHT, rate_change_rms=CALM), 3)
    assert (calm.desired_replicas, calm.reason, calm.target_utilization) == (2, R.SCALE_IN_LOAD_FITS, 0.95)
    assert "target 95%, raised from 80%: the rate moves 2.0%/min" in calm.message
    unknown = run(ok(90.0, fill=LIGHT), 3)
    assert (unknown.desired_replicas, unknown.target_utilization) == (3, 0.8)


def test_a_fixed_headroom_when_max_target_utilization_is_not_above_target_utilization() -> None:
    fixed = run(ok(90.0, fill=LIGHT, rate_change_rms=CALM), 3, maxTargetUtilization=0.8)
    assert (fixed.desired_replicas, fixed.target_utilization) == (3, 0.8)
    lower = run(ok(90.0, fill=LIGHT, rate_change_rms=CALM), 3, maxTargetUtilization=0.5)
    assert lower.target_utilization == 0.8


def test_the_saturation_fill_moves_with_the_raised_target() -> None:
    """The plan predicts fill 0.3 at 0.8·C; a replica meant to carry 0.95·C fills (1 + 1.4·0.95/0.8)/8 = 0.333
    (rule 7's model), so a fill of 0.31 is saturated on noisy traffic and not on calm traffic."""
    plan = PlanNumbers(capacity_rps=50.0, max_batch_size=8, max_queue_delay_us=100, server_budget_ms=90.0,
                       batch_fill_at_target=0.3)  # fmt: skip
    noisy = run(ok(50.0, fill=0.31, rate_change_rms=NOISY), 1, plan=plan)
    assert (noisy.saturated, noisy.desired_replicas, noisy.reason) == (True, 2, R.SCALE_OUT_SATURATED)
    calm = run(ok(50.0, fill=0.31, rate_change_rms=CALM), 1, plan=plan)
    assert (calm.saturated, calm.desired_replicas, calm.reason) == (False, 1, R.HOLD_WITHIN_TOLERANCE)
    assert run(ok(50.0, fill=0.34, rate_change_rms=CALM), 1, plan=plan).reason == R.SCALE_OUT_SATURATED


def test_the_saturation_fill_at_a_raised_target_comes_from_the_plans_two_simulated_points() -> None:
    """With the plan's fill at maxTargetUtilization (0.36 at 0.95·C) the fill target at u' = 0.95 is 0.36, not the
    proportional model's 0.333: a fill of 0.34 is no longer saturation on calm traffic; noisy traffic keeps 0.3."""
    plan = PlanNumbers(capacity_rps=50.0, max_batch_size=8, max_queue_delay_us=100, server_budget_ms=90.0,
                       batch_fill_at_target=0.3, batch_fill_at_max_target=0.36)  # fmt: skip
    calm = run(ok(50.0, fill=0.34, rate_change_rms=CALM), 1, plan=plan)
    assert (calm.saturated, calm.desired_replicas, calm.reason) == (False, 1, R.HOLD_WITHIN_TOLERANCE)
    assert run(ok(50.0, fill=0.36, rate_change_rms=CALM), 1, plan=plan).reason == R.SCALE_OUT_SATURATED
    noisy = run(ok(50.0, fill=0.31, rate_change_rms=NOISY), 1, plan=plan)
    assert (noisy.saturated, noisy.reason) == (True, R.SCALE_OUT_SATURATED)
    # u' = 0.9 (exp(-2s)): the chord's 0.3 + 0.06 * (0.1 / 0.15) = 0.34
    between = -math.log(0.9) / 2
    d = run(ok(42.0, fill=0.335, rate_change_rms=between), 1, plan=plan)
    assert (d.target_utilization, d.saturated, d.reason) == (pytest.approx(0.9), False, R.HOLD_WITHIN_TOLERANCE)
    assert run(ok(42.0, fill=0.345, rate_change_rms=between), 1, plan=plan).reason == R.SCALE_OUT_SATURATED


def test_unknown_signals_never_raise_the_target() -> None:
    d = run(ModelSignals.unknown(SignalsReason.NO_SERIES, "not scraped"), 3)
    assert (d.reason, d.target_utilization) == (R.HOLD_METRICS_UNKNOWN, 0.8)
