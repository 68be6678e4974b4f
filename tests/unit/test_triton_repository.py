"""Reading Triton's repository index and naming a failed repository call (batchfill.adapters.triton_repository;
the calls themselves run against a real tritonserver in tests/component/test_pool_models_real.py)."""

from __future__ import annotations

from typing import Any

import pytest

from batchfill.adapters.profiler import SERVER_TEXT_LIMIT
from batchfill.adapters.triton_repository import IndexEntry, ModelState, TritonCallError, load, parse_index
from batchfill.render.pool import unload_request


def test_the_index_gives_each_model_its_state_and_reason() -> None:
    # as Triton 2.51 answers: a model never loaded has no version and no state
    answer = [
        {"name": "a", "version": "1", "state": "READY"},
        {"name": "b"},
        {"name": "c", "version": "1", "state": "UNAVAILABLE", "reason": "Invalid argument:\n no GPUs are available"},
        {"name": "d", "version": "1", "state": "UNLOADING"},
    ]
    assert parse_index("p1", answer) == {
        "a": IndexEntry("a", ModelState.READY),
        "b": IndexEntry("b", ModelState.UNAVAILABLE),
        "c": IndexEntry("c", ModelState.UNAVAILABLE, "Invalid argument: no GPUs are available"),
        "d": IndexEntry("d", ModelState.UNLOADING),
    }


def test_a_model_with_several_versions_is_ready_when_one_is() -> None:
    answer = [
        {"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "a", "version": "2", "state": "READY"},
        {"name": "b", "version": "1", "state": "UNAVAILABLE"},
        {"name": "b", "version": "2", "state": "LOADING"},
    ]
    got = parse_index("p1", answer)
    assert isinstance(got, dict)
    assert {m: e.state for m, e in got.items()} == {"a": ModelState.READY, "b": ModelState.LOADING}


@pytest.mark.parametrize(
    ("answer", "model", "message"),
    [
        ({"models": []}, "", "not a list: dict"),
        ([{"state": "READY"}], "", "an entry without a name: {'state': 'READY'}"),
        ([{"name": "a", "state": "WARMING"}], "a", "unknown state 'WARMING'"),
    ],
)
def test_an_index_of_another_shape_is_unreadable_not_empty(answer: Any, model: str, message: str) -> None:
    assert parse_index("p1", answer) == TritonCallError("p1", model, "index", 200, message)


def test_reasons_are_one_bounded_line() -> None:
    got = parse_index("p1", [{"name": "a", "state": "UNAVAILABLE", "reason": "x\n" * 5000}])
    assert isinstance(got, dict)
    assert len(got["a"].reason) == SERVER_TEXT_LIMIT
    assert "\n" not in got["a"].reason


def test_an_error_names_pod_call_model_and_status() -> None:
    assert str(TritonCallError("p1", "a", "load", 400, "bad")) == "pod p1: load a: HTTP 400: bad"
    assert str(TritonCallError("p1", "", "index", None, "refused")) == "pod p1: index: no answer: refused"


def test_only_a_load_request_is_loaded() -> None:
    with pytest.raises(ValueError, match="not a load request"):
        load("127.0.0.1:1", "p1", unload_request("a"))
