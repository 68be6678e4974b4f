"""Discrete-event model of one Triton replica's dynamic batcher.

Semantics follow Triton's dynamic batcher (docs: user_guide/model_configuration.md#dynamic-batcher and
batcher.md; server PR#3789, which made the batcher keep growing the pending batch while every model instance
is busy):

* requests join one FIFO queue;
* when a model instance is free, a batch is dispatched as soon as the pending requests reach a preferred batch
  size (the smallest one suffices: Triton sends the largest preferred size it can form, and arrivals come one
  at a time), reach ``max_batch_size``, or the oldest pending request has waited ``max_queue_delay``;
* while every instance is busy the pending batch keeps growing, so the batch that starts when an instance frees
  up holds every request pending then, up to ``max_batch_size``;
* a batch of ``b`` requests occupies its instance for ``l(b)`` milliseconds.

Instances are independent executors (one per GPU): several instances sharing one GPU share its throughput,
which for a profile measured with one execution at a time is the same as one executor.

Pure: arrival times are passed in; nothing is read from the clock or the environment. The event loop is compiled
with numba (a plan simulates a few dozen runs of 12,000-40,000 requests; in Python that was 0.1-0.4 s a plan).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class BatcherConfig:
    """The dynamic-batcher settings of one replica.

    Attributes:
        max_batch_size: Triton ``max_batch_size``; 0 means batching off (each request runs alone).
        preferred_batch_sizes: Triton ``preferred_batch_size``; empty means ``(max_batch_size,)``.
        max_queue_delay_us: Triton ``max_queue_delay_microseconds`` (µs).
        executors: model instances that execute in parallel (one per GPU).
    """

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    executors: int = 1

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size={self.max_batch_size} must be >= 0")
        if self.executors < 1:
            raise ValueError(f"executors={self.executors} must be >= 1")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us={self.max_queue_delay_us} must be >= 0")
        for p in self.preferred_batch_sizes:
            if not 1 <= p <= max(1, self.max_batch_size):
                raise ValueError(f"preferred batch size {p} outside [1, {max(1, self.max_batch_size)}]")

    @property
    def batch_cap(self) -> int:
        """Largest batch an execution can hold (1 when batching is off)."""
        return max(1, self.max_batch_size)

    @property
    def dispatch_threshold(self) -> int:
        """Pending requests that trigger a dispatch before the delay expires."""
        if self.max_batch_size == 0:
            return 1
        return min(self.preferred_batch_sizes) if self.preferred_batch_sizes else self.max_batch_size


@dataclass(frozen=True)
class BatcherRun:
    """Outcome of one simulation.

    Attributes:
        latencies_ms: per request (in arrival order), queue wait + execution, ms; only the requests that were
            dispatched before the run stopped.
        batch_sizes: size of each executed batch, in dispatch order.
        dispatch_ms: start time of each batch, ms.
        completed: False when the run stopped early because ``max_violations`` was exceeded.
        violations: requests whose latency exceeded ``budget_ms`` (0 when no budget was given).
    """

    latencies_ms: npt.NDArray[np.float64]
    batch_sizes: npt.NDArray[np.int64]
    dispatch_ms: npt.NDArray[np.float64]
    completed: bool
    violations: int


def simulate_batcher(
    arrivals_ms: Sequence[float] | npt.NDArray[np.float64],
    config: BatcherConfig,
    latency_ms: Sequence[float] | npt.NDArray[np.float64],
    *,
    budget_ms: float | None = None,
    max_violations: int | None = None,
) -> BatcherRun:
    """Run the batcher over sorted arrival times.

    Args:
        arrivals_ms: non-decreasing arrival times, ms (a list or a float64 array).
        config: batcher settings.
        latency_ms: ``latency_ms[b]`` is the execution latency of a batch of ``b`` requests, ms, for
            ``1 <= b <= config.batch_cap`` (index 0 unused).
        budget_ms: latency budget used to count violations.
        max_violations: stop as soon as more requests than this exceeded ``budget_ms`` (the p99 is then
            known to be over budget; saves simulating an exploding queue).

    Raises:
        ValueError: when ``latency_ms`` does not cover ``config.batch_cap``.
    """
    cap = config.batch_cap
    if len(latency_ms) <= cap:
        raise ValueError(f"latency_ms covers batch sizes up to {len(latency_ms) - 1}, need {cap}")
    a = np.ascontiguousarray(arrivals_ms, dtype=np.float64)
    delay = config.max_queue_delay_us / 1000.0 if config.max_batch_size > 0 else 0.0
    use_budget = budget_ms is not None
    check = use_budget and max_violations is not None
    starts, sizes, latencies, completed, violations = _kernel()(
        a,
        delay,
        config.dispatch_threshold,
        cap,
        np.ascontiguousarray(latency_ms, dtype=np.float64),
        config.executors,
        budget_ms if budget_ms is not None else 0.0,
        max_violations if max_violations is not None else 0,
        check,
        use_budget,
    )
    return BatcherRun(
        latencies_ms=latencies,
        batch_sizes=sizes,
        dispatch_ms=starts,
        completed=bool(completed),
        violations=int(violations),
    )


def _run(
    a: npt.NDArray[np.float64],
    delay: float,
    threshold: int,
    cap: int,
    lat: npt.NDArray[np.float64],
    executors: int,
    budget: float,
    limit: int,
    check: bool,
    use_budget: bool,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.float64], bool, int]:
    """The event loop of :func:`simulate_batcher`, compiled by numba (see :func:`_kernel`).

    Returns (batch start times ms, batch sizes, latency of each dispatched request ms, completed, violations).
    The arithmetic is the same IEEE double operations in the same order as the pure-Python loop it replaced
    (``sim/batcher.py`` of commit 099221c, which benchmarks/plan_baseline.py loads), so the results are
    bit-identical: the earliest free executor is the minimum of ``free`` (what a heap pop returns), and the sorted
    arrivals are scanned where that loop bisected.
    """
    n = a.shape[0]
    free = np.zeros(executors)
    starts = np.empty(n)
    latencies = np.empty(n)
    sizes = np.empty(n, np.int64)
    batches = 0
    head = 0
    violations = 0
    completed = True
    while head < n:
        j = 0
        for e in range(1, executors):
            if free[e] < free[j]:
                j = e
        t_free = free[j]
        trigger = a[head] + delay
        last = head + threshold - 1
        if last < n and a[last] < trigger:
            trigger = a[last]
        t = t_free if t_free > trigger else trigger
        stop = min(n, head + cap)
        i = head
        while i < stop and a[i] <= t:  # every pending request up to the cap joins the batch
            i += 1
        k = i - head
        end = t + lat[k]
        free[j] = end
        starts[batches] = t
        sizes[batches] = k
        batches += 1
        for i in range(head, head + k):
            latencies[i] = end - a[i]
        if use_budget:
            late = end - budget  # requests that arrived before end - budget waited too long
            i = head
            while i < head + k and a[i] < late:
                i += 1
            violations += i - head
            if check and violations > limit:
                completed = False
                head += k
                break
        head += k
    return starts[:batches], sizes[:batches], latencies[:head], completed, violations


_compiled: list[Callable[..., Any]] = []
_compile_lock = threading.Lock()


def _kernel() -> Callable[..., Any]:
    """:func:`_run` compiled by numba on first use (about 1 s; later processes load it from numba's on-disk cache
    where the package directory or ``NUMBA_CACHE_DIR`` is writable, and compile once per process where neither is).

    ``nogil``: the compiled loop releases the GIL, so plans made in several threads (kopf's handler executor, the
    controller's loops) run on several cores. Numba: https://numba.readthedocs.io/en/stable/user/jit.html.
    """
    if not _compiled:
        with _compile_lock:
            if not _compiled:
                import numba  # here, not at module import: commands that never simulate do not pay its import

                try:
                    fn = numba.njit(cache=True, nogil=True)(_run)
                except RuntimeError:  # no writable cache location (a read-only install, no HOME)
                    fn = numba.njit(cache=False, nogil=True)(_run)
                _compiled.append(fn)
    return _compiled[0]


def poisson_unit_arrivals(count: int, seed: int) -> npt.NDArray[np.float64]:
    """Cumulative sums of ``count`` unit-rate exponential gaps: Poisson arrival times at rate 1.

    Scaling by ``1000 / rate_rps`` gives arrival times in ms at ``rate_rps``; reusing the same draws for every
    rate (common random numbers) makes p99-versus-rate smooth, so bisection on it is stable.
    """
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0, size=count))
