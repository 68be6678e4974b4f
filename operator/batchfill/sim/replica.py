"""One Triton replica's dynamic batcher, advanced interval by interval (for the fleet simulator).

Same batching rule as :func:`batchfill.sim.batcher.simulate_batcher` (see its module docstring), but the
arrivals come in consecutive intervals and the run can be resumed: :meth:`ReplicaBatcher.advance` takes the
arrivals of ``[t_prev, t_until)`` and performs every dispatch that starts before ``t_until``. A dispatch at
time ``t < t_until`` depends only on arrivals up to ``t``, which are all known, so cutting the arrivals into
intervals changes nothing: the dispatches equal those of one ``simulate_batcher`` call over all arrivals
(a unit test checks it).

Pure: times are passed in (ms).
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

#: Pending arrivals are compacted once this many have been dispatched.
_COMPACT = 4096


@dataclass(frozen=True)
class Interval:
    """What one replica did in one call of :meth:`ReplicaBatcher.advance` (batches started in the interval).

    Attributes:
        completed: requests dispatched (their batches start in the interval).
        executions: batches executed.
        queue_ms: Σ over those requests of (batch start − arrival), ms (Triton's queue duration).
        busy_ms: Σ over those batches of the execution latency, ms (GPU busy time).
        latencies_ms: per request, queue + execution, ms.
        within_budget: requests whose latency is ≤ the budget given to the batcher.
        pending: requests still waiting at the end of the interval.
        last_end_ms: end of the last execution started so far, ms (-inf before the first).
    """

    completed: int
    executions: int
    queue_ms: float
    busy_ms: float
    latencies_ms: npt.NDArray[np.float64]
    within_budget: int
    pending: int
    last_end_ms: float


class ReplicaBatcher:
    """A resumable batcher for one replica.

    Args:
        config: batcher settings (executors = GPUs of the replica).
        latency_ms: ``latency_ms[b]`` for ``1 <= b <= config.batch_cap`` (index 0 unused), ms.
        budget_ms: latency budget for :attr:`Interval.within_budget`, ms.

    Raises:
        ValueError: when ``latency_ms`` does not cover ``config.batch_cap``.
    """

    def __init__(self, config: BatcherConfig, latency_ms: Sequence[float], budget_ms: float) -> None:
        if len(latency_ms) <= config.batch_cap:
            raise ValueError(f"latency_ms covers batch sizes up to {len(latency_ms) - 1}, need {config.batch_cap}")
        self._cap = config.batch_cap
        self._delay = config.max_queue_delay_us / 1000.0 if config.max_batch_size > 0 else 0.0
        self._threshold = config.dispatch_threshold
        self._lat = list(latency_ms)
        self._budget = budget_ms
        self._free = [0.0] * config.executors
        self._a: list[float] = []
        self._head = 0
        self._last_end = -math.inf

    @property
    def pending(self) -> int:
        """Requests waiting for a batch now."""
        return len(self._a) - self._head

    def advance(self, arrivals_ms: npt.NDArray[np.float64] | Sequence[float], until_ms: float) -> Interval:
        """Add sorted ``arrivals_ms`` (all ≥ earlier ones, < ``until_ms``) and dispatch what starts before
        ``until_ms`` (``math.inf`` drains the queue)."""
        a = self._a
        if self._head > _COMPACT:
            del a[: self._head]
            self._head = 0
        if len(arrivals_ms):
            a.extend(arrivals_ms.tolist() if isinstance(arrivals_ms, np.ndarray) else arrivals_ms)
        n = len(a)
        head = self._head
        start_head = head
        free, lat, cap, delay, threshold = self._free, self._lat, self._cap, self._delay, self._threshold
        starts: list[float] = []
        sizes: list[int] = []
        busy = 0.0
        while head < n:
            t_free = free[0]
            if t_free >= until_ms:
                break
            trigger = a[head] + delay
            last = head + threshold - 1
            if last < n and a[last] < trigger:
                trigger = a[last]
            t = t_free if t_free > trigger else trigger
            if t >= until_ms:  # arrivals after until_ms are unknown yet and could join this batch
                break
            k = bisect_right(a, t, head, min(n, head + cap)) - head
            run = lat[k]
            heapq.heapreplace(free, t + run)
            starts.append(t)
            sizes.append(k)
            busy += run
            head += k
        self._head = head
        done = head - start_head
        if not sizes:
            return Interval(0, 0, 0.0, 0.0, np.empty(0), 0, n - head, self._last_end)
        start_arr = np.asarray(starts)
        size_arr = np.asarray(sizes, dtype=np.int64)
        end_arr = start_arr + np.asarray([lat[k] for k in sizes])
        arr = np.asarray(a[start_head:head])
        latencies = np.repeat(end_arr, size_arr) - arr
        # per request, not Σstart·size − Σarrival: that difference of large sums cancels to tiny negatives
        queue_ms = float((np.repeat(start_arr, size_arr) - arr).sum())
        within = int(np.count_nonzero(latencies <= self._budget))
        self._last_end = max(self._last_end, float(end_arr.max()))
        return Interval(done, len(sizes), queue_ms, busy, latencies, within, n - head, self._last_end)
