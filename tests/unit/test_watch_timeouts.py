"""kopf's watch timeouts from the operator's settings, and the bound on an unhandled generation (pure parts)."""

from __future__ import annotations

import kopf
import pytest
from pydantic import ValidationError

from batchfill.controller.handlers import watch_timeouts
from batchfill.controller.settings import OperatorSettings, describe_errors
from batchfill.policy.conditions import GenerationLag, generation_lag, generation_unhandled


def test_kopf_watches_get_finite_timeouts_from_the_settings_defaults() -> None:
    kopf_settings = kopf.OperatorSettings()
    assert kopf_settings.watching.server_timeout is None, "kopf leaves them unset: what this change is for"
    watch_timeouts(kopf_settings, OperatorSettings())
    assert (
        kopf_settings.watching.server_timeout,
        kopf_settings.watching.client_timeout,
        kopf_settings.watching.connect_timeout,
    ) == (300.0, 330.0, 10.0)
    # kopf sends str(server_timeout) as timeoutSeconds; the API server parses an integer ("300.0" is HTTP 400)
    assert str(kopf_settings.watching.server_timeout) == "300"


def test_watch_timeouts_and_the_bound_come_from_the_environment() -> None:
    env = {
        "BATCHFILL_WATCH_SERVER_TIMEOUT_SECONDS": "20",
        "BATCHFILL_WATCH_CLIENT_TIMEOUT_SECONDS": "25",
        "BATCHFILL_WATCH_CONNECT_TIMEOUT_SECONDS": "3",
        "BATCHFILL_UNHANDLED_GENERATION_SECONDS": "12",
    }
    ours = OperatorSettings.from_env(env)
    kopf_settings = kopf.OperatorSettings()
    watch_timeouts(kopf_settings, ours)
    assert (kopf_settings.watching.server_timeout, kopf_settings.watching.client_timeout) == (20.0, 25.0)
    assert kopf_settings.watching.connect_timeout == 3.0
    assert ours.unhandled_generation_s == 12.0


def test_a_fractional_server_timeout_is_refused() -> None:
    with pytest.raises(ValidationError):
        OperatorSettings.from_env({"BATCHFILL_WATCH_SERVER_TIMEOUT_SECONDS": "20.5"})


def test_a_client_timeout_not_above_the_server_timeout_is_refused_by_name() -> None:
    with pytest.raises(ValidationError) as err:
        OperatorSettings.from_env(
            {"BATCHFILL_WATCH_SERVER_TIMEOUT_SECONDS": "60", "BATCHFILL_WATCH_CLIENT_TIMEOUT_SECONDS": "60"}
        )
    (line,) = describe_errors(err.value)
    assert "BATCHFILL_WATCH_CLIENT_TIMEOUT_SECONDS: must be above BATCHFILL_WATCH_SERVER_TIMEOUT_SECONDS (60 s)" in line


@pytest.mark.parametrize("bad", ["0", "-1", "nan"])
def test_the_bound_must_be_positive(bad: str) -> None:
    with pytest.raises(ValidationError):
        OperatorSettings.from_env({"BATCHFILL_UNHANDLED_GENERATION_SECONDS": bad})


def test_a_generation_lag_starts_when_first_seen_and_ends_when_observed() -> None:
    assert generation_lag(None, 3, 3, 100.0) is None
    assert generation_lag(None, None, None, 100.0) is None
    first = generation_lag(None, 4, 3, 100.0)
    assert first == GenerationLag(4, 100.0)
    assert generation_lag(first, 4, 3, 130.0) is first, "the same generation keeps its start"
    assert generation_lag(first, 5, 3, 130.0) == GenerationLag(5, 130.0), "a newer one starts again"
    assert generation_lag(first, 4, 4, 130.0) is None
    created = generation_lag(None, 1, None, 100.0)  # a create kopf never handled: no status at all
    assert created == GenerationLag(1, 100.0)


def test_a_generation_is_unhandled_only_past_the_bound() -> None:
    lag = GenerationLag(4, 100.0)
    assert not generation_unhandled(None, 1_000.0, 60.0)
    assert not generation_unhandled(lag, 160.0, 60.0)
    assert generation_unhandled(lag, 160.5, 60.0)


def test_a_lag_is_not_a_stall_while_the_watch_shows_progress_up_to_the_stuck_bound() -> None:
    lag = GenerationLag(4, 100.0)
    assert not generation_unhandled(lag, 200.0, 60.0, last_progress=150.0), "others observed 50 s ago: busy"
    assert generation_unhandled(lag, 200.0, 60.0, last_progress=139.0), "no progress for 61 s: stalled"
    assert generation_unhandled(lag, 200.0, 60.0, last_progress=None)
    assert not generation_unhandled(lag, 400.0, 60.0, last_progress=399.0), "5 bounds exactly: still kopf's"
    assert generation_unhandled(lag, 400.5, 60.0, last_progress=399.0), "past 5 bounds: a stuck handler"
