"""Batch-latency profile: execution latency l(b) for any batch size within the measured range."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from batchfill.api.spec import ProfilePoint


@dataclass(frozen=True)
class LatencyProfile:
    """Monotone piecewise-linear execution latency, never extrapolated past the largest measured size.

    Latencies are made non-decreasing in batch size by a running maximum (a bigger batch is never planned as
    faster than a smaller one, so measurement noise can only make the plan more cautious). Between measured
    sizes the latency is linear; below the smallest measured size it is that size's latency (an upper bound,
    since latency does not fall with batch size).

    Attributes:
        batch_sizes: measured batch sizes, strictly increasing.
        latencies_ms: their latencies after the running maximum, ms.
    """

    batch_sizes: tuple[int, ...]
    latencies_ms: tuple[float, ...]

    @classmethod
    def from_points(cls, points: Sequence[ProfilePoint]) -> LatencyProfile:
        """Build from spec.profile (already validated: batch sizes strictly increasing, latencies > 0).

        Raises:
            ValueError: on an empty profile or sizes that are not strictly increasing.
        """
        if not points:
            raise ValueError("a profile needs at least one point")
        sizes = tuple(p.batchSize for p in points)
        if any(b2 <= b1 for b1, b2 in pairwise(sizes)):
            raise ValueError(f"profile batch sizes must be strictly increasing, got {list(sizes)}")
        lats: list[float] = []
        for p in points:
            lats.append(max(p.latencyMs, lats[-1]) if lats else p.latencyMs)
        return cls(sizes, tuple(lats))

    @property
    def largest(self) -> int:
        """Largest measured batch size: the plan never goes beyond it."""
        return self.batch_sizes[-1]

    def latency_ms(self, batch_size: int) -> float:
        """l(b) in ms.

        Raises:
            ValueError: for b < 1 or b > the largest measured batch size (no extrapolation).
        """
        if batch_size < 1 or batch_size > self.largest:
            raise ValueError(
                f"batch size {batch_size} is outside the profile [1, {self.largest}]; it is never extrapolated"
            )
        sizes, lats = self.batch_sizes, self.latencies_ms
        if batch_size <= sizes[0]:
            return lats[0]
        for i in range(1, len(sizes)):
            if batch_size <= sizes[i]:
                b0, b1, l0, l1 = sizes[i - 1], sizes[i], lats[i - 1], lats[i]
                return l0 + (l1 - l0) * (batch_size - b0) / (b1 - b0)
        return lats[-1]  # unreachable: batch_size <= largest

    def table(self, up_to: int) -> list[float]:
        """``[0.0, l(1), ..., l(up_to)]``: index = batch size (the simulator's lookup table)."""
        if up_to > self.largest:
            raise ValueError(f"batch size {up_to} is outside the profile [1, {self.largest}]; it is never extrapolated")
        # np.interp is linear between points and flat below the first one: the same rule as latency_ms.
        table = np.interp(np.arange(up_to + 1, dtype=np.float64), self.batch_sizes, self.latencies_ms)
        table[0] = 0.0
        return [float(x) for x in table]

    def largest_within(self, budget_ms: float, cap: int | None = None) -> int:
        """Largest batch size b <= cap with l(b) <= budget_ms; 0 when not even b = 1 fits."""
        top = self.largest if cap is None else min(cap, self.largest)
        lo, hi = 0, top  # invariant: l(lo) <= budget (or lo == 0), l(b) > budget for b > hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.latency_ms(mid) <= budget_ms:
                lo = mid
            else:
                hi = mid - 1
        return lo
