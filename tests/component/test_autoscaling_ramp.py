"""The replica decision driving real parts through a load ramp: no scale-out before the batch fill says so.

One run per module (:class:`batchfill.testbed.scaling_lab.ScalingLab`, about 4 minutes): real tritonserver
processes serve the sleep model (50 + 10·b ms per batch, SLA 360 ms with 20 ms overhead so T = 340 ms; the plan
gives B = 16 and C ≈ 51 requests/s per replica; config rendered from the plan, KIND_CPU), a real
Prometheus scrapes them every second with namespace/pod labels, an open-loop Poisson load ramps from 0.5 to 2.4
replicas' worth (``u·C``), holds, and drops to 0.4; every 2 s the signals of the Ready pods (10 s window) go
into :func:`batchfill.policy.scaling.decide` and its decision starts or stops servers. The tests check the
recorded timeline:

(a) the first scale-out happens only once the measured batch fill reached the plan's ``batchFillAtTarget`` (or
    the SLA was at risk), and not later than the first tick that showed it;
(b) replicas never exceed what the peak load needs + 1, and reach that need during the hold;
(c) after the load drops, replicas return to ``minReplicas`` within the scale-in reaction time;
(d) client p99 per 5 s window stays within the SLA, and Triton's server-side p99 within ``T``, except within
    the reaction time after each step up of the load's need;
(e) no request fails (scale-in takes a server out of the balancer before it is stopped).

Reaction times (the documented exemptions):

* the reaction time after the load's need ``ceil(λ/(u·C))`` steps up: the fill is a 10 s average, so it
  reaches the threshold about half a window (5 s) after the load does; while a replica that joined less than a
  p99-summary window (60 s) ago is settling, the decision also waits until the measured load leaves the 10 %
  tolerance band (``0.1·n·u·C`` / ramp slope ≈ 8.4 s on this ramp); plus up to two ticks (4 s), rounded up to
  ``REACTION_BEFORE_START_S`` = 18 s; plus a server start, which is this machine's speed (≈ 2 s on the 2-core
  development machine, longer on a busy one), so the slowest start the run measured. Measured on the 2-core
  development machine: decision 5-7 s after the first
  step and 13-15 s after the second (the settling wait), Ready capacity 1.6 s after the decision. Near the end of
  the first reaction time one replica carries ≈ 0.95·C and one 5 s window's client p99 exceeded the SLA
  (≈ 430 ms): that is the exemption at work, not a flake.
* Triton's summary keeps observations for 60 s (``SUMMARY_MAX_AGE_S``, measured), so the server-side p99 of a
  tick covers the minute before it: ticks up to the reaction time + ``SUMMARY_MAX_AGE_S`` after a step are exempt from
  the server-side check (the client-side windows are exact and cover every other moment).
* ``SCALE_IN_REACTION_S`` = window + stabilization + 4 ticks = 38 s after the need steps down: the rate is a
  10 s average and every recommendation of the last 20 s must allow the scale-in.
"""

from __future__ import annotations

import math
import shutil

import pytest

from batchfill.api.reasons import ScalingReason
from batchfill.policy.scaling import P99_RISK_FRACTION, QUEUE_RISK_FRACTION
from batchfill.policy.signals import SignalState
from batchfill.testbed.prometheus_local import DEFAULT_BINARY
from batchfill.testbed.scaling_lab import (
    LabConfig,
    LabResult,
    Reaction,
    ScalingLab,
    TickRecord,
    latency_windows,
    need_steps,
    phase_stats,
    reactions,
)

pytestmark = [
    pytest.mark.component,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(DEFAULT_BINARY) is None, reason=f"{DEFAULT_BINARY} is not installed"),
]

CONFIG = LabConfig()
REACTION_BEFORE_START_S = 18.0
SUMMARY_MAX_AGE_S = 60.0
SCALE_IN_REACTION_S = CONFIG.window_s + CONFIG.scaling.scaleDownStabilizationSeconds + 4 * CONFIG.tick_s
LATENCY_WINDOW_S = 5.0
#: The load generator must not be the bottleneck (its sends later than scheduled, p99).
MAX_SEND_LAG_MS = 10.0


def _row(k: TickRecord) -> str:
    def f(x: float | None, d: int = 1) -> str:
        return "-" if x is None else f"{x:.{d}f}"

    return (
        f"t={k.t:6.1f} offered {k.offered_rps:5.0f} measured {f(k.request_rate_rps, 0):>4} rps  "
        f"replicas {k.current} ({k.ready} Ready) -> {k.desired:<2} {k.reason:<20} fill {f(k.batch_fill, 3)} "
        f"queue {f(k.queue_time_ms)} ms p99 {f(k.p99_ms)} ms"
    )


@pytest.fixture(scope="module")
def ramp() -> LabResult:
    lab = ScalingLab(CONFIG)
    plan = lab.plan
    print(
        f"\nplan: B={plan.maxBatchSize}, D={plan.maxQueueDelayMicroseconds} µs, C={plan.capacityPerReplicaRps} rps, "
        f"fill at target {plan.batchFillAtTarget}, T={plan.serverBudgetMs} ms; u·C="
        f"{CONFIG.scaling.targetUtilization * plan.capacityPerReplicaRps:.0f} rps, peak {lab.schedule.peak_rps:.0f} "
        f"rps, {len(lab.arrivals)} requests over {lab.schedule.duration_s:.0f} s"
    )
    result = lab.run()
    for k in result.ticks:
        print(_row(k))
    for r in reactions(result):
        print(
            f"need {r.step.old}->{r.step.new} at {r.step.t:.1f} s: decision after {r.to_decision_s} s, "
            f"capacity after {r.to_capacity_s} s"
        )
    for p in phase_stats(result):
        print(
            f"{p.name:9s} client p99 {p.client_p99_ms:6.1f} ms (max {p.client_max_ms:6.1f}), server p99 at end "
            f"{p.server_p99_ms} ms, replicas {p.mean_replicas:.2f} vs need {p.mean_need:.2f}"
        )
    print(f"wall {result.wall_s:.0f} s (+{result.setup_s:.1f} s setup), send lag p99 {result.send_lag_p99_ms:.2f} ms")
    return result


def _reaction_s(result: LabResult) -> float:
    """The reaction time after a step up of the need: the decision's share plus the slowest server start."""
    starts = [s.ready_s - s.requested_s for s in result.servers if s.index > 0 and s.ready_s is not None]
    return REACTION_BEFORE_START_S + max(starts, default=0.0)


def _up_steps(result: LabResult) -> list[float]:
    return [s.t for s in need_steps(result) if s.up]


def _exempt(t0: float, t1: float, steps: list[float], span: float) -> bool:
    """Whether [t0, t1) overlaps [step, step + span) for a step."""
    return any(t0 < s + span and t1 > s for s in steps)


def _at_risk(k: TickRecord, budget_ms: float, delay_ms: float) -> bool:
    p99_risk = k.p99_ms is not None and k.p99_ms >= P99_RISK_FRACTION * budget_ms
    queue_risk = k.queue_time_ms is not None and k.queue_time_ms - delay_ms >= QUEUE_RISK_FRACTION * budget_ms
    return p99_risk or queue_risk


def test_the_run_is_valid(ramp: LabResult) -> None:
    assert ramp.ticks, "no control tick ran"
    assert all(k.state == SignalState.OK for k in ramp.ticks[5:]), [(k.t, k.state, k.message) for k in ramp.ticks]
    assert ramp.send_lag_p99_ms <= MAX_SEND_LAG_MS, "the load generator lagged: the run measured the client"
    assert ramp.peak_need == 3  # 2.4 replicas' worth of load
    assert len(_up_steps(ramp)) == 2


def test_a_first_scale_out_only_after_fill_reached_its_target(ramp: LabResult) -> None:
    plan = ramp.plan
    fill_target = plan.batchFillAtTarget
    assert fill_target is not None
    delay_ms = plan.maxQueueDelayMicroseconds / 1000
    trigger = next((k for k in ramp.ticks if k.apply and k.desired > k.current), None)
    assert trigger is not None, "never scaled out"
    print("trigger:", _row(trigger))
    print(trigger.message)
    # scale out only once the fill reaches its target (policy/scaling.py, rule 4); on this ramp the load rises
    # slowly enough that saturation, not SLA risk, must be what triggers the first step
    assert trigger.reason == ScalingReason.SCALE_OUT_SATURATED, trigger.message
    assert trigger.batch_fill is not None
    assert trigger.batch_fill >= fill_target, trigger.message
    # the evidence is real load: per Ready replica, at least 90 % of what one is meant to carry
    assert trigger.request_rate_rps is not None
    assert trigger.request_rate_rps / trigger.ready >= 0.9 * ramp.per_replica_rps, trigger.message
    # ... and the decision did not wait: no earlier tick showed saturation or risk
    before = [k for k in ramp.ticks if k.t < trigger.t]
    early = [
        k
        for k in before
        if (k.batch_fill is not None and k.batch_fill >= fill_target) or _at_risk(k, plan.serverBudgetMs, delay_ms)
    ]
    assert not early, [_row(k) for k in early]
    assert all(k.desired == CONFIG.scaling.minReplicas for k in before)


def test_b_replicas_follow_the_need_and_never_exceed_it_by_more_than_one(ramp: LabResult) -> None:
    need = ramp.peak_need
    most = max(k.current for k in ramp.ticks)
    print(f"peak need {need}, most replicas {most}, servers started {len(ramp.servers)}")
    assert most <= need + 1
    assert len(ramp.servers) <= need + 1  # no start/stop churn either
    hold = ramp.schedule.phase("hold")
    last_up = max(_up_steps(ramp))
    t0 = max(hold.start_s, last_up + _reaction_s(ramp))
    assert t0 < hold.end_s, "the hold is too short to observe it"
    short = [k for k in ramp.ticks if t0 <= k.t <= hold.end_s and k.ready < need]
    assert not short, [_row(k) for k in short]
    # each step up of the need was followed within the reaction time
    ups: list[Reaction] = [r for r in reactions(ramp) if r.step.up]
    for r in ups:
        assert r.to_capacity_s is not None, r
        assert r.to_capacity_s <= _reaction_s(ramp), r


def test_c_back_to_min_replicas_after_the_load_drops(ramp: LabResult) -> None:
    low = CONFIG.scaling.minReplicas
    last_down = max(s.t for s in need_steps(ramp) if not s.up)
    assert ramp.ticks[-1].current == low
    assert ramp.current_at(ramp.duration_s - 1e-6) == low
    back = max(s.removed_s for s in ramp.servers if s.removed_s is not None and s.removed_s >= last_down)
    assert back - last_down <= SCALE_IN_REACTION_S, f"back to {low} {back - last_down:.1f} s after the load dropped"
    # ... and it stayed there (no flapping back up on the low load)
    assert all(k.current == low for k in ramp.ticks if k.t > back + CONFIG.tick_s)
    # scale-in stopped the newest servers first, the first one never
    removed = sorted((s for s in ramp.servers if s.removed_s is not None), key=lambda s: (s.removed_s, -s.index))
    assert [s.index for s in removed] == sorted((s.index for s in removed), reverse=True)
    assert 0 not in [s.index for s in removed]


def test_d_p99_within_the_sla_outside_the_reaction_time(ramp: LabResult) -> None:
    steps = _up_steps(ramp)
    windows = latency_windows(ramp, LATENCY_WINDOW_S)
    reaction_s = _reaction_s(ramp)
    print(f"reaction time {reaction_s:.1f} s")
    checked = [w for w in windows if w.requests and not _exempt(w.t0, w.t1, steps, reaction_s)]
    late = [w for w in checked if w.p99_ms > ramp.sla_ms]
    over_t = [w for w in windows if w.requests and w.p99_ms > ramp.server_budget_ms]
    print(
        f"client p99 per {LATENCY_WINDOW_S:.0f} s: {len(checked)} of {len(windows)} windows checked, worst checked "
        f"{max(w.p99_ms for w in checked):.1f} ms, worst overall {max(w.p99_ms for w in windows if w.requests):.1f} ms;"
        f" {len(over_t)} windows above T={ramp.server_budget_ms} ms"
    )
    assert len(checked) >= 0.6 * len(windows)
    assert not late, f"client p99 above the SLA {ramp.sla_ms} ms outside the reaction time: {late}"
    calm = [
        k
        for k in ramp.ticks
        if k.p99_ms is not None and not _exempt(k.t, k.t + 1e-9, steps, reaction_s + SUMMARY_MAX_AGE_S)
    ]
    assert calm, "no calm tick to check the server-side p99 on"
    high = [_row(k) for k in calm if k.p99_ms is not None and k.p99_ms > ramp.server_budget_ms]
    print(f"server p99 on {len(calm)} calm ticks: worst {max(k.p99_ms or 0 for k in calm):.1f} ms")
    assert not high, high


def test_e_no_failed_requests(ramp: LabResult) -> None:
    print(f"{ramp.ok} ok, {ramp.failed} failed: {ramp.errors}")
    assert ramp.failed == 0, ramp.errors
    assert ramp.ok == len(ramp.sent_s)
    served = sum(s.served for s in ramp.servers)
    assert served == ramp.ok
    assert all(s.served > 0 for s in ramp.servers if s.ready_s is not None and math.isfinite(s.ready_s))
