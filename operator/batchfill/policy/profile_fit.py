"""A batch-latency profile fitted from Triton's own statistics, and when it should replace the declared one.

Input: per batch size, executions and total execution time (``batch_stats[b]``: compute_input + compute_infer +
compute_output, summed over the BatchedModel's Ready pods as deltas since each pod was first seen, so model
warm-up is excluded). Output: the mean execution latency of every size with enough executions, plus — when
live traffic never formed batches as large as the plan may use — a point at that size from a weighted
least-squares line ``l(b) = α + β·b`` through the measured sizes. The line is an assumption: it over-estimates
a latency that bends down at large ``b`` (GPU batching, Clipper NSDI'17 Fig. 3), but under-estimates one that
grows faster than linearly (the CPU-run example model: −21 % at b = 16 from sizes 1-3), and one that is flat at
small ``b`` then linear. A model whose latency is not at most linear should declare its profile (``batchfill
profile``) or cap ``spec.batching.maxBatchSize``; the first live batches of the new plan are measured too, and
a disagreement beyond the tolerance re-plans after the interval.

The replan rule: a measured profile is adopted when the spec declares none (``Measured``), or when at some
measured size it differs from the declared profile by more than the stated tolerance; at most once per
stated interval, so a noisy measurement cannot roll the Deployment in a loop.

Pure: numbers in, numbers out; time is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from batchfill.api.reasons import ReplanReason
from batchfill.api.spec import PROFILE_POINTS_MAX, ProfilePoint
from batchfill.policy.profile import LatencyProfile


@dataclass(frozen=True)
class BatchTotals:
    """Executions of one batch size and their total execution time (ns), over all pods."""

    batch_size: int
    executions: int
    total_ns: int


@dataclass(frozen=True)
class FittedPoint:
    """One point of the measured profile: mean execution latency (ms) from ``executions`` runs;
    ``extrapolated`` points come from the fitted line, with ``executions`` 0."""

    batch_size: int
    latency_ms: float
    executions: int
    extrapolated: bool = False


def fit_profile(totals: Sequence[BatchTotals], *, min_executions: int, up_to: int | None = None) -> list[FittedPoint]:
    """The measured profile, batch sizes ascending (empty when no size has ``min_executions`` runs).

    Args:
        totals: per batch size; sizes < 1, negative counts and non-finite or non-positive times are ignored.
        min_executions: runs a size needs to count.
        up_to: the largest batch size the plan may use; when above every measured size and at least two sizes
            were measured, a point at ``up_to`` is added from the line fitted by least squares weighted by
            executions (slope clipped at 0), never below the largest measured mean.

    At most :data:`~batchfill.api.spec.PROFILE_POINTS_MAX` points (the line is fitted through all of them first).
    """
    merged: dict[int, tuple[int, int]] = {}
    for t in totals:
        if t.batch_size < 1 or t.executions <= 0 or t.total_ns <= 0:
            continue
        n, ns = merged.get(t.batch_size, (0, 0))
        merged[t.batch_size] = (n + t.executions, ns + t.total_ns)
    points = [FittedPoint(b, ns / n / 1e6, n) for b, (n, ns) in sorted(merged.items()) if n >= max(1, min_executions)]
    points = [p for p in points if math.isfinite(p.latency_ms) and p.latency_ms > 0]
    if up_to is not None and len(points) >= 2 and up_to > points[-1].batch_size:
        alpha, beta = _weighted_line(points)
        value = max(alpha + beta * up_to, points[-1].latency_ms)
        return [*_thin(points, PROFILE_POINTS_MAX - 1), FittedPoint(up_to, value, 0, extrapolated=True)]
    return _thin(points, PROFILE_POINTS_MAX)


def _thin(points: list[FittedPoint], most: int) -> list[FittedPoint]:
    """At most ``most`` (>= 2) of ``points``, evenly spaced by rank, the smallest and the largest size kept: a model
    measured at thousands of batch sizes would put hundreds of KiB into status (twice: measured and planned)."""
    if len(points) <= most:
        return points
    return [points[round(i * (len(points) - 1) / (most - 1))] for i in range(most)]


def _weighted_line(points: Sequence[FittedPoint]) -> tuple[float, float]:
    """Least-squares ``α + β·b`` weighted by executions, ``β >= 0``."""
    w = [float(p.executions) for p in points]
    sw = sum(w)
    mb = sum(wi * p.batch_size for wi, p in zip(w, points, strict=True)) / sw
    ml = sum(wi * p.latency_ms for wi, p in zip(w, points, strict=True)) / sw
    sbb = sum(wi * (p.batch_size - mb) ** 2 for wi, p in zip(w, points, strict=True))
    sbl = sum(wi * (p.batch_size - mb) * (p.latency_ms - ml) for wi, p in zip(w, points, strict=True))
    beta = max(0.0, sbl / sbb) if sbb > 0 else 0.0
    return ml - beta * mb, beta


@dataclass(frozen=True)
class Disagreement:
    """The largest relative difference between measured and declared latency, at a measured size."""

    batch_size: int
    declared_ms: float
    measured_ms: float

    @property
    def relative(self) -> float:
        """(measured − declared) / declared."""
        return (self.measured_ms - self.declared_ms) / self.declared_ms


def largest_disagreement(declared: LatencyProfile, measured: Sequence[FittedPoint]) -> Disagreement | None:
    """Worst measured (not extrapolated) size within the declared range; None when none overlaps."""
    worst: Disagreement | None = None
    for p in measured:
        if p.extrapolated or p.batch_size > declared.largest:
            continue
        d = Disagreement(p.batch_size, declared.latency_ms(p.batch_size), p.latency_ms)
        if worst is None or abs(d.relative) > abs(worst.relative):
            worst = d
    return worst


@dataclass(frozen=True)
class ReplanDecision:
    """Whether to plan from the measured profile now, and why (the reason, and a message with the numbers)."""

    replan: bool
    reason: ReplanReason
    message: str


def decide_replan(
    *,
    declared: LatencyProfile | None,
    measured: Sequence[FittedPoint],
    adopted: Sequence[FittedPoint] | None,
    tolerance: float,
    interval_s: float,
    last_replan_s: float | None,
    now_s: float,
    min_sizes: int = 1,
) -> ReplanDecision:
    """Adopt ``measured`` for the plan?

    Args:
        declared: spec.profile (None: the spec declares none, the source is Measured).
        measured: the fitted profile now.
        adopted: the measured profile the current plan uses (None: the plan uses the declared one, or the
            conservative first plan).
        tolerance: relative difference that counts as disagreement (0.15 = 15 %).
        interval_s: least time between two replans, seconds.
        last_replan_s: when the last replan happened (None: never), seconds.
        now_s: now, seconds, same epoch.
        min_sizes: measured batch sizes any adoption needs. One size is compared with the declared or adopted
            profile (and the disagreement reported), but never adopted: a profile is not extrapolated from a
            single point, so the plan would be pinned to that batch size, and Triton would never form a larger
            one to measure (a review pinned a declared B=8 model at B=1, 4x the GPUs, this way).
    """
    real = [p for p in measured if not p.extrapolated]
    if not real:
        return ReplanDecision(False, ReplanReason.AWAITING_MEASUREMENT, "no batch size has enough executions yet")
    if declared is None and not adopted and len(real) < min_sizes:
        sizes = ", ".join(str(p.batch_size) for p in real)
        return ReplanDecision(
            False,
            ReplanReason.AWAITING_MEASUREMENT,
            f"measured batch size(s) {sizes}; {min_sizes} sizes are needed to plan",
        )
    if last_replan_s is not None and now_s - last_replan_s < interval_s:
        wait = interval_s - (now_s - last_replan_s)
        return ReplanDecision(
            False,
            ReplanReason.REPLAN_INTERVAL_NOT_ELAPSED,
            f"last replan {now_s - last_replan_s:.0f} s ago; the next may come in {wait:.0f} s",
        )
    reference = LatencyProfile.from_points(_as_profile(adopted)) if adopted else declared
    if reference is None:
        sizes = ", ".join(f"{p.batch_size}: {p.latency_ms:.3g} ms" for p in measured)
        return ReplanDecision(
            True, ReplanReason.PROFILE_MEASURED, f"measured profile ({sizes}) replaces the plan's profile"
        )
    worst = largest_disagreement(reference, measured)
    if worst is None:
        return ReplanDecision(
            False, ReplanReason.PROFILE_NOT_COMPARABLE, "no measured batch size lies in the planned profile"
        )
    what = "adopted measured" if adopted else "declared"
    numbers = (
        f"batch {worst.batch_size}: {what} {worst.declared_ms:.3g} ms, measured {worst.measured_ms:.3g} ms "
        f"({worst.relative:+.1%}, tolerance ±{tolerance:.0%})"
    )
    if abs(worst.relative) > tolerance:
        if len(real) < min_sizes:
            sizes = ", ".join(str(p.batch_size) for p in real)
            return ReplanDecision(
                False,
                ReplanReason.AWAITING_MEASUREMENT,
                f"{numbers}; measured batch size(s) {sizes} only: {min_sizes} sizes are needed to re-plan",
            )
        return ReplanDecision(True, ReplanReason.PROFILE_DISAGREES, numbers)
    return ReplanDecision(False, ReplanReason.PROFILE_AGREES, numbers)


def _as_profile(points: Sequence[FittedPoint]) -> list[ProfilePoint]:
    return [ProfilePoint(batchSize=p.batch_size, latencyMs=p.latency_ms) for p in points]
