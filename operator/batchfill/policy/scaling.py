"""Replica decision of one BatchedModel: load-proportional, gated by saturation, stabilized on the way down.

Pure: time is passed in and nothing is read or written. One call per tick; the caller carries
``Decision.history`` to the next call and patches the Deployment's scale subresource only if ``Decision.apply``.
Long because it is one ordered decision table: each rule's evidence and its reason sit next to the others they
are ordered against (the history's storage and the saturation memory live in :mod:`scaling_history`).

Notation: load ``λ`` in samples/s (``max(request rate, inference rate)``: Triton's batcher fills
``max_batch_size`` in samples, and the plan's capacity was simulated with one sample per request), capacity at
SLA per replica ``C``, target utilization ``u`` (the one in effect: ``spec.scaling.targetUtilization`` raised on
calm traffic, policy/headroom.py, with the plan's saturation fill moved to it), server budget ``T`` (ms), queue
delay ``D`` (ms).

Rules, the first that applies decides:

1. Replicas outside ``[min, max]`` are moved inside before any metric is read, as the HPA does
   (AboveMaxReplicas, BelowMinReplicas).
2. Unknown signals or no usable capacity: hold (HoldMetricsUnknown, HoldNoCapacity, HoldScaledToZero). Missing
   data is never zero load (docs/field-cases.md#missing-metrics). A hold votes for the current count, so after
   an outage a full stabilization window of real data passes before any scale-in.
3. Zero replicas measure nothing; demand seen from outside (rate or pending requests > 0) starts one replica
   (ScaleOutFromZero), otherwise HoldIdle.
4. Scale out only on evidence from the running replicas: *saturated* (batch fill ≥ the fill the plan's
   simulation predicts at ``u·C``, ``status.plan.batchFillAtTarget``, else ``u``; without batching,
   ``λ ≥ u·C`` per Ready replica) or *SLA at risk* (queue time beyond ``D`` ≥ T/4, or p99 ≥ 0.9·T while the
   window's queue time beyond ``D`` is ≥ T/8: Triton's p99 summary remembers ~60 s, so a p99 alone may describe
   load that has left). The target is ``max(ceil(λ / (u·C)), ready + 1)`` (the load-proportional count,
   README.md#autoscaling), at most doubling per tick (HPA's 100 % scale-up policy), at most max. Queue time ≈ D
   with batches of one is waiting for partners, not for a GPU (docs/field-cases.md#low-concurrency): the queue
   thresholds sit beyond D, and ``Decision.low_concurrency`` lets the caller say so in a condition. Queue time
   is recorded as requests complete, so it lags a sudden overload; the pending-request gauge does not: a
   backlog the Ready replicas need ``backlog / (ready·C)`` beyond D ≥ T to serve (Little's law) is SLA at
   risk too. *Too little headroom* is evidence as well (ScaleOutLowHeadroom): the load-proportional count is
   beyond the tolerance above the running count, and the window's fill says the Ready replicas would saturate
   at ``1/u`` times the load (a batch's samples beyond the first grow with the load, as in rule 7:
   ``fill·B - 1 ≥ u·(fill_sat·B - 1)``). Batches fill less than the plan predicts when arrivals are smoother
   than Poisson (a round-robin Service), so saturation alone let replicas carry more than C with no room for the
   next minute's rise.
   Replicas starting or Pending are capacity on the way: no second step for the same
   evidence (HoldCapacityOnTheWay), none at all while pods are unschedulable (HoldReplicasPending), and none
   while the evidence still covers time before the last replica became Ready (HoldSettling: the signal
   window for fill and queue time, also Triton's 60 s summary for a p99-driven step). A *failing* replica
   (crash-looping, its model not loading, readiness lost after start: ``Replicas.failing``) is no capacity,
   on the way or otherwise: the step adds one replica for each beside the target, since the Deployment
   controller removes unready pods first on the way down; with no replica Ready at all and some failing,
   more replicas of the same config would fail the same way, so it holds (HoldReplicasFailing).
   When at least ``FAILURE_FRACTION`` of the window's requests fail and none succeeds, more replicas of the
   same config would fail the same way: hold (HoldRequestsFailing).
5. Without evidence a higher load-proportional count is not acted on (HoldNotSaturated): the replicas keep
   the SLA and are not near saturation, so the plan's capacity is conservative and another GPU would only lower
   the fill.
6. A model whose requests fail (``nv_inference_request_failure``, at least ``FAILURE_FRACTION`` of them) is
   neither idle nor healthy: the success rate leaves the failed demand out, so it is not scaled in
   (HoldRequestsFailing; it votes for the current count, so a window of healthy data passes before a scale-in).
7. Scale in to the largest recommendation of the stabilization window (ScaleInLoadFits, ScaleInIdle,
   HoldStabilizing), never while saturated or at risk; asymmetric: votes of the last ``FAST_SCALE_IN_S`` count as
   cast, older ones at full capacity (``ceil(u·v)``: the count that carried that vote's load at C,
   :func:`stabilization_votes`), so a peak minutes ago holds back only the replicas its load needed; no step
   bound (HPA's default 100 % scale-down policy),
   so 3 → 1 happens at the first tick after the window (docs/field-cases.md#no-traffic). A vote is never a count
   the scale-out rules would refuse, or the model would scale in, then out a tick later. It is not below the
   count ``n`` at which the window's batches, their samples beyond the first spread over fewer replicas
   (``1 + (b - 1)·ready/n`` samples), reach the saturation fill; at which the load reaches ``n·u·C`` without
   batching; or at which the backlog needs T beyond D. Nor is it below the count at which each replica would
   carry ``1 - TOLERANCE`` of the lowest load per replica at which the Ready replicas were seen saturated or at
   risk (``Saturation``, kept for ``SATURATION_MEMORY_S``; within one run of saturated ticks the highest load
   counts and a higher load they later carry without either raises it, since the window's rate lags a load step
   that the fill shows at once): batch fill rises
   steeply near the pods' real capacity, so one window's fill cannot tell how full fewer replicas would be, and a
   profile more optimistic than the pods or bursty arrivals show up there. HoldScaleInWouldSaturate: the rate
   alone would scale in.

Recommendations within 10 % of the current count keep it (HPA tolerance). Sources: Kubernetes HPA algorithm
(kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details, stabilization window,
scaling policies); KEDA's fallback on missing metrics (https://github.com/kedacore/keda/issues/3065);
docs/design-notes.md (Autoscaling) for the reasons behind these rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from batchfill.api.reasons import ScalingReason
from batchfill.api.spec import ScalingMode, ScalingSpec
from batchfill.api.status import PlanStatus
from batchfill.policy.headroom import effective_target_utilization, fill_at_utilization
from batchfill.policy.scaling_history import FAST_SCALE_IN_S as FAST_SCALE_IN_S
from batchfill.policy.scaling_history import Recommendation as Recommendation
from batchfill.policy.scaling_history import Saturation as Saturation
from batchfill.policy.scaling_history import compact_history as compact_history
from batchfill.policy.scaling_history import expand_history as expand_history
from batchfill.policy.scaling_history import history_to_store as history_to_store
from batchfill.policy.scaling_history import remember_saturation as remember_saturation
from batchfill.policy.scaling_history import stabilization_votes as stabilization_votes
from batchfill.policy.signals import ModelSignals, SignalState

#: Relative band around the current count in which the load-proportional recommendation keeps it (HPA: 0.1).
TOLERANCE = 0.1
#: A backlog whose estimated wait beyond D is at least this fraction of T puts the SLA at risk (see decide).
BACKLOG_RISK_FRACTION = 1.0
#: Bound of the backlog's estimated wait (ms, a day): a subnormal capacity must not make it infinite.
MAX_BACKLOG_WAIT_MS = 86_400_000.0
#: p99 at or above this fraction of T puts the SLA at risk.
P99_RISK_FRACTION = 0.9
#: Mean queue time beyond the batching delay at or above this fraction of T puts the SLA at risk. The plan keeps
#: 2·l(B) ≤ T (Nexus), so waiting for the batch in flight averages ≤ l(B)/2 ≤ T/4: beyond it a backlog builds.
QUEUE_RISK_FRACTION = 0.25
#: Low concurrency (docs/field-cases.md#low-concurrency): batches average fewer samples than this while queue
#: time ≥ 90 % of D.
LOW_CONCURRENCY_BATCH = 1.5
LOW_CONCURRENCY_DELAY_FRACTION = 0.9
#: ... and queue time at most this multiple of D plus LOW_CONCURRENCY_SLACK_MS: beyond it requests wait for a GPU.
LOW_CONCURRENCY_DELAY_CEILING = 1.1
LOW_CONCURRENCY_SLACK_MS = 1.0
#: A p99 at risk counts only while the window's queue time beyond D is at least this fraction of T: Triton's p99
#: summary remembers ~60 s, the other signals the window, so a p99 alone may describe load that has left.
P99_QUEUE_CORROBORATION_FRACTION = 0.125
#: Sliding window of Triton's latency summaries (prometheus-cpp's default max age), seconds: a p99 keeps showing
#: the time before a scale-out this long.
P99_SUMMARY_WINDOW_S = 60.0
#: Failed requests at or above this fraction of all requests hold scale-in (rule 6): the success rate then
#: understates the demand by more than the HPA tolerance.
FAILURE_FRACTION = TOLERANCE
#: How long the load per replica at which the Ready replicas were saturated bounds scale-in (rule 7), seconds.
SATURATION_MEMORY_S = 3600.0
#: Upper cap of the unbounded recommendation, so absurd inputs give a finite int.
MAX_RECOMMENDATION = 1_000_000


def history_horizon_s(stabilization_s: float, signal_window_s: float) -> float:
    """How far back (s) :func:`decide` looks at votes: the scale-down stabilization window, or the time the
    signals and Triton's p99 summary need to show a new replica, whichever is longer."""
    return max(float(stabilization_s), signal_window_s, P99_SUMMARY_WINDOW_S)


@dataclass(frozen=True)
class PlanNumbers:
    """The plan's numbers the decision needs (``status.plan``).

    Attributes:
        capacity_rps: C, capacity at SLA per replica, samples/s. ≤ 0 or non-finite: no proportional target.
        max_batch_size: Triton max_batch_size (0 or 1: no batching, fill is not evidence).
        max_queue_delay_us: D, Triton max_queue_delay_microseconds.
        server_budget_ms: T = latencyP99Ms - networkOverheadMs.
        batch_fill_at_target: the fill the simulator predicts at u·C (``status.plan.batchFillAtTarget``): a
            replica whose measured fill reaches it carries its target load. None: ``u`` is used instead.
        batch_fill_at_max_target: the same at maxTargetUtilization·C (``status.plan.batchFillAtMaxTarget``); the
            saturation fill at a raised ``u'`` lies between the two (policy/headroom.py). None: extrapolated.
    """

    capacity_rps: float
    max_batch_size: int
    max_queue_delay_us: int
    server_budget_ms: float
    batch_fill_at_target: float | None = None
    batch_fill_at_max_target: float | None = None

    @classmethod
    def from_status(cls, plan: PlanStatus) -> PlanNumbers:
        return cls(
            plan.capacityPerReplicaRps,
            plan.maxBatchSize,
            plan.maxQueueDelayMicroseconds,
            plan.serverBudgetMs,
            plan.batchFillAtTarget,
            plan.batchFillAtMaxTarget,
        )


@dataclass(frozen=True)
class Replicas:
    """The Deployment now. ``current`` is spec.replicas; ``starting`` are scheduled but not Ready; ``pending``
    cannot be scheduled (``pending_reason``: the scheduler's message, e.g. ``Insufficient nvidia.com/gpu``);
    ``failing`` are scheduled, not Ready and will not become Ready by waiting (``failing_reason``: the first
    one's pod and reason, e.g. ``m-triton-abc: CrashLoopBackOff``). Capacity on the way is
    ``current - ready - failing``; ``starting`` only goes into messages."""

    current: int
    ready: int
    starting: int = 0
    pending: int = 0
    pending_reason: str = ""
    failing: int = 0
    failing_reason: str = ""


@dataclass(frozen=True)
class ScalingInput:
    """Everything one decision reads. ``now`` in seconds (any epoch, the same as in ``history``);
    ``saturation``: the last decision's (``Decision.saturation``), None after a restart."""

    now: float
    signals: ModelSignals
    plan: PlanNumbers
    scaling: ScalingSpec
    replicas: Replicas
    history: tuple[Recommendation, ...] = ()
    saturation: Saturation | None = None


@dataclass(frozen=True)
class Decision:
    """What to do and why.

    Attributes:
        desired_replicas: the count to set (Off: the current count).
        current_replicas: spec.replicas the decision started from.
        recommendation: ``ceil(λ / (u·C))`` before tolerance, bounds and stabilization; None if not measurable.
        reason: goes to ``status.lastScaleReason`` and the Event (API: values never change).
        message: the numbers behind the reason.
        history: votes within the stabilization (and signal) window, this tick's last; pass to the next call.
        apply: patch the scale subresource (mode Auto and a different count).
        saturation: the saturation to remember (rule 7); pass to the next call with ``history``.
        metrics_available, saturated, sla_at_risk, low_concurrency: what the signals showed.
        requests_failing: at least ``FAILURE_FRACTION`` of the window's requests failed (rules 4 and 6).
        failure_rate_rps, failure_fraction: failed requests per second and their share of all requests.
        capacity_limited: the load wants more than can run (maxReplicas reached, or pods unschedulable).
        pending_replicas, pending_reason: unschedulable replicas and the scheduler's reason, for a condition.
        target_utilization: ``u'``, the targetUtilization in effect (policy/headroom.py).
    """

    desired_replicas: int
    current_replicas: int
    recommendation: int | None
    reason: ScalingReason
    message: str
    history: tuple[Recommendation, ...]
    apply: bool = False
    saturation: Saturation | None = None
    metrics_available: bool = False
    saturated: bool = False
    sla_at_risk: bool = False
    low_concurrency: bool = False
    requests_failing: bool = False
    failure_rate_rps: float | None = None
    failure_fraction: float | None = None
    capacity_limited: bool = False
    pending_replicas: int = 0
    pending_reason: str = ""
    target_utilization: float | None = None

    @property
    def changes_replicas(self) -> bool:
        return self.desired_replicas != self.current_replicas


def _fmt(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.3g}{unit}"


def decide(inp: ScalingInput) -> Decision:  # noqa: C901 (the ordered decision table)
    """The replica decision for one tick (see the module docstring for the rules and their sources).

    Long because it is the ordered decision table: the first rule that applies returns, so the order of the
    rules is the policy and reads best in one place.
    """
    sig, plan, spec, rep, now = inp.signals, inp.plan, inp.scaling, inp.replicas, inp.now
    hi = max(spec.maxReplicas, 0)
    lo = min(max(spec.minReplicas, 0), hi)  # an invalid min > max: the GPU budget wins
    current, ready, pending = max(rep.current, 0), max(rep.ready, 0), max(rep.pending, 0)
    failing = min(max(rep.failing, 0), max(current - ready, 0))
    usable = current - failing  # Ready, or on the way
    window_s = float(spec.scaleDownStabilizationSeconds)
    # calm traffic runs nearer capacity (policy/headroom.py); unknown signals keep the user's headroom
    variability = sig.rate_change_rms if sig.state != SignalState.UNKNOWN else None
    u = effective_target_utilization(spec.targetUtilization, spec.maxTargetUtilization, variability)
    cap = plan.capacity_rps
    budget = plan.server_budget_ms if math.isfinite(plan.server_budget_ms) and plan.server_budget_ms > 0 else None
    delay_ms = max(plan.max_queue_delay_us, 0) / 1000.0

    # evidence (fill, queue time, p99) describes the whole signal window, and Triton's p99 summary a sliding
    # window of its own: after a replica joins, neither shows the new capacity until both have passed
    settle_s = max(sig.window_s, P99_SUMMARY_WINDOW_S)
    horizon = history_horizon_s(window_s, sig.window_s)
    history = tuple(h for h in inp.history if now - horizon < h.time <= now)
    if not history:  # operator restart or a gap: no scale-in before a full window has been observed
        history = (Recommendation(now, current, ready),)

    rates = (sig.request_rate_rps, sig.inference_rate_rps)
    load: float | None = (
        0.0 if sig.state == SignalState.IDLE else max((r for r in rates if r is not None), default=None)
    )
    metrics_ok = sig.state != SignalState.UNKNOWN and load is not None
    per_replica = u * cap  # samples/s one replica is meant to carry; subnormal capacities underflow to 0
    cap_ok = math.isfinite(per_replica) and per_replica > 0 and 0 < u <= 1

    recommendation = rec = None
    needed = 0.0
    if metrics_ok and cap_ok and load is not None:
        needed = min(load / per_replica, float(MAX_RECOMMENDATION))
        recommendation = rec = math.ceil(needed - 1e-9)
        if current > 0 and abs(needed / current - 1) <= TOLERANCE:
            rec = current

    fill, queue, p99 = sig.batch_fill, sig.queue_time_ms, sig.p99_ms
    batching = plan.max_batch_size > 1 and fill is not None
    fill_target = plan.batch_fill_at_target
    if fill_target is None or not (math.isfinite(fill_target) and 0 < fill_target <= 1):
        fill_target = u
    elif u != spec.targetUtilization:  # the plan simulated u·C; a replica meant to carry u'·C fills more
        upper = plan.batch_fill_at_max_target
        fill_target = fill_at_utilization(
            fill_target,
            plan.max_batch_size,
            spec.targetUtilization,
            u,
            upper=None if upper is None else (spec.maxTargetUtilization, upper),
        )
    saturated = metrics_ok and (
        fill is not None and fill >= fill_target
        if batching
        else load is not None and cap_ok and load >= per_replica * max(ready, 1)
    )
    # too little headroom (rule 4): samples beyond a batch's first grow with the load per replica, as in rule 7,
    # so at 1/u times this load the fill reaches the saturation fill once (fill·B - 1) >= u·(fill_target·B - 1)
    headroom_room = fill_target * plan.max_batch_size - 1
    low_headroom = (
        metrics_ok
        and batching
        and not saturated
        and fill is not None
        and rec is not None
        and rec > current > 0
        and headroom_room > 0
        and fill * plan.max_batch_size - 1 >= u * headroom_room
    )
    p99_risk = (
        budget is not None
        and p99 is not None
        and p99 >= P99_RISK_FRACTION * budget
        and (queue is None or queue - delay_ms >= P99_QUEUE_CORROBORATION_FRACTION * budget)
    )
    queue_risk = budget is not None and queue is not None and queue - delay_ms >= QUEUE_RISK_FRACTION * budget
    # Triton records queue time when a request completes, so under a sudden overload the window's averages stay
    # low while a backlog waits. The pending-request gauge is now: by Little's law the last request in line waits
    # about backlog / throughput, and the Ready replicas serve at most ready·C at SLA. The gauge is one instant of
    # a bursty queue, not a window's mean, so only a backlog that takes a whole T beyond D to serve (its last
    # requests miss the SLA for certain) counts: a Poisson burst at u·C does not reach it.
    backlog = sig.pending_requests if sig.pending_requests is not None and sig.pending_requests > 0 else 0.0
    backlog_wait_ms = (
        min(1000.0 * backlog / (ready * cap), MAX_BACKLOG_WAIT_MS)
        if cap_ok and ready > 0 and math.isfinite(cap)
        else None
    )
    backlog_risk = (
        budget is not None
        and backlog_wait_ms is not None
        and backlog_wait_ms - delay_ms >= BACKLOG_RISK_FRACTION * budget
    )
    sla_at_risk = metrics_ok and (p99_risk or queue_risk or backlog_risk)
    low_concurrency = (
        metrics_ok
        and plan.max_batch_size > 1
        and delay_ms > 0
        and sig.avg_batch_size is not None
        and sig.avg_batch_size < LOW_CONCURRENCY_BATCH
        and queue is not None
        and LOW_CONCURRENCY_DELAY_FRACTION * delay_ms
        <= queue
        <= LOW_CONCURRENCY_DELAY_CEILING * delay_ms + LOW_CONCURRENCY_SLACK_MS
    )
    failure_fraction = sig.failure_fraction if metrics_ok else None
    requests_failing = failure_fraction is not None and failure_fraction >= FAILURE_FRACTION
    memory = inp.saturation if inp.saturation and now - SATURATION_MEMORY_S < inp.saturation.time <= now else None
    # fill from before a replica joined describes fewer replicas than ``ready``: not a load per replica
    per_ready = load / ready if load and ready > 0 else 0.0
    settled = per_ready > 0 and not any(h.ready < ready for h in history if h.time > now - sig.window_s)
    if settled:
        previous_tick = max((h.time for h in inp.history if h.time < now), default=None)
        memory = remember_saturation(memory, now, previous_tick, ready, per_ready, saturated or sla_at_risk)

    def above(x: float) -> int:  # the smallest whole count n > x >= 0 (0 when x is 0)
        return math.floor(min(x, MAX_RECOMMENDATION) + 1e-9) + 1 if x > 0 else 0

    # the smallest count the scale-out rules accept at this load (rule 7)
    accept = 0
    if batching and fill is not None:  # samples beyond a batch's first grow with the load per replica
        room, excess = fill_target * plan.max_batch_size - 1, max(fill * plan.max_batch_size - 1, 0.0)
        accept = above(excess * ready / room if room > 0 else fill * ready / fill_target)
    elif plan.max_batch_size <= 1 and load is not None and cap_ok:
        accept = above(load / per_replica)
    if backlog > 0 and budget is not None and cap_ok and math.isfinite(cap):
        accept = max(accept, above(1000.0 * backlog / cap / (budget + delay_ms)))
    if memory is not None and load and memory.load_per_replica_rps > 0:
        accept = max(accept, above(load / ((1 - TOLERANCE) * memory.load_per_replica_rps)))
    accept = min(accept, current)
    raised = (
        f", raised from {spec.targetUtilization:.0%}: the rate moves {variability:.1%}/min"
        if u != spec.targetUtilization and variability is not None
        else ""
    )
    facts = (
        f"load {_fmt(load, ' rps')} on {ready} Ready of {current} replicas at {_fmt(cap if cap_ok else None, ' rps')}"
        f" each (target {u:.0%}{raised}: needs {needed:.2f}); fill {_fmt(fill)}, avg batch {_fmt(sig.avg_batch_size)},"
        f" queue {_fmt(queue, ' ms')} (delay {delay_ms:.3g} ms), p99 {_fmt(p99, ' ms')} vs T {_fmt(budget, ' ms')}"
        + (f"; backlog {backlog:.0f} requests, ~{_fmt(backlog_wait_ms, ' ms')} to serve" if backlog_risk else "")
        + (f"; {sig.failure_rate_rps:.3g} failed req/s ({failure_fraction:.0%})" if failure_fraction else "")
    )
    in_stab = stabilization_votes(history, now, window_s, u)
    pending_note = f"; {pending} Pending: {rep.pending_reason or 'unschedulable'}" if pending else ""
    if failing:
        pending_note += f"; {failing} failing: {rep.failing_reason or 'not Ready'}"

    def out(
        desired: int, reason: ScalingReason, message: str, vote: int | None = None, limited: bool = False
    ) -> Decision:
        vote = desired if vote is None else max(lo, min(hi, vote))
        return Decision(
            desired_replicas=desired,
            current_replicas=current,
            recommendation=recommendation,
            reason=reason,
            message=f"{message}{pending_note}",
            history=(*history, Recommendation(now, vote, ready)),
            apply=spec.mode == ScalingMode.AUTO and desired != current,
            saturation=memory,
            metrics_available=metrics_ok,
            saturated=saturated,
            sla_at_risk=sla_at_risk,
            low_concurrency=low_concurrency,
            requests_failing=requests_failing,
            failure_rate_rps=sig.failure_rate_rps if metrics_ok else None,
            failure_fraction=failure_fraction,
            capacity_limited=limited or pending > 0,
            pending_replicas=pending,
            pending_reason=rep.pending_reason if pending else "",
            target_utilization=u,
        )

    def auto() -> Decision:  # noqa: C901 (the ordered decision table)
        """The rules in order; Long because it is the decision table (see decide)."""
        if current > hi:
            return out(hi, ScalingReason.ABOVE_MAX_REPLICAS, f"{current} replicas above maxReplicas {hi}")
        if current < lo:
            return out(lo, ScalingReason.BELOW_MIN_REPLICAS, f"{current} replicas below minReplicas {lo}")
        if not metrics_ok:
            why = f"signals {sig.state} ({sig.reason or 'no rate'}): {sig.message}".rstrip(": ")
            if current == 0:
                return out(0, ScalingReason.HOLD_SCALED_TO_ZERO, f"0 replicas, nothing to measure; {why}")
            return out(
                current,
                ScalingReason.HOLD_METRICS_UNKNOWN,
                f"holding {current} replicas, never scaling on missing data; {why}",
            )
        if rec is None:
            return out(
                current, ScalingReason.HOLD_NO_CAPACITY, f"holding {current}: the plan has no capacity at SLA; {facts}"
            )
        if current == 0:
            if hi > 0 and ((load or 0) > 0 or (sig.pending_requests or 0) > 0):
                return out(
                    1, ScalingReason.SCALE_OUT_FROM_ZERO, f"demand at 0 replicas, starting 1; {facts}", vote=max(rec, 1)
                )
            return out(0, ScalingReason.HOLD_IDLE, f"idle at 0 replicas; {facts}")

        wants_out = saturated or sla_at_risk or low_headroom
        if wants_out:
            target = max(rec, min(ready, usable) + 1)
            why = (
                "saturated"
                if saturated
                else "SLA at risk"
                if sla_at_risk
                else f"fill within the target's headroom of saturation ({fill_target:.3g} at {1 / u:.2f} x the load)"
            )
            if failing and not ready:
                msg = f"{why}, but no replica is Ready: more of this config would fail the same way; {facts}"
                return out(current, ScalingReason.HOLD_REPLICAS_FAILING, msg, target)
            if requests_failing and not sig.request_rate_rps:
                msg = f"{why}, but no request succeeds: more of this config would fail the same way; {facts}"
                return out(current, ScalingReason.HOLD_REQUESTS_FAILING, msg, target)
            if pending:
                return out(
                    current,
                    ScalingReason.HOLD_REPLICAS_PENDING,
                    f"{why} but replicas cannot be scheduled; {facts}",
                    target,
                )
            if target <= usable:
                return out(
                    current,
                    ScalingReason.HOLD_CAPACITY_ON_THE_WAY,
                    f"{why}, {usable - ready} not Ready yet ({rep.starting} starting); {facts}",
                    target,
                )
            # fill and queue time describe the window; only a p99-driven step waits out Triton's summary too
            settle = sig.window_s if saturated or low_headroom or queue_risk else settle_s
            if rec <= usable and any(h.ready < ready for h in history if h.time >= now - settle):
                msg = f"{why}, but a replica became Ready within the last {settle:.0f} s of signals; {facts}"
                return out(current, ScalingReason.HOLD_SETTLING, msg, target)
            if current >= hi:
                return out(
                    current, ScalingReason.AT_MAX_REPLICAS, f"{why} at maxReplicas {hi}; {facts}", target, limited=True
                )
            desired = min(target + failing, hi, 2 * current)
            reason = (
                ScalingReason.SCALE_OUT_SATURATED
                if saturated
                else ScalingReason.SCALE_OUT_SLA_AT_RISK
                if sla_at_risk
                else ScalingReason.SCALE_OUT_LOW_HEADROOM
            )
            return out(desired, reason, f"{why}: {current} -> {desired}; {facts}", target, limited=target > hi)
        if requests_failing:
            msg = f"{failure_fraction:.0%} of requests fail: not idle, not scaling in on the successes; {facts}"
            return out(current, ScalingReason.HOLD_REQUESTS_FAILING, msg, max(rec, current))
        if rec > current:
            msg = f"load would need {rec} but the running replicas are not saturated and keep the SLA; {facts}"
            return out(current, ScalingReason.HOLD_NOT_SATURATED, msg, rec)

        rate_vote = max(lo, min(hi, rec))
        vote = max(rate_vote, accept)
        stabilized = max([vote, *in_stab])
        idle = sig.state == SignalState.IDLE
        bound = f" (the rate alone fits {rate_vote}; fewer would be saturated)" if vote > rate_vote else ""
        if stabilized < current:
            reason = ScalingReason.SCALE_IN_IDLE if idle else ScalingReason.SCALE_IN_LOAD_FITS
            return out(stabilized, reason, f"load fits: {current} -> {stabilized}{bound}; {facts}", vote)
        if vote < current:
            msg = f"load fits on {vote}, but the last {window_s:.0f} s recommended up to {stabilized}; {facts}"
            return out(current, ScalingReason.HOLD_STABILIZING, msg, vote)
        if bound:
            msg = f"the rate fits {rate_vote}, but fewer than {current} would be saturated; {facts}"
            return out(current, ScalingReason.HOLD_SCALE_IN_WOULD_SATURATE, msg, vote)
        return out(
            current,
            ScalingReason.HOLD_IDLE if idle else ScalingReason.HOLD_WITHIN_TOLERANCE,
            f"{current} replicas fit the load; {facts}",
        )

    decision = auto()
    if spec.mode == ScalingMode.OFF:
        msg = f"scaling.mode Off: keeping {current} (would be {decision.desired_replicas}, {decision.reason})"
        return replace(decision, desired_replicas=current, reason=ScalingReason.SCALING_OFF, message=msg)
    return decision
