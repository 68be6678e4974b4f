"""Leader election on a ``coordination.k8s.io/v1`` Lease: the decisions, without the API calls.

Pure: times are passed in (``now`` is the caller's monotonic clock, ``wall`` a UTC datetime only written into
the Lease) and nothing is read or written; :mod:`batchfill.adapters.leader` does the reads and the writes, with
optimistic concurrency (``resourceVersion``), so of two candidates that decide to take the same Lease one write
wins and the other gets 409 Conflict.

The protocol is client-go's ``tools/leaderelection``:

* A candidate reads the Lease every ``retry_period_s``. Absent: create it (:attr:`Action.CREATE`); no holder
  (released): take it (:attr:`Action.TAKE`); held by us: renew it (:attr:`Action.RENEW`); held by another
  candidate: take it only when the holder has not renewed it for its ``leaseDurationSeconds``
  (:attr:`Action.TAKE`), else wait (:attr:`Action.WAIT`).
* "Not renewed for ``leaseDurationSeconds``" is judged on the candidate's own monotonic clock, never by
  comparing the holder's ``renewTime`` with ours: clocks of two nodes may disagree. A renewal is a new
  ``resourceVersion``; the candidate knows it happened after its previous successful read was sent and before
  the current one returned. :func:`observe` dates it ``max(previous read sent, now - retry_period_s)``, which
  is never later than the renewal when reads are regular (so takeover comes at most ``leaseDurationSeconds`` +
  one ``retry_period_s`` after the holder's last renewal) and never earlier than ``retry_period_s`` before it
  (so the safety rule below holds whatever the reads' timing).
* The leader renews every ``renew_interval_s`` (half the renew deadline) and retries every ``retry_period_s``
  after a failure. When no renewal has succeeded for ``renew_deadline_s`` since the last successful one was
  sent, or a read shows another holder, it has lost the Lease and must stop acting at once.
* Safety: a candidate takes an unreleased Lease at the earliest ``leaseDurationSeconds - retry_period_s`` after
  the holder's last renewal, and the holder gives up ``renew_deadline_s`` after it, so
  ``renew_deadline_s + retry_period_s < lease_duration_s`` (:meth:`LeaseTiming.problems`) leaves the old
  leader that margin to stop before anyone else starts (3 s with the defaults 15 / 10 / 2). As in client-go this
  bounds overlap by time, not by fencing: a process frozen (SIGSTOP, swapped out) longer than the margin can
  act once more after it resumes, until its next renewal attempt reports the loss.
* Released (graceful stop): the leader writes the Lease without a holder, so the next read of any candidate
  takes it: takeover within ``retry_period_s``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class LeaseTiming:
    """The election's periods, seconds. Defaults as client-go/controller-runtime: 15 / 10 / 2."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    @property
    def renew_interval_s(self) -> float:
        """A healthy leader renews this often: half the deadline, leaving the other half for retries."""
        return self.renew_deadline_s / 2

    @property
    def takeover_bound_s(self) -> float:
        """After the holder's last renewal, an unreleased Lease is taken within this (plus request latency)."""
        return self.lease_duration_s + self.retry_period_s

    def problems(self) -> list[tuple[str, str]]:
        """``(field, message)`` for every violated rule; empty when the timing is usable."""
        out: list[tuple[str, str]] = []
        if self.lease_duration_s < 2:
            out.append(("lease_duration_s", f"must be at least 2 s, got {self.lease_duration_s}"))
        if self.retry_period_s <= 0:
            out.append(("retry_period_s", f"must be > 0, got {self.retry_period_s}"))
        if self.renew_deadline_s < 2 * self.retry_period_s:
            out.append(
                (
                    "renew_deadline_s",
                    f"must be at least twice the retry period ({self.retry_period_s} s) so that a leader renewing "
                    f"every half deadline can retry before it gives up, got {self.renew_deadline_s}",
                )
            )
        if self.renew_deadline_s + self.retry_period_s >= self.lease_duration_s:
            out.append(
                (
                    "lease_duration_s",
                    f"must exceed the renew deadline plus the retry period ({self.renew_deadline_s} + "
                    f"{self.retry_period_s} s), so that a leader that cannot renew stops before another takes "
                    f"over, got {self.lease_duration_s}",
                )
            )
        return out


@dataclass(frozen=True)
class LeaseRecord:
    """What the election reads from a Lease (its ``spec`` and ``metadata.resourceVersion``)."""

    holder: str | None
    lease_duration_s: int | None
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    version: str


@dataclass(frozen=True)
class LeaseSpec:
    """What the election writes into a Lease's ``spec``."""

    holder: str | None
    lease_duration_s: int
    acquire_time: datetime
    renew_time: datetime
    transitions: int


@dataclass(frozen=True)
class Observation:
    """A candidate's memory of the Lease between reads (monotonic seconds of the candidate's clock)."""

    version: str
    holder: str | None
    changed_at: float  # when the current version was written, at the latest as far as safety needs
    read_sent_at: float  # when the read that returned the current version was sent


def observe(
    previous: Observation | None, record: LeaseRecord, sent_at: float, now: float, retry_s: float
) -> Observation:
    """Update the memory with a successful read of ``record`` sent at ``sent_at``, returned at ``now``.

    A new version was written after the previous read was sent and before ``now``. It is dated as early as
    safety allows (module docstring): ``max(previous read sent, now - retry_s)``; the first version a candidate
    sees is dated ``now``, as it may have been written just before.
    """
    if previous is not None and previous.version == record.version:
        return Observation(record.version, record.holder, previous.changed_at, sent_at)
    changed_at = now if previous is None else max(previous.read_sent_at, now - retry_s)
    return Observation(record.version, record.holder, changed_at, sent_at)


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet
    TAKE = "take"  # released, or expired: replace it with us as holder
    RENEW = "renew"  # ours
    WAIT = "wait"  # another candidate holds it and renews it


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    holder: str | None = None
    expires_in_s: float | None = None  # WAIT: how long until the holder's Lease expires unless renewed


def lease_duration_of(record: LeaseRecord, timing: LeaseTiming) -> int:
    """The holder's own ``leaseDurationSeconds`` (it promised to renew within it), else ours."""
    own = record.lease_duration_s
    return own if own is not None and own > 0 else timing.lease_duration_s


def decide(
    record: LeaseRecord | None, seen: Observation | None, identity: str, now: float, timing: LeaseTiming
) -> Decision:
    """What a candidate does after reading ``record`` (None: the Lease does not exist) and ``observe``-ing it."""
    if record is None:
        return Decision(Action.CREATE, "no Lease yet")
    if not record.holder:
        return Decision(Action.TAKE, "the Lease was released")
    if record.holder == identity:
        return Decision(Action.RENEW, "we hold the Lease", holder=identity)
    if seen is None or seen.version != record.version:
        raise ValueError("decide() needs the observation of this very record (observe() it first)")
    duration = lease_duration_of(record, timing)
    expires_in = seen.changed_at + duration - now
    if expires_in <= 0:
        return Decision(
            Action.TAKE,
            f"{record.holder} has not renewed the Lease for {now - seen.changed_at:.1f} s (leaseDurationSeconds "
            f"{duration})",
            holder=record.holder,
        )
    return Decision(Action.WAIT, f"held by {record.holder}", holder=record.holder, expires_in_s=expires_in)


def next_spec(
    record: LeaseRecord | None, action: Action, identity: str, wall: datetime, timing: LeaseTiming
) -> LeaseSpec:
    """The spec to write for ``action`` (CREATE, TAKE or RENEW): us as holder, renewed at ``wall``.

    A renewal keeps ``acquireTime`` and ``leaseTransitions``; every other acquisition counts one transition.
    """
    if action is Action.WAIT:
        raise ValueError("nothing to write while waiting")
    duration = timing.lease_duration_s
    if action is Action.RENEW and record is not None and record.holder == identity:
        acquired = record.acquire_time or wall
        return LeaseSpec(identity, duration, acquired, wall, record.transitions)
    transitions = 0 if record is None else record.transitions + 1
    return LeaseSpec(identity, duration, wall, wall, transitions)


def released_spec(record: LeaseRecord, wall: datetime) -> LeaseSpec:
    """A Lease given up on a graceful stop: no holder, so the next read of any candidate takes it.

    As client-go's ``ReleaseOnCancel``: holder cleared, ``leaseDurationSeconds`` 1, times set to ``wall``.
    """
    return LeaseSpec(None, 1, wall, wall, record.transitions)


def renew_deadline_passed(last_renew_sent_at: float, now: float, timing: LeaseTiming) -> bool:
    """The leader has not renewed for ``renew_deadline_s`` since its last successful renewal was sent."""
    return now - last_renew_sent_at >= timing.renew_deadline_s
