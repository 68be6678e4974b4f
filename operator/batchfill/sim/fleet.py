"""Fleet model: replicas of the Triton batcher behind a round-robin Service, driven by an autoscaler.

What is modelled, and the reason for each choice:

* **Replicas** are :class:`~batchfill.sim.replica.ReplicaBatcher` s (Triton's dynamic batcher, one executor per
  GPU). A replica created at ``t`` holds its GPUs from ``t`` and serves from ``t + startup_s`` (pod scheduling,
  image start, model load); GPU time is charged from creation to the end of its last execution after removal.
* **Load balancing** is round robin over Ready, not terminating replicas (a Service's endpoints), one request
  at a time, in arrival order, or a random pick per request (:mod:`batchfill.sim.routing`). While no replica
  is Ready, arrivals are refused (a Service without endpoints) and count as outside the SLA.
* **Scale-in** removes replicas the way a ReplicaSet picks victims: not Ready before Ready, then the most
  recently Ready first. A removed replica leaves the endpoints at once and drains its queue (Triton finishes
  in-flight requests on SIGTERM).
* **Signals** are what Prometheus would hold: counters scraped every ``scrape_s``; at a tick the autoscaler
  sees the last ``window_s`` of scrapes of the Ready replicas (request rate, average batch size, queue time per
  request, GPU busy fraction) and each replica's p99 over ``p99_window_s`` (Triton's latency summary). Counts are
  attributed to the interval in which their batch started (at most one execution, ≤ T, early).
* **Autoscaler** is anything with ``decide(observation) -> ScaleDecision`` (:class:`Autoscaler`), called every
  ``tick_s`` from ``warmup_s`` on (a fleet that starts Ready, as one that had been running, has no signal history
  before its first window); the new count takes effect at once (creations, removals).

Pure and deterministic: the trace is seeded, time is simulated; nothing is read from the clock. One pass over
the trace, O(requests) work in numpy plus one Python step per executed batch, memory O(window + histogram).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from batchfill.sim.batcher import BatcherConfig
from batchfill.sim.replica import Interval, ReplicaBatcher
from batchfill.sim.routing import BALANCING, RANDOM, ROUND_ROBIN, random_shares
from batchfill.sim.traces import Trace

FloatArray = npt.NDArray[np.float64]
#: Latency histogram: log-spaced bins of relative width HIST_RESOLUTION from HIST_LOW_MS (below: first bin) to
#: HIST_HIGH_MS (above: last bin); quantiles are exact to 0.1 % without keeping every latency.
HIST_RESOLUTION = 1e-3
HIST_LOW_MS = 0.01
HIST_HIGH_MS = 1e7
_HIST_BINS = math.ceil(math.log(HIST_HIGH_MS / HIST_LOW_MS) / math.log1p(HIST_RESOLUTION)) + 1


def histogram_bins(latencies_ms: FloatArray) -> npt.NDArray[np.int64]:
    """Bin index of each latency (ms) in the log-spaced latency histogram."""
    scaled = np.log(np.maximum(latencies_ms, HIST_LOW_MS) / HIST_LOW_MS) / math.log1p(HIST_RESOLUTION)
    out: npt.NDArray[np.int64] = np.minimum(scaled.astype(np.int64), _HIST_BINS - 1)
    return out


@dataclass(frozen=True)
class FleetConfig:
    """Everything about the fleet that is not the autoscaler.

    Attributes:
        batcher: each replica's dynamic-batcher settings (executors = GPUs per replica).
        latency_ms: execution latency table ``[0, l(1), ..., l(B)]``, ms.
        budget_ms: server latency budget T; a request within it meets the SLA, ms.
        gpus_per_replica: GPUs each replica holds (for GPU-hours).
        initial_replicas: Ready replicas at time 0.
        startup_s: from creation to Ready, seconds.
        tick_s: autoscaler period, seconds (a multiple of ``scrape_s``).
        scrape_s: Prometheus scrape interval, seconds.
        window_s: rate window of the signals, seconds.
        p99_window_s: window of Triton's latency summary, seconds.
        max_replicas: hard cap on replicas, whatever the autoscaler asks.
        warmup_s: no autoscaler call before this time, seconds (the count stays ``initial_replicas``).
        balancing: ``"round-robin"`` or ``"random"`` (:mod:`batchfill.sim.routing`).
        balancing_seed: seed of the random picks (``"random"`` only).
    """

    batcher: BatcherConfig
    latency_ms: tuple[float, ...]
    budget_ms: float
    gpus_per_replica: int = 1
    initial_replicas: int = 1
    startup_s: float = 60.0
    tick_s: float = 15.0
    scrape_s: float = 15.0
    window_s: float = 60.0
    p99_window_s: float = 60.0
    max_replicas: int = 10_000
    warmup_s: float = 0.0
    balancing: str = ROUND_ROBIN
    balancing_seed: int = 0

    def __post_init__(self) -> None:
        if self.balancing not in BALANCING:
            raise ValueError(f"FleetConfig.balancing={self.balancing!r}: choose from {', '.join(BALANCING)}")
        for name in ("budget_ms", "tick_s", "scrape_s", "window_s", "p99_window_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"FleetConfig.{name}={value!r} must be a positive finite number")
        if not (math.isfinite(self.startup_s) and self.startup_s >= 0):
            raise ValueError(f"FleetConfig.startup_s={self.startup_s!r} must be finite and >= 0")
        ratio = self.tick_s / self.scrape_s
        if abs(ratio - round(ratio)) > 1e-9:
            raise ValueError(f"FleetConfig.tick_s={self.tick_s} must be a multiple of scrape_s={self.scrape_s}")
        if self.gpus_per_replica < 0 or self.initial_replicas < 0 or self.max_replicas < 1:
            raise ValueError("FleetConfig: gpus_per_replica and initial_replicas must be >= 0, max_replicas >= 1")


@dataclass(frozen=True)
class Observation:
    """What the autoscaler sees at one tick (Ready replicas' scrapes over the window, pod counts now).

    Attributes:
        now_s: tick time, seconds.
        current: replicas that exist and are not terminating (spec.replicas).
        ready: of those, Ready.
        starting: of those, not Ready yet.
        window_s: rate window, seconds.
        request_rate_rps: requests completed by the Ready replicas in the window / the window, req/s: the
            operator's Σ increase / window (a replica younger than the window is counted over the whole window).
        completed: requests completed by the Ready replicas in the window.
        avg_batch_size: samples per execution in the window; None without executions.
        queue_time_ms: mean queue time per request in the window, ms; None without requests.
        p99_ms: largest per-replica p99 over the summary window, ms; None without requests.
        pending_requests: requests waiting in the Ready replicas' queues now.
        gpu_utilization: mean over ``current`` replicas of GPU busy time / window (starting replicas hold a GPU
            and report 0, as DCGM does); None without replicas.
    """

    now_s: float
    current: int
    ready: int
    starting: int
    window_s: float
    request_rate_rps: float
    completed: int
    avg_batch_size: float | None
    queue_time_ms: float | None
    p99_ms: float | None
    pending_requests: int
    gpu_utilization: float | None


@dataclass(frozen=True)
class ScaleDecision:
    """An autoscaler's answer: the replica count to run and why (a CamelCase reason)."""

    replicas: int
    reason: str = ""


class Autoscaler(Protocol):
    """One autoscaling policy; ``decide`` is called once per tick, in time order, and may keep state."""

    name: str

    def decide(self, obs: Observation) -> ScaleDecision: ...


@dataclass
class _Replica:
    rid: int
    created_s: float
    ready_s: float
    batcher: ReplicaBatcher
    removed_s: float | None = None
    gone_s: float | None = None
    #: (t0_s, t1_s, interval) of the recent past, for the signal windows
    recent: deque[tuple[float, float, Interval]] = field(default_factory=deque)


@dataclass(frozen=True)
class TickRecord:
    """One autoscaler tick: the load and latency of the last tick interval and what was decided."""

    t_s: float
    offered_rps: float
    current: int
    ready: int
    desired: int
    reason: str
    p99_ms: float | None
    within_sla: float | None


@dataclass(frozen=True)
class FleetRun:
    """Outcome of one simulated trace under one autoscaler.

    Attributes:
        policy: the autoscaler's name.
        duration_s: trace length, seconds.
        gpu_seconds: GPU time held within ``[0, duration_s]``, GPU·s.
        requests: arrivals.
        within_sla: requests served within the budget T.
        refused: arrivals while no replica was Ready.
        latency_histogram: counts per log-spaced bin (:func:`histogram_bins`).
        scale_events: ticks that changed the replica count.
        ticks: per tick, see :class:`TickRecord`.
        arrivals_per_minute: arrivals in each minute of the trace.
        peak_replicas: most replicas at once.
    """

    policy: str
    duration_s: float
    gpu_seconds: float
    requests: int
    within_sla: int
    refused: int
    latency_histogram: npt.NDArray[np.int64]
    scale_events: int
    ticks: tuple[TickRecord, ...]
    arrivals_per_minute: npt.NDArray[np.int64]
    peak_replicas: int

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def slo_attainment(self) -> float:
        """Fraction of requests within the SLA (1.0 for an empty trace)."""
        return self.within_sla / self.requests if self.requests else 1.0

    @property
    def goodput_per_gpu_rps(self) -> float:
        """Requests within the SLA per GPU-second held, req/s per GPU (0 without GPU time)."""
        return self.within_sla / self.gpu_seconds if self.gpu_seconds > 0 else 0.0

    def latency_quantile_ms(self, q: float) -> float | None:
        """Latency quantile ``q`` in [0, 1] of the served requests, ms: the upper edge of its histogram bin
        (at most 0.1 % high); None when nothing was served."""
        counts = self.latency_histogram
        total = int(counts.sum())
        if total == 0:
            return None
        # the rank of the q-quantile, at least the first request (q = 0 is the smallest latency)
        idx = int(np.searchsorted(np.cumsum(counts), max(1, math.ceil(q * total)), side="left"))
        return HIST_LOW_MS * math.exp((idx + 1) * math.log1p(HIST_RESOLUTION))


def _window_sum(
    recent: deque[tuple[float, float, Interval]], since_s: float
) -> tuple[int, int, float, float, list[FloatArray]]:
    completed = executions = 0
    queue = busy = 0.0
    lats: list[FloatArray] = []
    for t0, _t1, iv in recent:
        if t0 < since_s - 1e-9:
            continue
        completed += iv.completed
        executions += iv.executions
        queue += iv.queue_ms
        busy += iv.busy_ms
        lats.append(iv.latencies_ms)
    return completed, executions, queue, busy, lats


def simulate_fleet(  # noqa: C901 (the simulator's event loop)
    trace: Trace,
    config: FleetConfig,
    autoscaler: Autoscaler,
    *,
    progress: Callable[[float], None] | None = None,
) -> FleetRun:
    """Serve ``trace`` with a fleet that ``autoscaler`` sizes every ``config.tick_s``.

    Args:
        trace: the arrivals (seconds).
        config: the fleet.
        autoscaler: the policy under test.
        progress: called with the simulated time (s) after every tick, for a progress bar.

    Returns:
        A :class:`FleetRun` with GPU time, SLO attainment, the latency histogram and the tick timeline.

    Long because the event loop keeps arrivals, ticks, scrapes and replica start-ups in one time order; each
    step's state is local to the loop.
    """
    cfg = config
    step = cfg.scrape_s
    ticks_per_step = round(cfg.tick_s / cfg.scrape_s)
    keep_s = max(cfg.window_s, cfg.p99_window_s) + step
    hist = np.zeros(_HIST_BINS, dtype=np.int64)
    minutes = np.zeros(max(1, math.ceil(trace.duration_s / 60.0)), dtype=np.int64)
    replicas: list[_Replica] = []
    next_id = 0

    def create(at_s: float, startup_s: float) -> None:
        nonlocal next_id
        rep = _Replica(next_id, at_s, at_s + startup_s, ReplicaBatcher(cfg.batcher, cfg.latency_ms, cfg.budget_ms))
        replicas.append(rep)
        next_id += 1

    for _ in range(min(cfg.initial_replicas, cfg.max_replicas)):
        create(0.0, 0.0)

    requests = within = refused = scale_events = 0
    rr = 0  # round-robin position
    picks = np.random.default_rng(cfg.balancing_seed) if cfg.balancing == RANDOM else None
    ticks: list[TickRecord] = []
    peak = len(replicas)
    tick_lats: list[FloatArray] = []
    tick_arrivals = 0

    def record(rep: _Replica, t0: float, t1: float, iv: Interval) -> None:
        nonlocal within
        if iv.completed:
            within += iv.within_budget
            hist[:] += np.bincount(histogram_bins(iv.latencies_ms), minlength=_HIST_BINS)
            tick_lats.append(iv.latencies_ms)
        rep.recent.append((t0, t1, iv))

    def advance_all(t0: float, t1: float, arrivals_s: FloatArray) -> None:
        nonlocal rr, refused
        serving = [r for r in replicas if r.removed_s is None and r.ready_s <= t0 + 1e-9]
        n = len(serving)
        if n == 0:
            refused += len(arrivals_s)
        shares = random_shares(arrivals_s, n, picks) if picks is not None and n else None
        for j, rep in enumerate(serving):
            if shares is not None:
                mine = shares[j] * 1000.0
            else:
                mine = arrivals_s[(j - rr) % n :: n] * 1000.0 if n else arrivals_s[:0]
            record(rep, t0, t1, rep.batcher.advance(mine, t1 * 1000.0))
        if n:
            rr = (rr + len(arrivals_s)) % n
        for rep in replicas:
            if rep.removed_s is not None and rep.gone_s is None:
                iv = rep.batcher.advance(np.empty(0), t1 * 1000.0)
                record(rep, t0, t1, iv)
                if rep.batcher.pending == 0 and iv.last_end_ms <= t1 * 1000.0:
                    rep.gone_s = max(rep.removed_s, iv.last_end_ms / 1000.0)

    def observe(now: float) -> Observation:
        live = [r for r in replicas if r.removed_s is None]
        ready = [r for r in live if r.ready_s <= now + 1e-9]
        completed = executions = pending = 0
        queue = 0.0
        p99: float | None = None
        for r in ready:
            c, e, q, _b, _l = _window_sum(r.recent, now - cfg.window_s)
            completed, executions, queue = completed + c, executions + e, queue + q
            pending += r.batcher.pending
            lats = [a for a in _window_sum(r.recent, now - cfg.p99_window_s)[4] if a.size]
            if lats:
                joined = np.concatenate(lats)
                value = float(np.percentile(joined, 99))
                p99 = value if p99 is None else max(p99, value)
        busy_fractions = []
        for r in live:
            span = min(cfg.window_s, now - r.created_s)
            busy = _window_sum(r.recent, now - cfg.window_s)[3]
            busy_fractions.append(min(1.0, busy / (span * 1000.0 * cfg.batcher.executors)) if span > 0 else 0.0)
        return Observation(
            now_s=now,
            current=len(live),
            ready=len(ready),
            starting=len(live) - len(ready),
            window_s=cfg.window_s,
            request_rate_rps=completed / cfg.window_s,
            completed=completed,
            avg_batch_size=completed / executions if executions else None,
            queue_time_ms=queue / completed if completed else None,
            p99_ms=p99,
            pending_requests=pending,
            gpu_utilization=float(np.mean(busy_fractions)) if busy_fractions else None,
        )

    def scale_to(desired: int, now: float) -> None:
        live = [r for r in replicas if r.removed_s is None]
        desired = max(0, min(desired, cfg.max_replicas))
        for _ in range(desired - len(live)):
            create(now, cfg.startup_s)
        if desired < len(live):
            # ReplicaSet victims: not Ready first, then the most recently Ready
            order = sorted(live, key=lambda r: (r.ready_s <= now + 1e-9, -r.ready_s, -r.rid))
            for r in order[: len(live) - desired]:
                r.removed_s = now
                if r.ready_s > now + 1e-9:  # never served: gone at once
                    r.gone_s = now

    for k, block in enumerate(trace.blocks(step)):
        t0, t1 = k * step, min((k + 1) * step, trace.duration_s)
        requests += len(block)
        tick_arrivals += len(block)
        if len(block):
            minutes[:] += np.bincount((block // 60.0).astype(np.int64), minlength=len(minutes))[: len(minutes)]
        # replicas becoming Ready inside the block split it
        cuts = sorted({r.ready_s for r in replicas if r.removed_s is None and t0 < r.ready_s < t1})
        lo_t = t0
        for cut in [*cuts, t1]:
            lo = int(np.searchsorted(block, lo_t, side="left"))
            hi = int(np.searchsorted(block, cut, side="left"))
            advance_all(lo_t, cut, block[lo:hi])
            lo_t = cut
        for r in replicas:
            while r.recent and r.recent[0][1] < t1 - keep_s:
                r.recent.popleft()
        if (k + 1) % ticks_per_step == 0 and t1 < trace.duration_s:
            obs = observe(t1)
            decision = autoscaler.decide(obs) if t1 >= cfg.warmup_s else ScaleDecision(obs.current, "WarmUp")
            desired = max(0, min(decision.replicas, cfg.max_replicas))
            if desired != obs.current:
                scale_events += 1
                scale_to(desired, t1)
            joined = np.concatenate(tick_lats) if tick_lats else np.empty(0)
            ticks.append(
                TickRecord(
                    t_s=t1,
                    offered_rps=tick_arrivals / cfg.tick_s,
                    current=obs.current,
                    ready=obs.ready,
                    desired=desired,
                    reason=decision.reason,
                    p99_ms=float(np.percentile(joined, 99)) if joined.size else None,
                    within_sla=float(np.mean(joined <= cfg.budget_ms)) if joined.size else None,
                )
            )
            tick_lats.clear()
            tick_arrivals = 0
            peak = max(peak, sum(1 for r in replicas if r.removed_s is None))
            if progress is not None:
                progress(t1)
    # the trace is over: every queue drains (its requests count), GPU time stops at the end of the trace
    end = trace.duration_s
    for r in replicas:
        iv = r.batcher.advance(np.empty(0), math.inf)
        if iv.completed:
            record(r, end, end, iv)
    gpu_seconds = 0.0
    for r in replicas:
        stop = min(end, r.gone_s if r.gone_s is not None else end)
        gpu_seconds += max(0.0, stop - r.created_s) * cfg.gpus_per_replica
    return FleetRun(
        policy=autoscaler.name,
        duration_s=trace.duration_s,
        gpu_seconds=gpu_seconds,
        requests=requests,
        within_sla=within,
        refused=refused,
        latency_histogram=hist,
        scale_events=scale_events,
        ticks=tuple(ticks),
        arrivals_per_minute=minutes,
        peak_replicas=peak,
    )


def minute_spans(minutes: int, duration_s: float) -> FloatArray:
    """Length of each minute of a trace, seconds (the last one may be partial)."""
    spans = np.full(minutes, 60.0)
    if minutes:
        spans[-1] = duration_s - 60.0 * (minutes - 1)
    return spans


def minute_rates(arrivals_per_minute: Sequence[int] | npt.NDArray[np.int64], duration_s: float) -> FloatArray:
    """Arrival rate of each minute, req/s (a partial last minute over its own length)."""
    counts = np.asarray(arrivals_per_minute, dtype=np.float64)
    spans = minute_spans(len(counts), duration_s)
    out: FloatArray = np.divide(counts, spans, out=np.zeros_like(counts), where=spans > 0)
    return out


def lower_bound_gpu_seconds(
    arrivals_per_minute: Sequence[int] | npt.NDArray[np.int64],
    capacity_rps: float,
    gpus_per_replica: int,
    *,
    duration_s: float,
    whole_replicas: bool = True,
) -> float:
    """GPU time no autoscaler can beat on the same hardware: each minute ``λ_m / C`` replicas,
    rounded up to whole replicas when ``whole_replicas``, with no start-up delay and no headroom.

    Args:
        arrivals_per_minute: arrivals in each minute of the trace (the last minute may be partial).
        capacity_rps: capacity at SLA per replica C, req/s (> 0).
        gpus_per_replica: GPUs per replica.
        duration_s: trace length, seconds.

    Raises:
        ValueError: when ``capacity_rps`` is not a positive finite number.
    """
    if not (math.isfinite(capacity_rps) and capacity_rps > 0):
        raise ValueError(f"capacity_rps={capacity_rps!r} must be a positive finite number")
    spans = minute_spans(len(arrivals_per_minute), duration_s)
    need = minute_rates(arrivals_per_minute, duration_s) / capacity_rps
    if whole_replicas:
        need = np.ceil(need - 1e-9)
    return float(np.sum(need * spans) * gpus_per_replica)
