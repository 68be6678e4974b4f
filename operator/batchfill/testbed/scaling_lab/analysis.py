"""The timeline analysis of a scaling-lab run: how the replica count followed the load's need, what it cost in
replica-seconds, and the client-side latency per window and per phase (pure functions of a
:class:`~batchfill.testbed.scaling_lab.records.LabResult`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchfill.testbed.scaling_lab.records import LabResult, TickRecord, need_for
from batchfill.testbed.scaling_lab.schedule import Phase


@dataclass(frozen=True)
class NeedStep:
    """The load-proportional need ``ceil(λ/(u·C))`` of the offered rate changes at ``t`` from ``old`` to ``new``."""

    t: float
    old: int
    new: int

    @property
    def up(self) -> bool:
        return self.new > self.old


@dataclass(frozen=True)
class Reaction:
    """How the loop followed one :class:`NeedStep`.

    ``decision_s``: the first tick whose decision reached the new need: for a step up, desired ≥ new at any tick
    after the previous step (a step anticipated by the saturation signal gives a negative delay); for a step
    down, desired ≤ new at a tick after the step. ``capacity_s``: when that many replicas were Ready (step up)
    or the surplus ones were stopped (step down). Either is None if it never happened. ``trigger`` is the
    deciding tick.
    """

    step: NeedStep
    decision_s: float | None
    capacity_s: float | None
    trigger: TickRecord | None

    @property
    def to_decision_s(self) -> float | None:
        return None if self.decision_s is None else self.decision_s - self.step.t

    @property
    def to_capacity_s(self) -> float | None:
        return None if self.capacity_s is None else self.capacity_s - self.step.t


def need_steps(result: LabResult, dt: float = 0.05) -> list[NeedStep]:
    """Every change of the offered load's need over the schedule (sampled every ``dt`` s)."""
    steps: list[NeedStep] = []
    prev = result.need_at(0.0)
    for i in range(1, math.ceil(result.duration_s / dt)):
        t = i * dt
        n = result.need_at(t)
        if n != prev:
            steps.append(NeedStep(round(t, 3), prev, n))
            prev = n
    return steps


def reactions(result: LabResult) -> list[Reaction]:
    """One :class:`Reaction` per :func:`need_steps` entry."""
    steps = need_steps(result)
    out: list[Reaction] = []
    for i, st in enumerate(steps):
        since = steps[i - 1].t if i else -math.inf
        until = steps[i + 1].t if i + 1 < len(steps) else math.inf
        # a step up may have been anticipated (any tick after the previous step); a step down is followed only
        # after it happened (before it, the count may equal the new need on the way up)
        start = since if st.up else st.t
        hit = next(
            (
                k
                for k in result.ticks
                if start < k.t < until + 60.0 and (k.desired >= st.new if st.up else k.desired <= st.new)
            ),
            None,
        )
        capacity: float | None = None
        if hit is not None:
            if st.up:
                times = sorted(s.ready_s for s in result.servers if s.ready_s is not None and s.ready_s >= since)
                counts = [(t, result.ready_at(t)) for t in times]
                capacity = next((t for t, c in counts if t >= hit.t and c >= st.new), None)
            else:
                stops = sorted(s.stopped_s for s in result.servers if s.stopped_s is not None and s.stopped_s >= hit.t)
                alive = [
                    t
                    for t in stops
                    if sum(1 for s in result.servers if s.requested_s <= t and (s.stopped_s is None or s.stopped_s > t))
                    <= st.new
                ]
                capacity = alive[0] if alive and math.isfinite(alive[0]) else None
        out.append(Reaction(st, None if hit is None else hit.t, capacity, hit))
    return out


def replica_seconds(result: LabResult) -> float:
    """∫ replicas dt over the schedule: every server from its request until it was stopped (what a GPU costs:
    a starting pod holds its GPU, a draining one too)."""
    total = 0.0
    end = result.duration_s
    for s in result.servers:
        stop = end if s.stopped_s is None or not math.isfinite(s.stopped_s) else min(s.stopped_s, end)
        total += max(0.0, stop - max(0.0, s.requested_s))
    return total


def lower_bound_replica_seconds(result: LabResult) -> float:
    """∫ λ(t) / C dt: the replica-seconds no autoscaler can beat on the same hardware.

    Every replica carries at most C requests/s within the SLA, so serving λ(t) takes at least λ(t)/C replicas at
    every instant, even for one that scaled instantly and in fractions of a replica.
    """
    c = result.capacity_rps
    return result.schedule.integral(lambda r: r / c)


def ideal_replica_seconds(result: LabResult) -> float:
    """∫ need(t) dt: an autoscaler at ``u·C`` per replica that reacted instantly (bounded by min/max)."""
    return result.schedule.integral(lambda r: float(need_for(r, result.capacity_rps, result.config.scaling)))


@dataclass(frozen=True)
class LatencyWindow:
    t0: float
    t1: float
    requests: int
    p99_ms: float
    max_ms: float


def latency_windows(result: LabResult, width_s: float = 5.0) -> list[LatencyWindow]:
    """Client-side p99 of the requests sent in consecutive ``width_s`` windows (NaN for an empty window)."""
    out: list[LatencyWindow] = []
    t = 0.0
    while t < result.duration_s:
        lat = result.latencies_between(t, t + width_s)
        p99 = float(np.percentile(lat, 99)) if lat.size else math.nan
        out.append(LatencyWindow(t, t + width_s, int(lat.size), p99, float(lat.max()) if lat.size else math.nan))
        t += width_s
    return out


@dataclass(frozen=True)
class PhaseStats:
    name: str
    t0: float
    t1: float
    requests: int
    failed: int
    client_p50_ms: float
    client_p99_ms: float
    client_max_ms: float
    server_p99_ms: float | None  # Triton's summary p99 at the phase's last tick (its own sliding window)
    mean_replicas: float
    mean_need: float


def phase_stats(result: LabResult, phases: Sequence[Phase] | None = None) -> list[PhaseStats]:
    out: list[PhaseStats] = []
    for p in phases if phases is not None else result.schedule.phases:
        sel = (result.sent_s >= p.start_s) & (result.sent_s < p.end_s)
        lat = result.latency_ms[sel]
        ok = lat[~np.isnan(lat)]
        ticks = [k for k in result.ticks if p.start_s <= k.t <= p.end_s]
        span = max(p.end_s - p.start_s, 1e-9)
        grid = np.linspace(p.start_s, p.end_s, max(2, int(span * 10)), endpoint=False)
        out.append(
            PhaseStats(
                name=p.name,
                t0=p.start_s,
                t1=p.end_s,
                requests=int(lat.size),
                failed=int(np.count_nonzero(np.isnan(lat))),
                client_p50_ms=float(np.percentile(ok, 50)) if ok.size else math.nan,
                client_p99_ms=float(np.percentile(ok, 99)) if ok.size else math.nan,
                client_max_ms=float(ok.max()) if ok.size else math.nan,
                server_p99_ms=ticks[-1].p99_ms if ticks else None,
                mean_replicas=float(np.mean([result.current_at(float(t)) for t in grid])),
                mean_need=float(np.mean([result.need_at(float(t)) for t in grid])),
            )
        )
    return out
