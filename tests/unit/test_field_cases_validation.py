"""Field cases C01, C02, C03, C06, C07, C20 (docs/field-cases.md): rejected specs and their exact messages."""

from __future__ import annotations

from typing import Any

import pytest

from batchfill.api.errors import SpecError
from batchfill.api.reasons import SpecReason
from batchfill.api.validate import load_model

from .conftest import CASES_DOC, with_spec


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_model(doc)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    ("batching", "expected"),
    [
        pytest.param(
            {"maxBatchSize": 8, "preferredBatchSizes": [4, 16]},
            "spec.batching.preferredBatchSizes[1]=16 exceeds spec.batching.maxBatchSize=8",
            id="C01a",
        ),
        pytest.param(
            {"maxBatchSize": 0, "preferredBatchSizes": [2]},
            "spec.batching.preferredBatchSizes[0]=2 needs batching enabled: spec.batching.maxBatchSize "
            "must be > 0, got 0",
            id="C01b",
        ),
        pytest.param(
            {"preferredBatchSizes": [0, 8]},
            "spec.batching.preferredBatchSizes[0]: must be positive, got 0",
            id="C01c",
        ),
        pytest.param(
            {"maxQueueDelayMicroseconds": 60000},
            "spec.batching.maxQueueDelayMicroseconds=60000 µs (60 ms) exceeds the whole latency budget "
            "spec.sla.latencyP99Ms=50",
            id="C03-60ms",
        ),
        pytest.param(
            {"maxQueueDelayMicroseconds": -1},
            "spec.batching.maxQueueDelayMicroseconds: must be positive, got -1",
            id="C03-negative",
        ),
        pytest.param(
            {"preferredBatchSizes": [8, 128]},
            "spec.batching.preferredBatchSizes[1]=128 exceeds the largest profiled batch size 64 "
            "(spec.profile[3].batchSize); the profile is never extrapolated",
            id="beyond-profile",
        ),
    ],
)
def test_invalid_batching_is_rejected_with_field_and_numbers(batching: dict[str, Any], expected: str) -> None:
    doc = with_spec(CASES_DOC, batching=batching)
    with pytest.raises(SpecError) as info:
        load_model(doc)
    assert expected in [str(p) for p in info.value.problems]
    if not expected.endswith("got -1") and not expected.endswith("got 0"):
        assert info.value.reason == SpecReason.INVALID_BATCHING


def test_c02_batch_axis_in_dims_without_marker_contradicts_declared_rank() -> None:
    doc = with_spec(
        CASES_DOC,
        model={
            "backend": "tensorrt",
            "inputs": [{"name": "input_1", "dataType": "TYPE_FP32", "dims": [-1, 3, 512, 864], "rank": 4}],
            "outputs": [
                {
                    "name": "softmax_1",
                    "dataType": "TYPE_FP32",
                    "dims": [-1, 512, 864, 3],
                    "includesBatchDim": True,
                    "rank": 4,
                }
            ],
        },
    )
    assert problems(doc) == [
        "spec.model.inputs[0].dims: dims has 4 entries but model rank is 4 and batching is enabled; "
        "remove the leading batch dimension or set includesBatchDim: true"
    ]


def test_c02_leading_minus_one_alone_is_not_an_error() -> None:
    doc = with_spec(CASES_DOC, model={"inputs": [{"name": "ids", "dataType": "TYPE_INT64", "dims": [-1]}]})
    assert load_model(doc).spec.model.inputs[0].dims == [-1]


def test_c06_direct_strategy_rejects_preferred_sizes() -> None:
    doc = with_spec(
        CASES_DOC,
        model={"stateful": True, "sequenceStrategy": "Direct"},
        batching={"preferredBatchSizes": [8, 32]},
    )
    assert problems(doc) == [
        "spec.batching.preferredBatchSizes: preferred batch sizes are not supported by the Direct sequence "
        "strategy (spec.model.sequenceStrategy=Direct); remove them or use Oldest"
    ]


def test_c07_ragged_batch_without_batch_inputs_is_rejected() -> None:
    doc = with_spec(
        CASES_DOC,
        model={"inputs": [{"name": "input_ids", "dataType": "TYPE_INT64", "dims": [-1], "allowRaggedBatch": True}]},
    )
    assert problems(doc) == [
        "spec.model.inputs[0].allowRaggedBatch: ragged batching requires batch_input entries and model support; "
        "none declared (add spec.model.batchInputs)"
    ]


def test_c07_ragged_batch_never_with_batching_off() -> None:
    doc = with_spec(
        CASES_DOC,
        batching={"maxBatchSize": 0},
        model={
            "inputs": [{"name": "x", "dataType": "TYPE_INT64", "dims": [-1], "allowRaggedBatch": True}],
            "batchInputs": [
                {
                    "kind": "BATCH_ACCUMULATED_ELEMENT_COUNT",
                    "targetName": "INDEX",
                    "dataType": "TYPE_FP32",
                    "sourceInputs": ["x"],
                }
            ],
        },
    )
    assert (
        "spec.model.inputs[0].allowRaggedBatch: needs batching enabled: spec.batching.maxBatchSize must be > 0"
        in problems(doc)
    )


@pytest.mark.parametrize(
    ("triton", "model", "expected"),
    [
        pytest.param(
            {
                "gpusPerReplica": 1,
                "resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}},
            },
            {},
            "spec.triton.resources.requests[nvidia.com/gpu]=1 must equal "
            "spec.triton.resources.limits[nvidia.com/gpu]=2 (extended resources cannot be overcommitted)",
            id="C20-request-ne-limit",
        ),
        pytest.param(
            {"gpusPerReplica": 0.5},
            {},
            "spec.triton.gpusPerReplica: must be a whole number, got 0.5",
            id="C20-fractional",
        ),
        pytest.param(
            {"gpusPerReplica": 0},
            {"backend": "tensorrt"},
            "spec.triton.gpusPerReplica=0 but tensorrt runs only on GPUs; give at least 1",
            id="C20-zero-gpu-tensorrt",
        ),
        pytest.param(
            {"gpusPerReplica": 1, "resources": {"limits": {"nvidia.com/gpu": "500m"}}},
            {},
            "spec.triton.resources.limits[nvidia.com/gpu]=500m must be a whole number of GPUs",
            id="C20-milli-gpu",
        ),
    ],
)
def test_c20_gpu_resources(triton: dict[str, Any], model: dict[str, Any], expected: str) -> None:
    doc = with_spec(CASES_DOC, triton=triton, model=model)
    assert expected in problems(doc)


def test_every_problem_is_reported_not_only_the_first() -> None:
    doc = with_spec(
        CASES_DOC,
        batching={"maxBatchSize": 8, "preferredBatchSizes": [4, 16, 32]},
        scaling={"minReplicas": 5, "maxReplicas": 2},
    )
    got = problems(doc)
    assert "spec.batching.preferredBatchSizes[1]=16 exceeds spec.batching.maxBatchSize=8" in got
    assert "spec.batching.preferredBatchSizes[2]=32 exceeds spec.batching.maxBatchSize=8" in got
    assert "spec.scaling.minReplicas=5 exceeds spec.scaling.maxReplicas=2" in got


@pytest.mark.parametrize(
    ("doc_change", "expected"),
    [
        ({"sla": {"latencyP99Ms": "fast"}}, "spec.sla.latencyP99Ms: Input should be a valid number"),
        ({"sla": {"latencyP99Ms": 100, "extra": 1}}, "spec.sla.extra: unknown field"),
        (
            {"sla": {"latencyP99Ms": 10, "networkOverheadMs": 10}},
            "spec.sla.networkOverheadMs=10 ms leaves no server budget: it must be less than spec.sla.latencyP99Ms=10",
        ),
        (
            {"profile": [{"batchSize": 4, "latencyMs": 1}, {"batchSize": 2, "latencyMs": 2}]},
            "spec.profile[1].batchSize=2 must be greater than spec.profile[0].batchSize=4 (batch sizes strictly "
            "increasing)",
        ),
        (
            {"profile": [{"batchSize": 1, "latencyMs": -3}]},
            "spec.profile[0].latencyMs: must be positive, got -3",
        ),
        ({"sla": {"latencyP99Ms": float("nan")}}, "spec.sla.latencyP99Ms"),
    ],
)
def test_type_and_range_errors_name_the_field(doc_change: dict[str, Any], expected: str) -> None:
    doc = with_spec(CASES_DOC)
    doc["spec"].update(doc_change)
    got = problems(doc)
    assert any(p.startswith(expected) for p in got), got
