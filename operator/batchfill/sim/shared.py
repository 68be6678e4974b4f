"""One Triton server hosting several models whose executions share the server's GPU(s).

Each model keeps its own dynamic batcher and configuration (:mod:`batchfill.sim.batcher`'s rule: one FIFO queue,
dispatch when a model instance is free and the pending requests reach the dispatch threshold or the oldest has
waited ``max_queue_delay``; the pending batch grows while every instance of the model is busy). What the models
share is the GPU, and the execution model is the conservative one:

* the GPU runs one batch at a time (``gpus`` GPUs: ``gpus`` batches at a time, each on the earliest free GPU);
* batches run in the order they are dispatched (become ready), first come first served;
* a dispatched batch holds its model instance until its execution ends, so waiting for the GPU counts as
  instance busy time and the model's next batch grows meanwhile, as in Triton, where each model's scheduler
  hands the batch to that model's own instance, which then waits for the device;
* a batch of ``b`` requests of model ``m`` occupies the GPU for ``l_m(b)`` ms, its latency measured alone.

Why conservative: real GPUs overlap kernels of different models (CUDA streams, MPS), so two executions together
take less than the sum of their solo latencies; serializing them over-estimates interference, and a placement that
keeps every SLA here keeps it on a GPU that overlaps. It is also what a server whose model instances take one
lock per GPU does, which the real-server check can reproduce.

With one model (``gpus`` equal to its instance count) this is exactly :class:`batchfill.sim.replica.ReplicaBatcher`
and :func:`batchfill.sim.batcher.simulate_batcher`: an instance is free only when a GPU is, so no batch ever waits
for the device (a unit test compares them sample for sample).

Resumable like :class:`~batchfill.sim.replica.ReplicaBatcher`: :meth:`SharedReplica.advance` takes each model's
arrivals of ``[t_prev, t_until)`` and performs every dispatch before ``t_until``; dispatches happen in time order
across models (a model's next dispatch depends only on its own queue and instances), and one at ``t < t_until``
depends only on arrivals up to ``t``, so cutting the arrivals into intervals changes nothing.

Pure: times are passed in (ms); :func:`poisson_arrivals` is the seeded source of arrivals for a fixed rate mix.
Work: O(log M) per batch for M models (a heap of the models' next dispatch times), O(requests) in numpy.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from batchfill.sim.batcher import BatcherConfig
from batchfill.sim.replica import Interval

FloatArray = npt.NDArray[np.float64]
#: Dispatched arrivals of a model are compacted away once this many have accumulated.
_COMPACT = 4096


@dataclass(frozen=True)
class SharedModel:
    """One model on a shared server.

    Attributes:
        config: the model's dynamic-batcher settings; ``executors`` is its instance count (all on the shared GPUs).
        latency_ms: ``[0, l(1), ..., l(B)]``: execution latency alone on the GPU per batch size, ms.
        budget_ms: the model's latency budget T, ms (for :attr:`Interval.within_budget`).
    """

    config: BatcherConfig
    latency_ms: tuple[float, ...]
    budget_ms: float

    def __post_init__(self) -> None:
        if len(self.latency_ms) <= self.config.batch_cap:
            raise ValueError(
                f"latency_ms covers batch sizes up to {len(self.latency_ms) - 1}, need {self.config.batch_cap}"
            )


@dataclass(frozen=True)
class SharedInterval:
    """What a shared server did in one :meth:`SharedReplica.advance` (batches dispatched in the interval).

    Attributes:
        models: per model, in the server's order: its :class:`~batchfill.sim.replica.Interval`; ``queue_ms`` is
            Σ (dispatch − arrival), Triton's queue duration, ``busy_ms`` Σ l(b) of its batches (GPU time it used).
        gpu_wait_ms: per model, Σ over its batches of (GPU start − dispatch), ms: time spent behind other batches.
        batch_sizes: per model, the size of each batch dispatched in the interval, in dispatch order.
    """

    models: tuple[Interval, ...]
    gpu_wait_ms: tuple[float, ...]
    batch_sizes: tuple[npt.NDArray[np.int64], ...]

    @property
    def gpu_busy_ms(self) -> float:
        """GPU time used by the batches dispatched in the interval, all models, ms."""
        return sum(iv.busy_ms for iv in self.models)


class _Queue:
    """One model's batcher state: arrivals, head of queue, instance free times."""

    __slots__ = ("a", "budget", "cap", "delay", "free", "head", "last_end", "lat", "threshold")

    def __init__(self, model: SharedModel) -> None:
        c = model.config
        self.cap = c.batch_cap
        self.delay = c.max_queue_delay_us / 1000.0 if c.max_batch_size > 0 else 0.0
        self.threshold = c.dispatch_threshold
        self.lat = list(model.latency_ms)
        self.budget = model.budget_ms
        self.free = [0.0] * c.executors
        self.a: list[float] = []
        self.head = 0
        self.last_end = -math.inf

    def next_dispatch(self) -> float:
        """When the next batch is dispatched given the arrivals known now (inf without pending requests)."""
        a, head = self.a, self.head
        if head >= len(a):
            return math.inf
        trigger = a[head] + self.delay
        last = head + self.threshold - 1
        if last < len(a) and a[last] < trigger:
            trigger = a[last]
        t_free = self.free[0]
        return t_free if t_free > trigger else trigger


class SharedReplica:
    """A resumable Triton server whose models share ``gpus`` GPUs (see the module docstring).

    Args:
        models: the hosted models, in a fixed order (ties in dispatch time go to the earlier model).
        gpus: GPUs of the server; batches of every model run on them one at a time each.

    Raises:
        ValueError: no models, or ``gpus < 1``.
    """

    def __init__(self, models: Sequence[SharedModel], gpus: int = 1) -> None:
        if not models:
            raise ValueError("a shared server hosts at least one model")
        if gpus < 1:
            raise ValueError(f"gpus={gpus} must be >= 1")
        self._q = [_Queue(m) for m in models]
        self._gpu = [0.0] * gpus

    @property
    def pending(self) -> tuple[int, ...]:
        """Requests waiting for a batch now, per model."""
        return tuple(len(q.a) - q.head for q in self._q)

    def advance(self, arrivals_ms: Sequence[FloatArray | Sequence[float]], until_ms: float) -> SharedInterval:
        """Add each model's sorted arrivals (all ≥ its earlier ones, < ``until_ms``) and perform every dispatch
        before ``until_ms`` (``math.inf`` drains every queue).

        Raises:
            ValueError: when ``arrivals_ms`` does not have one sequence per model.
        """
        if len(arrivals_ms) != len(self._q):
            raise ValueError(f"{len(arrivals_ms)} arrival sequences for {len(self._q)} models")
        starts: list[int] = []
        for q, new in zip(self._q, arrivals_ms, strict=True):
            if q.head > _COMPACT:
                del q.a[: q.head]
                q.head = 0
            if len(new):
                q.a.extend(new.tolist() if isinstance(new, np.ndarray) else new)
            starts.append(q.head)
        batches = self._dispatch(until_ms)
        return self._summarize(starts, batches)

    def _dispatch(self, until_ms: float) -> list[list[tuple[float, float, int]]]:
        """Every dispatch before ``until_ms``, in time order; per model its (dispatch, GPU start, size)."""
        qs, gpu = self._q, self._gpu
        out: list[list[tuple[float, float, int]]] = [[] for _ in qs]
        ready = [(q.next_dispatch(), i) for i, q in enumerate(qs)]
        heapq.heapify(ready)
        replace_top = heapq.heapreplace
        while ready:
            t, i = ready[0]
            if t >= until_ms:  # arrivals after until_ms are unknown yet and could join this batch
                break
            q = qs[i]
            a, head, n = q.a, q.head, len(q.a)
            hi = head + q.cap
            k = bisect_right(a, t, head, n if n < hi else hi) - head
            g = gpu[0]
            start = g if g > t else t
            end = start + q.lat[k]
            replace_top(gpu, end)
            replace_top(q.free, end)
            head += k
            q.head = head
            if end > q.last_end:
                q.last_end = end
            out[i].append((t, start, k))
            # the model's next dispatch (_Queue.next_dispatch, inlined: this loop is the simulator's hot path)
            if head >= n:
                replace_top(ready, (math.inf, i))
                continue
            trigger = a[head] + q.delay
            last = head + q.threshold - 1
            if last < n and a[last] < trigger:
                trigger = a[last]
            f = q.free[0]
            replace_top(ready, (f if f > trigger else trigger, i))
        return out

    def _summarize(self, starts: list[int], batches: list[list[tuple[float, float, int]]]) -> SharedInterval:
        intervals: list[Interval] = []
        waits: list[float] = []
        all_sizes: list[npt.NDArray[np.int64]] = []
        for q, first, done in zip(self._q, starts, batches, strict=True):
            pending = len(q.a) - q.head
            if not done:
                intervals.append(Interval(0, 0, 0.0, 0.0, np.empty(0), 0, pending, q.last_end))
                waits.append(0.0)
                all_sizes.append(np.empty(0, dtype=np.int64))
                continue
            disp = np.asarray([b[0] for b in done])
            gpu_start = np.asarray([b[1] for b in done])
            sizes = np.asarray([b[2] for b in done], dtype=np.int64)
            run = np.asarray([q.lat[b[2]] for b in done])
            arr = np.asarray(q.a[first : q.head])
            latencies = np.repeat(gpu_start + run, sizes) - arr
            queue_ms = float((np.repeat(disp, sizes) - arr).sum())
            within = int(np.count_nonzero(latencies <= q.budget))
            intervals.append(
                Interval(len(arr), len(done), queue_ms, float(run.sum()), latencies, within, pending, q.last_end)
            )
            waits.append(float((gpu_start - disp).sum()))
            all_sizes.append(sizes)
        return SharedInterval(tuple(intervals), tuple(waits), tuple(all_sizes))


@dataclass(frozen=True)
class SharedRun:
    """Outcome of :func:`simulate_shared`, per model in the server's order.

    Attributes:
        latencies_ms: per model, per request in arrival order: queue + GPU wait + execution, ms.
        batch_sizes: per model, size of each executed batch in dispatch order.
        gpu_busy_fraction: GPU busy time / (GPUs × span from 0 to the last execution's end).
    """

    latencies_ms: tuple[FloatArray, ...]
    batch_sizes: tuple[npt.NDArray[np.int64], ...]
    gpu_busy_fraction: float


def simulate_shared(
    arrivals_ms: Sequence[FloatArray | Sequence[float]], models: Sequence[SharedModel], gpus: int = 1
) -> SharedRun:
    """Run a shared server over every model's sorted arrivals, draining every queue (one-shot form).

    Raises:
        ValueError: as :class:`SharedReplica` and :meth:`SharedReplica.advance`.
    """
    server = SharedReplica(models, gpus)
    iv = server.advance(arrivals_ms, math.inf)
    end = max((m.last_end_ms for m in iv.models), default=-math.inf)
    busy = iv.gpu_busy_ms
    frac = busy / (gpus * end) if end > 0 else 0.0
    return SharedRun(tuple(m.latencies_ms for m in iv.models), iv.batch_sizes, frac)


def poisson_arrivals(rates_rps: Sequence[float], duration_s: float, seed: int) -> list[FloatArray]:
    """Independent Poisson arrival times (ms) in ``[0, duration_s)`` for each model's rate (req/s).

    Each model draws unit-rate exponential gaps from its own stream of ``numpy.random.SeedSequence(seed).spawn``
    and scales them by ``1000 / rate``: adding a model leaves the others' arrivals unchanged, and a model at a
    slightly different rate sees the same arrivals slightly compressed (common random numbers, so that a simulated
    p99 moves smoothly with the rates). A rate of 0 gives no arrivals.

    Raises:
        ValueError: for a negative or non-finite rate or duration.
    """
    if not (math.isfinite(duration_s) and duration_s >= 0):
        raise ValueError(f"duration_s={duration_s!r} must be finite and >= 0")
    out: list[FloatArray] = []
    for r, child in zip(rates_rps, np.random.SeedSequence(seed).spawn(len(rates_rps)), strict=True):
        if not (math.isfinite(r) and r >= 0):
            raise ValueError(f"rate {r!r} must be finite and >= 0")
        expected = r * duration_s
        if expected == 0:
            out.append(np.empty(0))
            continue
        rng = np.random.default_rng(child)
        # enough unit gaps to pass the horizon with overwhelming probability; more are drawn if not
        unit = np.cumsum(rng.exponential(1.0, size=int(expected + 8 * math.sqrt(expected) + 16)))
        while unit[-1] < expected:
            unit = np.concatenate([unit, unit[-1] + np.cumsum(rng.exponential(1.0, size=len(unit)))])
        times = unit[: int(np.searchsorted(unit, expected))] * (1000.0 / r)
        out.append(times)
    return out
