"""The pool loop's cost split per tick (controller/pool_cost.py) and the statistics answer it reads
(adapters/triton_repository.parse_execution_counters, fed the JSON shape Triton's statistics extension returns)."""

from __future__ import annotations

import pytest

from batchfill.adapters.triton_repository import TritonCallError, parse_execution_counters
from batchfill.api.reasons import CostSplitReason
from batchfill.controller.pool_cost import MAX_INTERVAL_S, CostMemory, decide_cost
from batchfill.policy.cost import ExecutionCounters

T0 = 1_800_000_000.0
NAMES = {"a": "bm-a", "b": "bm-b"}


def c(infer_us: float) -> ExecutionCounters:
    return ExecutionCounters(0.0, infer_us, 0.0)


def test_a_pod_read_for_the_first_time_only_starts_its_interval() -> None:
    splits, memory = decide_cost({"p0": {"a": c(500.0)}}, NAMES, 1.0, CostMemory(), T0)
    assert splits == []
    assert memory.reads == {"p0": (T0, {"bm-a": c(500.0)})}


def test_the_interval_is_split_by_execution_time_under_the_batchedmodel_names() -> None:
    _, memory = decide_cost({"p0": {"a": c(0.0), "b": c(0.0)}}, NAMES, 2.0, CostMemory(), T0)
    splits, memory = decide_cost({"p0": {"a": c(3000.0), "b": c(1000.0)}}, NAMES, 2.0, memory, T0 + 30)
    (split,) = splits
    assert split.reason is CostSplitReason.EXECUTION_TIME
    assert split.gpu_seconds == pytest.approx({"bm-a": 45.0, "bm-b": 15.0})  # 2 GPUs x 30 s, 3:1
    assert memory.reads["p0"][0] == T0 + 30


def test_an_unreadable_pod_charges_no_model_and_starts_again_from_its_next_read() -> None:
    _, memory = decide_cost({"p0": {"a": c(0.0)}}, NAMES, 1.0, CostMemory(), T0)
    splits, memory = decide_cost({"p0": None}, NAMES, 1.0, memory, T0 + 30)
    assert [(s.gpu_seconds, s.unattributed_gpu_seconds, s.reason) for s in splits] == [
        ({}, 30.0, CostSplitReason.UNKNOWN_COUNTER)
    ]
    assert memory.reads == {"p0": (T0 + 30, None)}
    # the next interval has no counters to start from: charged to no model either, then split again
    splits, memory = decide_cost({"p0": {"a": c(900.0)}}, NAMES, 1.0, memory, T0 + 60)
    assert [(s.gpu_seconds, s.unattributed_gpu_seconds, s.reason) for s in splits] == [
        ({}, 30.0, CostSplitReason.UNKNOWN_COUNTER)
    ]
    splits, _ = decide_cost({"p0": {"a": c(1900.0)}}, NAMES, 1.0, memory, T0 + 90)
    assert [s.reason for s in splits] == [CostSplitReason.EXECUTION_TIME]


def test_a_listed_pod_left_unread_for_a_tick_is_charged_so_every_second_adds_up() -> None:
    """A pod not Ready for a moment (or its index unread) is not in ``reads`` but still holds its GPU."""
    _, memory = decide_cost({"p0": {"a": c(0.0)}}, NAMES, 1.0, CostMemory(), T0)
    total = 0.0
    for i, read in enumerate(({}, {"p0": {"a": c(10.0)}}, {"p0": {"a": c(20.0)}})):
        splits, memory = decide_cost(read, NAMES, 1.0, memory, T0 + 15 * (i + 1), listed=["p0"])
        total += sum(sum(s.gpu_seconds.values()) + s.unattributed_gpu_seconds for s in splits)
    assert total == pytest.approx(45.0)  # 3 intervals of 15 s, 1 GPU
    # gone from the list: forgotten
    _, memory = decide_cost({}, NAMES, 1.0, memory, T0 + 60, listed=[])
    assert memory.reads == {}


def test_a_gap_longer_than_the_bound_charges_nothing_and_a_pod_gone_is_forgotten() -> None:
    _, memory = decide_cost({"p0": {"a": c(0.0)}, "p1": {"b": c(0.0)}}, NAMES, 1.0, CostMemory(), T0)
    splits, memory = decide_cost({"p0": {"a": c(10.0)}}, NAMES, 1.0, memory, T0 + MAX_INTERVAL_S + 1)
    assert splits == []
    assert set(memory.reads) == {"p0"}


def test_a_model_that_is_no_member_keeps_its_triton_name() -> None:
    _, memory = decide_cost({"p0": {"x": c(0.0)}}, NAMES, 1.0, CostMemory(), T0)
    (split,), _ = decide_cost({"p0": {"x": c(5.0)}}, NAMES, 1.0, memory, T0 + 10)
    assert split.gpu_seconds == {"x": 10.0}


def test_triton_statistics_answers_are_summed_over_versions_in_microseconds() -> None:
    def entry(name: str, version: str, ns: int) -> dict[str, object]:
        stats = {k: {"count": 3, "ns": ns} for k in ("compute_input", "compute_infer", "compute_output")}
        return {"name": name, "version": version, "inference_stats": {**stats, "success": {"count": 3, "ns": 9}}}

    answer = {"model_stats": [entry("a", "1", 2000), entry("a", "2", 1000), entry("b", "1", 0)]}
    assert parse_execution_counters("p0", answer) == {
        "a": ExecutionCounters(3.0, 3.0, 3.0), "b": ExecutionCounters(0.0, 0.0, 0.0)
    }  # fmt: skip
    assert isinstance(parse_execution_counters("p0", {"error": "x"}), TritonCallError)
    assert isinstance(parse_execution_counters("p0", {"model_stats": [{"version": "1"}]}), TritonCallError)
    bad = {"model_stats": [{"name": "a", "inference_stats": {"compute_infer": {"ns": "many"}}}]}
    assert isinstance(parse_execution_counters("p0", bad), TritonCallError)
