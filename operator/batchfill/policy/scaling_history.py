"""The scaling decision's votes (``Decision.history``) and the compact form ``status.scalingHistory`` keeps of them.

Pure. :mod:`batchfill.policy.scaling` re-exports these names; a restart or a new leader expands the stored form
back to one vote per tick (:func:`expand_history`), so the scale-in stabilization window survives it.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Recommendation(NamedTuple):
    """One tick's vote: at ``time`` (s) the load needed ``replicas`` while ``ready`` replicas were Ready."""

    time: float
    replicas: int
    ready: int


def compact_history(history: tuple[Recommendation, ...], now: float, horizon_s: float) -> tuple[Recommendation, ...]:
    """``history`` as status keeps it: times in whole seconds, an entry only where (replicas, ready) changed, and
    no entry whose successor began before ``now - horizon_s``. A steady model keeps the same few entries, so
    its status is not rewritten every tick; :func:`expand_history` undoes it to within a tick."""
    out: list[Recommendation] = []
    for h in sorted(history):
        if out and (out[-1].replicas, out[-1].ready) == (h.replicas, h.ready):
            continue
        out.append(Recommendation(float(math.floor(h.time)), h.replicas, h.ready))
    while len(out) >= 2 and out[1].time <= now - horizon_s:
        out.pop(0)
    return tuple(out)


def history_to_store(
    stored: tuple[Recommendation, ...], current: tuple[Recommendation, ...]
) -> tuple[Recommendation, ...] | None:
    """What ``status.scalingHistory`` should become: ``current`` (compact) when it ends in a vote or Ready count
    the stored one does not end with, else None (keep the stored one). Entries that only aged out are not worth
    a status write (a steady model must write nothing, docs/field-cases.md#status-write-loops);
    :func:`expand_history` skips them anyway."""
    if not current:
        return None
    if stored and (stored[-1].replicas, stored[-1].ready) == (current[-1].replicas, current[-1].ready):
        return None
    return current


def expand_history(
    compact: tuple[Recommendation, ...], now: float, horizon_s: float, step_s: float
) -> tuple[Recommendation, ...]:
    """Per-tick votes (one every ``step_s``) over the last ``horizon_s`` before ``now`` from the compact form:
    each entry holds from its time until the next entry's (the last one until ``now``, excluded)."""
    if step_s <= 0 or not math.isfinite(step_s):
        raise ValueError(f"step_s={step_s} must be a positive number of seconds")
    out: list[Recommendation] = []
    ordered = sorted(compact)
    for i, h in enumerate(ordered):
        end = ordered[i + 1].time if i + 1 < len(ordered) else now
        t = h.time
        if t <= now - horizon_s:  # the first tick of its grid that decide() keeps (after now - horizon)
            t += (math.floor((now - horizon_s - t) / step_s) + 1) * step_s
        while t < end and t < now:
            out.append(Recommendation(t, h.replicas, h.ready))
            t += step_s
    return tuple(out)
