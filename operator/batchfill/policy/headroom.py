"""The headroom that follows the traffic: the target utilization raised on calm traffic.

``spec.scaling.targetUtilization`` (u) keeps the headroom the next minutes' rise needs on noisy traffic. On calm
traffic that headroom is idle GPUs. The *rate variability* ``s`` measures how far the load moves in a minute:
the root mean square of the natural-log changes of the model's request rate over :data:`RATE_CHANGE_LAG_S`,
over the last :data:`RATE_CHANGE_HORIZON_S`::

    x(t) = ln r(t) - ln r(t - 60 s)          r: the model's request rate over the 60 s before t, all pods
    s    = sqrt(mean of x(t)^2)              t every 15 s in (now - 30 min, now], both rates > 0

and the target utilization in effect is

    u' = min(max(u, exp(-z*s)), max(u, u_max))      z = 2, u_max = spec.scaling.maxTargetUtilization

A load that moves by a fraction ``s`` per minute is covered for ``z`` such moves (for small ``s``,
``exp(-z*s) ≈ 1/(1 + z*s)``: capacity for a rise of ``z*s``): a replica asked for when the evidence shows
saturation at ``u'·C`` serves about two minutes after the rise began (the signal window, a tick, start-up).
``u'`` never goes below ``u``, so noisy traffic keeps the user's headroom and calm traffic runs nearer capacity;
with ``maxTargetUtilization ≤ targetUtilization`` the headroom is fixed. The estimate is ``None`` (and
``u' = u``) until :data:`MIN_RATE_CHANGES` of the horizon's changes exist: after a quiet spell, at the start of
a model, or where Prometheus keeps too little.

The operator reads ``s`` from Prometheus (adapters/metrics.py builds the subquery from these constants); the
fleet simulator computes it from its own window rates with :func:`rate_change_rms`, the same estimator.
Measured in docs/benchmarks/policy.md; the reasons for ``z`` and ``u_max`` are in docs/design-notes.md
(Autoscaling).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: The time over which the load's change is measured, seconds: about a new replica's start-up and one tick (the
#: soonest a decision adds capacity). Also the window of each rate ``r`` (consecutive windows do not overlap).
RATE_CHANGE_LAG_S = 60
#: How far back the changes are averaged, seconds.
RATE_CHANGE_HORIZON_S = 1800
#: The spacing of the changes averaged, seconds (the operator's default tick).
RATE_CHANGE_STEP_S = 15
#: The fewest changes (half of the horizon's) that give an estimate.
MIN_RATE_CHANGES = RATE_CHANGE_HORIZON_S // RATE_CHANGE_STEP_S // 2
#: Minutes of the rate's typical change the headroom covers: from a rise to the capacity for it pass the signal
#: window (60 s), a tick and a replica's start-up (docs/design-notes.md, Autoscaling: 1 lost 99.9 % on steep
#: smooth days once the saturation fill at ``u'`` was simulated, 1.5 on one of them).
HEADROOM_Z = 2.0


def rate_change_rms(rates_rps: Mapping[int, float], now_s: int) -> tuple[float | None, int]:
    """``(s, n)``: the rate variability at ``now_s`` (module docstring) and how many changes it averages.

    Args:
        rates_rps: ``{t: r}``, the request rate (req/s) over the :data:`RATE_CHANGE_LAG_S` before each time ``t``
            (whole seconds); times other than the ``t`` and ``t - RATE_CHANGE_LAG_S`` pairs are ignored.
        now_s: the evaluation time, whole seconds.

    Returns:
        ``s`` (dimensionless, ≥ 0) or None when fewer than :data:`MIN_RATE_CHANGES` changes have a positive
        finite rate at both ends; ``n``, the count of such changes.
    """
    squares = []
    for t, r in rates_rps.items():
        before = rates_rps.get(t - RATE_CHANGE_LAG_S)
        if now_s - RATE_CHANGE_HORIZON_S < t <= now_s and _positive(r) and before is not None and _positive(before):
            squares.append(math.log(r / before) ** 2)
    if len(squares) < MIN_RATE_CHANGES:
        return None, len(squares)
    return math.sqrt(math.fsum(squares) / len(squares)), len(squares)


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def effective_target_utilization(
    target_utilization: float, max_target_utilization: float, rate_change_rms: float | None
) -> float:
    """``u'`` (module docstring): the fraction of a replica's capacity at SLA it may carry, in ``(0, 1]``.

    ``target_utilization`` (u) is returned unchanged when the variability is unknown (None), not finite or
    negative, or when ``max_target_utilization ≤ u``.
    """
    u = target_utilization
    if rate_change_rms is None or not math.isfinite(rate_change_rms) or rate_change_rms < 0:
        return u
    raised = math.exp(-HEADROOM_Z * rate_change_rms)
    return min(max(u, raised), max(u, min(max_target_utilization, 1.0)))


def fill_at_utilization(
    fill: float,
    max_batch_size: int,
    utilization: float,
    new_utilization: float,
    *,
    upper: tuple[float, float] | None = None,
) -> float:
    """The batch fill at ``new_utilization`` × capacity of a replica whose fill is ``fill`` at ``utilization`` ×
    capacity, in ``[0, 1]``.

    ``upper``: a second simulated point, (a higher utilization, the fill there): ``status.plan``'s fill at
    maxTargetUtilization. Between the two points the fill is interpolated linearly. Beyond them (or without
    ``upper``) a batch's samples beyond its first grow in proportion to the load (policy/scaling.py, rule 7:
    ``fill·B - 1`` in proportion to the load), from the nearer point.

    Why two points: near capacity the fill grows faster than the load (a batch gathers the requests that arrive
    while the one before it runs, and runs longer the larger it is), so the proportional model understates it.
    On a real tritonserver (tests/cluster/test_calm_headroom.py: fill 0.175 simulated at 0.8·C) one replica
    filled 0.199 at 0.89·C, above the 0.196 that model gives for 0.95·C, and was taken for saturated. The fill
    is convex in the load, so the chord between two simulated points is never below the simulated curve: a
    replica counts as saturated at a load a little above ``new_utilization`` × capacity, not below it (on that
    test's profile at most about 1 % of capacity between 0.8 and 0.95).

    The result is at least one sample a batch (``1 / max_batch_size``). ``max_batch_size`` < 1 or a
    ``utilization`` ≤ 0 returns ``fill``; an ``upper`` whose utilization is not
    above ``utilization`` or whose fill is not finite in ``[fill, 1]`` is ignored.
    """
    if max_batch_size < 1 or not utilization > 0:
        return fill
    if upper is not None:
        u_max, f_max = upper
        if u_max > utilization and math.isfinite(f_max) and fill <= f_max <= 1:
            if new_utilization <= u_max:
                if new_utilization >= utilization:
                    share = (new_utilization - utilization) / (u_max - utilization)
                    return min(1.0, max(1 / max_batch_size, fill + (f_max - fill) * share))
            else:
                fill, utilization = f_max, u_max
    beyond_first = max(fill * max_batch_size - 1, 0.0)  # a fill below one sample a batch is no batch at all
    return min(1.0, (1 + beyond_first * new_utilization / utilization) / max_batch_size)
