"""Status conditions (metav1.Condition) as pure list transformations.

``lastTransitionTime`` changes only when a condition's status flips; reason/message updates keep it. Time is
passed in. The order of conditions is stable (existing ones keep their place, new ones are appended), so an
unchanged input produces an identical list and the caller can skip the status write.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ConditionUpdate:
    """What a condition should say now (its transition time is derived from the previous one)."""

    type: str
    status: str
    reason: str
    message: str = ""


def rfc3339(now: float) -> str:
    """Seconds since the epoch -> ``2026-11-29T12:00:00Z`` (metav1.Time has second precision)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(now)))


def parse_rfc3339(text: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 time as the API stores it (None when absent or malformed)."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def apply_conditions(
    current: Sequence[Mapping[str, Any]] | None,
    updates: Iterable[ConditionUpdate],
    *,
    generation: int | None,
    now: float,
    remove: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """The condition list after ``updates`` (and with the types in ``remove`` dropped).

    Args:
        current: ``status.conditions`` as stored (may be None).
        updates: the conditions to set.
        generation: ``metadata.generation`` the conditions were computed from (``observedGeneration``).
        now: seconds since the epoch, used for ``lastTransitionTime`` of flipped or new conditions.
    """
    dropped = set(remove)
    out: list[dict[str, Any]] = [dict(c) for c in current or () if c.get("type") not in dropped]
    index = {c.get("type"): i for i, c in enumerate(out)}
    for u in updates:
        i = index.get(u.type)
        old = out[i] if i is not None else None
        flipped = old is None or old.get("status") != u.status or "lastTransitionTime" not in old
        new: dict[str, Any] = {
            "type": u.type,
            "status": u.status,
            "reason": u.reason,
            "message": u.message,
            "lastTransitionTime": rfc3339(now) if flipped or old is None else old["lastTransitionTime"],
        }
        if generation is not None:
            new["observedGeneration"] = generation
        if i is None:
            index[u.type] = len(out)
            out.append(new)
        else:
            out[i] = new
    return out


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_``, if present."""
    for c in conditions or ():
        if c.get("type") == type_:
            return c
    return None


@dataclass(frozen=True)
class GenerationLag:
    """A ``metadata.generation`` that ``status.observedGeneration`` does not show yet: no handler finished it.

    Attributes:
        generation: the object's ``metadata.generation``.
        since: when it was first seen unobserved, seconds since the epoch.
        reconciled: whether the scaling loop has stepped in for it already (its Event is posted once).
    """

    generation: int
    since: float
    reconciled: bool = False


def generation_lag(
    previous: GenerationLag | None, generation: int | None, observed_generation: int | None, now: float
) -> GenerationLag | None:
    """The lag of ``generation`` after this look at the object (None: status observed it, nothing waits).

    ``previous`` is the last look's; a newer generation starts a new lag at ``now``, the same one keeps its
    ``since``. ``now``: seconds since the epoch.
    """
    if generation is None or generation == observed_generation:
        return None
    if previous is not None and previous.generation == generation:
        return previous
    return GenerationLag(generation, now)


#: A generation waiting this many bounds is reconciled by the loop even while its watch shows progress (a handler
#: stuck on one object while others are handled).
STUCK_HANDLER_BOUNDS = 5


def generation_unhandled(
    lag: GenerationLag | None, now: float, bound_s: float, last_progress: float | None = None
) -> bool:
    """Whether ``lag`` has lasted longer than ``bound_s`` seconds at ``now`` (epoch seconds): a stalled watch or a
    stuck handler, since a healthy one observes a generation within seconds.

    ``last_progress``: when the same watch last delivered a generation that was then observed (another object's
    lag ending), None if never seen. Progress within ``bound_s`` means a busy handler queue, not a stalled watch:
    a thousand models applied at once wait minutes for kopf's handlers, and stepping in for them would do each
    reconcile twice and slow the queue further. Past ``STUCK_HANDLER_BOUNDS`` bounds it is reconciled anyway.
    """
    if lag is None or now - lag.since <= bound_s:
        return False
    busy = last_progress is not None and now - last_progress <= bound_s
    return not busy or now - lag.since > STUCK_HANDLER_BOUNDS * bound_s
