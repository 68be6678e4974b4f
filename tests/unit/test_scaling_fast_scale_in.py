"""Asymmetric scale-in (policy.scaling.stabilization_votes, rule 7): votes older than FAST_SCALE_IN_S count at
full capacity, younger ones with the target's headroom.

Reference plan as in test_scaling.py: C = 50 rps, u = 0.8, so a vote v says the load was at most 40·v rps, which
ceil(0.8·v) replicas carry at capacity.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from batchfill.api.reasons import ScalingReason
from batchfill.policy.scaling import FAST_SCALE_IN_S, Recommendation, stabilization_votes

from .test_scaling import LIGHT, NOW, ok, run, votes

R = ScalingReason


def test_old_votes_count_at_capacity_young_ones_as_cast() -> None:
    history = votes((250, 10), (200, 5), (100, 7), (15, 2))
    # 10 and 5 are older than 120 s: ceil(8.0) = 8 and ceil(4.0) = 4; 7 and 2 are kept
    assert stabilization_votes(history, NOW, 300.0, 0.8) == [8, 4, 7, 2]


def test_votes_outside_the_window_are_dropped_and_a_short_window_keeps_every_vote() -> None:
    history = votes((300, 9), (90, 6))
    assert stabilization_votes(history, NOW, 300.0, 0.8) == [6]
    # a window no longer than FAST_SCALE_IN_S: every vote as cast (the rule before asymmetric scale-in)
    assert stabilization_votes(votes((100, 9)), NOW, FAST_SCALE_IN_S, 0.8) == [9]


def test_scale_in_after_the_fast_window_when_the_older_peak_fits_at_capacity() -> None:
    # 5 replicas were wanted 200 s ago: 200 rps at most, which 4 carry at capacity; since then 1 is enough
    d = run(ok(40, LIGHT), 5, 5, history=votes((200, 5), (100, 1)))
    assert (d.desired_replicas, d.reason) == (4, R.SCALE_IN_LOAD_FITS), d.message


def test_a_vote_within_the_fast_window_still_holds_the_count() -> None:
    d = run(ok(40, LIGHT), 5, 5, history=votes((200, 5), (60, 5)))
    assert (d.desired_replicas, d.reason) == (5, R.HOLD_STABILIZING), d.message


def test_restart_without_history_still_holds() -> None:
    d = run(ok(40, LIGHT), 5, 5, history=())
    assert (d.desired_replicas, d.reason) == (5, R.HOLD_STABILIZING), d.message


pairs = st.lists(st.tuples(st.floats(0.0, 400.0), st.integers(0, 64)), max_size=12)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(pairs, st.sampled_from([0.0, 60.0, 120.0, 300.0, 600.0]), st.floats(0.05, 1.0))
def test_stabilization_is_between_capacity_and_the_old_rule(
    raw: list[tuple[float, int]], window_s: float, u: float
) -> None:
    history = tuple(Recommendation(NOW - ago, n, n) for ago, n in raw)
    kept = stabilization_votes(history, NOW, window_s, u)
    in_window = [h for h in history if h.time > NOW - window_s]
    young = [h.replicas for h in in_window if h.time > NOW - FAST_SCALE_IN_S]
    stabilized = max(kept, default=0)
    # never above the old rule (every vote of the window as cast) ...
    assert stabilized <= max((h.replicas for h in in_window), default=0)
    # ... never below a vote of the last FAST_SCALE_IN_S, nor below the count carrying any window load at capacity
    assert stabilized >= max(young, default=0)
    assert stabilized >= max((math.ceil(h.replicas * u - 1e-9) for h in in_window), default=0)
    assert len(kept) == len(in_window)
