"""The scaling decision's votes (``Decision.history``), the compact form ``status.scalingHistory`` keeps of them,
and the saturation the decision remembers (``Decision.saturation``, kept in memory only).

Pure. :mod:`batchfill.policy.scaling` re-exports these names; a restart or a new leader expands the stored form
back to one vote per tick (:func:`expand_history`), so the scale-in stabilization window survives it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

#: Votes younger than this (s) keep the target's headroom in the scale-in stabilization window; older ones count
#: at full capacity (:func:`stabilization_votes`). Two windows of signals: a new replica needs one start-up (60 s
#: in the simulator) and a window to show in the signals, so a load that returns is seen in time.
FAST_SCALE_IN_S = 120.0


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


def stabilization_votes(history: tuple[Recommendation, ...], now: float, window_s: float, u: float) -> list[int]:
    """The counts the scale-in stabilization window keeps (rule 7 of :mod:`batchfill.policy.scaling`): every vote
    of the last ``min(window_s, FAST_SCALE_IN_S)`` as cast, and each older vote of the window at full capacity.

    A vote ``v`` at target utilization ``u`` says the load was at most ``v·u·C``; ``ceil(v·u)`` replicas carried
    it at their capacity at SLA. Asymmetric scale-in: after ``FAST_SCALE_IN_S`` a count that held every load of
    the whole window at capacity is enough, and within it the target's headroom still applies, so a scale-in
    never goes below a count the last minutes wanted. ``u`` outside (0, 1] keeps every vote as cast.
    """
    fast_s = min(window_s, FAST_SCALE_IN_S)
    full = 0 < u <= 1
    return [
        h.replicas if h.time > now - fast_s or not full else math.ceil(h.replicas * u - 1e-9)
        for h in history
        if h.time > now - window_s
    ]


class Saturation(NamedTuple):
    """At ``time`` (s) the Ready replicas were last saturated or at risk; ``load_per_replica_rps`` (samples/s)
    bounds scale-in (rule 7 of :mod:`batchfill.policy.scaling`): the lowest over saturation *episodes* (runs of
    consecutive saturated ticks on ``ready`` replicas) of each episode's highest load per replica, raised to a
    higher load the replicas later carried without saturation. ``episode_rps``: the current episode's highest;
    ``earlier_rps``: the bound from the episodes before it (inf: none).

    Within an episode the highest reading counts, not the first: the window's request rate is a mean that lags a
    load step, while the batch fill, a ratio, shows it at once, so the first saturated tick after an idle spell
    reads a fraction of the load (tests/cluster/test_scaling.py saw 12.7 of ~70 rps, which held a replica the
    light load after it did not need for the hour).
    """

    time: float
    load_per_replica_rps: float
    ready: int = 0
    episode_rps: float = 0.0
    earlier_rps: float = math.inf


def remember_saturation(
    memory: Saturation | None, now: float, previous_tick: float | None, ready: int, load_rps: float, saturated: bool
) -> Saturation | None:
    """The saturation to remember after a tick whose window describes ``ready`` Ready replicas only, carrying
    ``load_rps`` samples/s each, ``saturated`` (or at risk) or not; ``previous_tick``: the last tick's time (s),
    which continues an episode when ``memory.time`` is it. Not saturated: ``memory``, raised to ``load_rps`` when
    that is higher (the clock of forgetting it is not reset)."""
    if saturated:
        if memory is not None and memory.time == previous_tick and memory.ready == ready:  # the episode goes on
            episode, earlier = max(memory.episode_rps, load_rps), memory.earlier_rps
        else:
            episode, earlier = load_rps, memory.load_per_replica_rps if memory else math.inf
        return Saturation(now, min(episode, earlier), ready, episode, earlier)
    if memory is not None and load_rps > memory.load_per_replica_rps:
        # replicas seen carrying more without saturation prove the remembered load too low (a lagging rate)
        return Saturation(memory.time, load_rps, memory.ready, load_rps, load_rps)
    return memory
