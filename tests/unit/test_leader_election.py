"""Leader election without a cluster: the decisions (batchfill.policy.leader), the settings that configure it, and
the standby's liveness endpoint. The API calls against a real API server: tests/cluster/test_leader_election.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from batchfill.adapters.leader import StandbyHealth, default_identity, micro_time
from batchfill.controller.settings import OperatorSettings, describe_errors
from batchfill.policy.leader import (
    Action,
    LeaseRecord,
    LeaseTiming,
    Observation,
    decide,
    next_spec,
    observe,
    released_spec,
    renew_deadline_passed,
)

T = LeaseTiming()  # 15 / 10 / 2
ME, OTHER = "op-a_1", "op-b_2"
WALL = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def rec(holder: str | None, version: str, duration: int | None = 15, transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(holder, duration, WALL, WALL, transitions, version)


# --- timing -------------------------------------------------------------------------------------------------------
def test_default_timing_is_client_gos_and_safe() -> None:
    assert (T.lease_duration_s, T.renew_deadline_s, T.retry_period_s) == (15, 10.0, 2.0)
    assert T.renew_interval_s == 5.0
    assert T.problems() == []
    assert T.takeover_bound_s == 17.0
    # the old leader stops (renew deadline) before anyone may take over (lease duration - one retry period)
    assert T.renew_deadline_s < T.lease_duration_s - T.retry_period_s


@pytest.mark.parametrize(
    ("timing", "field"),
    [
        (LeaseTiming(lease_duration_s=12), "lease_duration_s"),  # 10 + 2 >= 12: no margin to stop
        (LeaseTiming(lease_duration_s=15, renew_deadline_s=3.0, retry_period_s=2.0), "renew_deadline_s"),
        (LeaseTiming(lease_duration_s=1, renew_deadline_s=0.4, retry_period_s=0.1), "lease_duration_s"),
        (LeaseTiming(retry_period_s=0.0), "retry_period_s"),
    ],
)
def test_unsafe_timing_is_refused(timing: LeaseTiming, field: str) -> None:
    assert field in [f for f, _ in timing.problems()]


# --- observation ----------------------------------------------------------------------------------------------------
def test_first_read_dates_the_version_now() -> None:
    seen = observe(None, rec(OTHER, "1"), sent_at=100.0, now=100.2, retry_s=2)
    assert seen == Observation("1", OTHER, 100.2, 100.0)


def test_unchanged_version_keeps_its_date() -> None:
    first = observe(None, rec(OTHER, "1"), 100.0, 100.2, 2)
    again = observe(first, rec(OTHER, "1"), 102.3, 102.5, 2)
    assert again.changed_at == 100.2
    assert again.read_sent_at == 102.3


def test_a_renewal_is_dated_at_the_previous_read_or_one_retry_period_back() -> None:
    first = observe(None, rec(OTHER, "1"), 100.0, 100.2, 2)
    # regular reads: the renewal happened after the previous read was sent (100.0), dated at most 2 s back
    renewed = observe(first, rec(OTHER, "2"), 102.3, 102.5, 2)
    assert renewed.changed_at == pytest.approx(100.5)
    # after an outage (reads failed for 30 s) the previous read says nothing: at most one retry period back
    late = observe(first, rec(OTHER, "2"), 130.0, 130.1, 2)
    assert late.changed_at == pytest.approx(128.1)


@given(
    prev_sent=st.floats(0, 1000),
    gap=st.floats(0.01, 100),
    renewal_frac=st.floats(0, 1),
    latency=st.floats(0, 1),
    retry=st.floats(0.1, 10),
)
def test_observed_renewal_time_is_never_more_than_one_retry_period_early(
    prev_sent: float, gap: float, renewal_frac: float, latency: float, retry: float
) -> None:
    """Safety: whenever the renewal really happened between the reads, the date is >= renewal - retry."""
    first = observe(None, rec(OTHER, "1"), prev_sent, prev_sent, retry)
    sent = prev_sent + gap
    now = sent + latency
    renewal = prev_sent + renewal_frac * (now - prev_sent)
    seen = observe(first, rec(OTHER, "2"), sent, now, retry)
    assert seen.changed_at >= renewal - retry - 1e-9
    assert seen.changed_at <= now


# --- decisions -------------------------------------------------------------------------------------------------------
def test_absent_lease_is_created() -> None:
    assert decide(None, None, ME, 0.0, T).action is Action.CREATE


def test_released_lease_is_taken_at_once() -> None:
    released = rec(None, "7", duration=1)
    seen = observe(None, released, 0.0, 0.0, 2)
    assert decide(released, seen, ME, 0.0, T).action is Action.TAKE


def test_own_lease_is_renewed() -> None:
    mine = rec(ME, "3")
    assert decide(mine, observe(None, mine, 0.0, 0.0, 2), ME, 0.0, T).action is Action.RENEW


def test_anothers_lease_is_waited_for_until_its_duration_passed_on_our_clock() -> None:
    theirs = rec(OTHER, "3")
    seen = observe(None, theirs, 50.0, 50.0, 2)
    waiting = decide(theirs, seen, ME, 60.0, T)
    assert waiting.action is Action.WAIT
    assert waiting.holder == OTHER
    assert waiting.expires_in_s == pytest.approx(5.0)
    assert decide(theirs, seen, ME, 64.99, T).action is Action.WAIT
    taking = decide(theirs, seen, ME, 65.0, T)
    assert taking.action is Action.TAKE
    assert OTHER in taking.reason


def test_holders_own_lease_duration_is_honoured() -> None:
    theirs = rec(OTHER, "3", duration=30)
    seen = observe(None, theirs, 0.0, 0.0, 2)
    assert decide(theirs, seen, ME, 20.0, T).action is Action.WAIT  # ours is 15, theirs 30
    assert decide(theirs, seen, ME, 30.0, T).action is Action.TAKE


def test_renewal_timestamps_are_not_trusted_across_clocks() -> None:
    """A renewTime from a clock far behind ours does not make a renewed Lease look expired."""
    seen = observe(None, rec(OTHER, "1"), 0.0, 0.0, 2)
    stale_clock = LeaseRecord(OTHER, 15, WALL - timedelta(hours=1), WALL - timedelta(hours=1), 0, "2")
    seen = observe(seen, stale_clock, 2.0, 2.1, 2)
    assert decide(stale_clock, seen, ME, 3.0, T).action is Action.WAIT


def test_killed_leader_is_taken_over_within_lease_duration_plus_one_retry_of_its_last_renewal() -> None:
    """Candidate reads every retry period (1 s of latency); the holder renews every 5 s, then dies at 20."""
    retry, latency = T.retry_period_s, 0.05
    renewals = [0.0, 5.0, 10.0, 15.0, 20.0]
    seen: Observation | None = None
    t = 0.3
    version = None
    while True:
        sent, now = t, t + latency
        last = max(r for r in renewals if r <= sent)
        version = str(renewals.index(last))
        record = rec(OTHER, version)
        seen = observe(seen, record, sent, now, retry)
        if decide(record, seen, ME, now, T).action is Action.TAKE:
            break
        t = now + retry
    assert now - renewals[-1] <= T.takeover_bound_s + latency
    assert now - renewals[-1] >= T.lease_duration_s - retry  # and not before the safety margin


def test_decide_needs_the_observation_of_the_record() -> None:
    with pytest.raises(ValueError, match="observe"):
        decide(rec(OTHER, "2"), observe(None, rec(OTHER, "1"), 0, 0, 2), ME, 0.0, T)


# --- what is written -------------------------------------------------------------------------------------------
def test_create_take_renew_and_release_specs() -> None:
    later = WALL + timedelta(seconds=5)
    created = next_spec(None, Action.CREATE, ME, WALL, T)
    assert (created.holder, created.lease_duration_s, created.acquire_time, created.transitions) == (ME, 15, WALL, 0)
    theirs = rec(OTHER, "4", transitions=3)
    taken = next_spec(theirs, Action.TAKE, ME, later, T)
    assert (taken.holder, taken.acquire_time, taken.renew_time, taken.transitions) == (ME, later, later, 4)
    mine = LeaseRecord(ME, 15, WALL, WALL, 4, "5")
    renewed = next_spec(mine, Action.RENEW, ME, later, T)
    assert (renewed.acquire_time, renewed.renew_time, renewed.transitions) == (WALL, later, 4)
    released = released_spec(mine, later)
    assert (released.holder, released.lease_duration_s, released.transitions) == (None, 1, 4)
    with pytest.raises(ValueError, match="waiting"):
        next_spec(theirs, Action.WAIT, ME, later, T)


def test_renew_deadline() -> None:
    assert not renew_deadline_passed(100.0, 109.9, T)
    assert renew_deadline_passed(100.0, 110.0, T)


def test_micro_time_always_has_six_fractional_digits_in_utc() -> None:
    assert micro_time(WALL) == "2025-01-02T03:04:05.678901Z"
    assert micro_time(WALL.replace(microsecond=0)) == "2025-01-02T03:04:05.000000Z"


def test_identity_is_the_pod_name_and_a_unique_suffix() -> None:
    a, b = default_identity({"POD_NAME": "batchfill-7d9-abc"}), default_identity({"POD_NAME": "batchfill-7d9-abc"})
    assert a.startswith("batchfill-7d9-abc_")
    assert a != b


# --- settings ---------------------------------------------------------------------------------------------------------
def test_leader_election_is_off_by_default_and_on_with_the_pods_namespace() -> None:
    assert OperatorSettings.from_env({}).leader_election is False
    s = OperatorSettings.from_env({"BATCHFILL_LEADER_ELECTION": "true", "POD_NAMESPACE": "batchfill-system"})
    assert (s.leader_election, s.leader_election_namespace, s.leader_election_lease_name) == (
        True,
        "batchfill-system",
        "batchfill",
    )
    assert s.lease_timing == LeaseTiming()
    explicit = OperatorSettings.from_env(
        {
            "BATCHFILL_LEADER_ELECTION": "1",
            "POD_NAMESPACE": "batchfill-system",
            "BATCHFILL_LEADER_ELECTION_NAMESPACE": "ops",
            "BATCHFILL_LEADER_ELECTION_LEASE_NAME": "bf.leader",
            "BATCHFILL_LEADER_ELECTION_LEASE_DURATION_SECONDS": "30",
            "BATCHFILL_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": "20",
            "BATCHFILL_LEADER_ELECTION_RETRY_PERIOD_SECONDS": "4",
        }
    )
    assert explicit.leader_election_namespace == "ops"
    assert explicit.leader_election_lease_name == "bf.leader"
    assert explicit.lease_timing == LeaseTiming(30, 20.0, 4.0)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"BATCHFILL_LEADER_ELECTION": "1"}, "BATCHFILL_LEADER_ELECTION_NAMESPACE"),
        ({"BATCHFILL_LEADER_ELECTION": "perhaps"}, "BATCHFILL_LEADER_ELECTION"),
        ({"BATCHFILL_LEADER_ELECTION_LEASE_NAME": "Batchfill_Lease"}, "BATCHFILL_LEADER_ELECTION_LEASE_NAME"),
        ({"BATCHFILL_LEADER_ELECTION_NAMESPACE": "Ops"}, "BATCHFILL_LEADER_ELECTION_NAMESPACE"),
        (
            {"BATCHFILL_LEADER_ELECTION_LEASE_DURATION_SECONDS": "12"},
            "BATCHFILL_LEADER_ELECTION_LEASE_DURATION_SECONDS",
        ),
        (
            {"BATCHFILL_LEADER_ELECTION_LEASE_DURATION_SECONDS": "1.5"},
            "BATCHFILL_LEADER_ELECTION_LEASE_DURATION_SECONDS",
        ),
        ({"BATCHFILL_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": "3"}, "BATCHFILL_LEADER_ELECTION_RENEW_DEADLINE_SECONDS"),
        ({"BATCHFILL_LEADER_ELECTION_RETRY_PERIOD_SECONDS": "0"}, "BATCHFILL_LEADER_ELECTION_RETRY_PERIOD_SECONDS"),
    ],
    ids=["no-namespace", "not-a-boolean", "lease-name", "namespace", "no-margin", "fraction", "deadline", "retry"],
)
def test_bad_leader_election_settings_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ValidationError) as info:
        OperatorSettings.from_env(env)
    lines = describe_errors(info.value)
    assert any(line.startswith((variable + " ", variable + ":")) for line in lines), lines


def test_batchfill_run_reports_bad_settings_by_variable(capsys: pytest.CaptureFixture[str]) -> None:
    from batchfill.cli.main import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHFILL_LEADER_ELECTION", "1")
        mp.delenv("POD_NAMESPACE", raising=False)
        mp.delenv("BATCHFILL_LEADER_ELECTION_NAMESPACE", raising=False)
        assert main(["run"]) == 2
    assert "BATCHFILL_LEADER_ELECTION_NAMESPACE" in capsys.readouterr().err


# --- the standby's liveness endpoint -------------------------------------------------------------------------------
def test_standby_health_answers_the_liveness_path_then_frees_the_port() -> None:
    with StandbyHealth("http://127.0.0.1:0/healthz", lambda: {"leader": False}) as health:
        port = health.port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
            assert json.loads(r.read()) == {"leader": False}
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
        assert info.value.code == 404
    # closed: kopf can open the same endpoint
    with StandbyHealth(f"http://127.0.0.1:{port}/healthz", dict) as again:
        assert again.port == port
