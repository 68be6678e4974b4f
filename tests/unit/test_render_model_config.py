"""Tests of the config.pbtxt renderer (batchfill.render.model_config).

Golden files live in tests/unit/golden/model_config/<case>.pbtxt. After an intended change of the rendered
text, regenerate them and review the diff before committing:

    BATCHFILL_UPDATE_GOLDEN=1 pytest tests/unit/test_render_model_config.py -q
    git diff tests/unit/golden/

Golden comparisons alone would let a bad regeneration through, so every golden case is also checked
against hand-written exact values (the seed example against its whole text).
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc.model_config_pb2 as mc
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchfill.render
from batchfill.api.errors import SpecError
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.status import PlanStatus, SeedRule
from batchfill.api.validate import check_spec
from batchfill.render import InstanceKind, build_model_config, config_hash, render_model_config

GOLDEN_DIR = Path(__file__).parent / "golden" / "model_config"
UPDATE_GOLDEN = os.environ.get("BATCHFILL_UPDATE_GOLDEN") == "1"


# --- builders ------------------------------------------------------------------------------------------


def make_plan(
    maxBatchSize: int,
    preferredBatchSizes: list[int] | None = None,
    maxQueueDelayMicroseconds: int = 0,
    instanceCount: int = 1,
    minimumSlotUtilization: float | None = None,
    **extra: Any,
) -> PlanStatus:
    """A PlanStatus by hand; the predictions do not influence the config, so they get fixed dummies."""
    fields: dict[str, Any] = {
        "serverBudgetMs": 90.0,
        "capacityPerReplicaRps": 150.0,
        "predictedP99Ms": 80.0,
        "minClientTimeoutMs": 66.0,
        "rule": "hand-written test plan",
        "seedRule": None,
    }
    fields.update(extra)
    return PlanStatus(
        maxBatchSize=maxBatchSize,
        preferredBatchSizes=preferredBatchSizes or [],
        maxQueueDelayMicroseconds=maxQueueDelayMicroseconds,
        instanceCount=instanceCount,
        minimumSlotUtilization=minimumSlotUtilization,
        **fields,
    )


def make_spec(model: dict[str, Any] | None = None, **sections: Any) -> BatchedModelSpec:
    """The seed example's spec (resnet50, SLA 100/10, profile {1:10, 4:28, 8:50}, 1 GPU) with overrides."""
    doc: dict[str, Any] = {
        "model": {
            "name": "resnet50",
            "backend": "onnxruntime",
            "inputs": [{"name": "INPUT__0", "dataType": "TYPE_FP32", "dims": [3, 224, 224]}],
            "outputs": [{"name": "OUTPUT__0", "dataType": "TYPE_FP32", "dims": [1000]}],
        },
        "sla": {"latencyP99Ms": 100, "networkOverheadMs": 10},
        "profile": [
            {"batchSize": 1, "latencyMs": 10},
            {"batchSize": 4, "latencyMs": 28},
            {"batchSize": 8, "latencyMs": 50},
        ],
        "triton": {"gpusPerReplica": 1},
    }
    if model:
        doc["model"] = {**doc["model"], **model}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return BatchedModelSpec.model_validate(doc)


def parse(text: str) -> Any:
    return text_format.Parse(text, mc.ModelConfig())


# The seed example: SLA 100 ms, overhead 10 ms, l(8) = 50 ms. Seed rule D = 100 - 50 - 10 = 40 ms; the plan
# keeps a margin and queues at most 6 ms; min client timeout = 6 + 50 + 10 = 66 ms.
SEED_PLAN = make_plan(
    8,
    [8],
    6000,
    1,
    serverBudgetMs=90.0,
    minClientTimeoutMs=66.0,
    seedRule=SeedRule(maxBatchSize=8, maxQueueDelayMicroseconds=40_000, capacityPerReplicaRps=120.0),
)

# The batch axis written into dims, marked with includesBatchDim (docs/field-cases.md#batch-axis-in-dims).
C02_MODEL: dict[str, Any] = {
    "name": "segmenter",
    "backend": None,
    "platform": "tensorrt_plan",
    "inputs": [{"name": "input_1", "dataType": "TYPE_FP32", "dims": [-1, 3, 512, 864], "includesBatchDim": True}],
    "outputs": [{"name": "softmax_1", "dataType": "TYPE_FP32", "dims": [-1, 512, 864, 3], "includesBatchDim": True}],
}
C02_PROFILE = [{"batchSize": 1, "latencyMs": 10}, {"batchSize": 16, "latencyMs": 40}]

# A stateful model (sequence batcher), SLA 50 ms, profile {1:4, 8:12, 32:35} (docs/field-cases.md#stateful-models).
STATEFUL_MODEL: dict[str, Any] = {
    "name": "tracker",
    "stateful": True,
    "inputs": [{"name": "INPUT", "dataType": "TYPE_FP32", "dims": [16]}],
    "outputs": [{"name": "OUTPUT", "dataType": "TYPE_FP32", "dims": [16]}],
}
STATEFUL_SECTIONS: dict[str, Any] = {
    "sla": {"latencyP99Ms": 50, "networkOverheadMs": 0},
    "profile": [
        {"batchSize": 1, "latencyMs": 4},
        {"batchSize": 8, "latencyMs": 12},
        {"batchSize": 32, "latencyMs": 35},
    ],
}

# Variable-length token input with ragged batching declared end to end (docs/field-cases.md#variable-length-inputs).
RAGGED_MODEL: dict[str, Any] = {
    "name": "bert",
    "inputs": [{"name": "input_ids", "dataType": "TYPE_INT64", "dims": [-1], "allowRaggedBatch": True}],
    "outputs": [{"name": "logits", "dataType": "TYPE_FP32", "dims": [2]}],
    "batchInputs": [
        {
            "kind": "BATCH_ACCUMULATED_ELEMENT_COUNT",
            "targetName": "INDEX",
            "dataType": "TYPE_INT32",
            "sourceInputs": ["input_ids"],
        },
        {
            "kind": "BATCH_ELEMENT_COUNT",
            "targetName": "LENGTHS",
            "dataType": "TYPE_INT32",
            "sourceInputs": ["input_ids"],
        },
    ],
}

GOLDEN_CASES: dict[str, tuple[BatchedModelSpec, PlanStatus, InstanceKind | None]] = {
    "seed_gpu": (make_spec(), SEED_PLAN, None),
    "batching_off": (
        make_spec(C02_MODEL, profile=C02_PROFILE),
        make_plan(0, [], 0, 1),
        None,
    ),
    "stateful_oldest": (
        make_spec({**STATEFUL_MODEL, "sequenceStrategy": "Oldest"}, **STATEFUL_SECTIONS),
        make_plan(32, [8, 32], 15_000, 1),
        None,
    ),
    "stateful_direct": (
        make_spec({**STATEFUL_MODEL, "sequenceStrategy": "Direct"}, **STATEFUL_SECTIONS),
        make_plan(32, [], 15_000, 1, minimumSlotUtilization=None),
        None,
    ),
    "ragged_batch_inputs": (
        make_spec(RAGGED_MODEL, sla={"latencyP99Ms": 50, "networkOverheadMs": 0}),
        make_plan(32, [16, 32], 2000, 1),
        None,
    ),
    "cpu_instance_kind": (
        make_spec(triton={"gpusPerReplica": 2}),
        make_plan(8, [8], 6000, 2),
        "KIND_CPU",
    ),
}


# --- golden files --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden(case: str) -> None:
    spec, plan, kind = GOLDEN_CASES[case]
    text = render_model_config(spec, plan, instance_kind=kind)
    path = GOLDEN_DIR / f"{case}.pbtxt"
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
    assert path.exists(), f"{path} missing: run with BATCHFILL_UPDATE_GOLDEN=1 to create it"
    golden = path.read_text(encoding="utf-8")
    assert text == golden, f"{case}: rendered config.pbtxt differs from {path} (BATCHFILL_UPDATE_GOLDEN=1)"
    assert parse(golden) == build_model_config(spec, plan, instance_kind=kind)


def test_no_stale_golden_files() -> None:
    assert {p.stem for p in GOLDEN_DIR.glob("*.pbtxt")} == set(GOLDEN_CASES)


SEED_TEXT = """\
name: "resnet50"
backend: "onnxruntime"
max_batch_size: 8
input {
  name: "INPUT__0"
  data_type: TYPE_FP32
  dims: [3, 224, 224]
}
output {
  name: "OUTPUT__0"
  data_type: TYPE_FP32
  dims: [1000]
}
dynamic_batching {
  preferred_batch_size: [8]
  max_queue_delay_microseconds: 6000
}
instance_group {
  count: 1
  kind: KIND_GPU
}
"""


def test_seed_example_exact_text() -> None:
    assert render_model_config(make_spec(), SEED_PLAN) == SEED_TEXT


def _scheduling_lines(text: str) -> list[str]:
    """The lines from the scheduler block to the end of it (top-level blocks close with '}' in column 0)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("_batching {"))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return lines[start : end + 1]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param(
            "stateful_oldest",
            [
                "sequence_batching {",
                "  oldest {",
                "    max_candidate_sequences: 32",
                "    preferred_batch_size: [8, 32]",
                "    max_queue_delay_microseconds: 15000",
                "  }",
                "}",
            ],
            id="oldest",
        ),
        pytest.param(
            "stateful_direct",
            [
                "sequence_batching {",
                "  direct {",
                "    max_queue_delay_microseconds: 15000",
                "    minimum_slot_utilization: 1.0",
                "  }",
                "}",
            ],
            id="direct",
        ),
        pytest.param(
            "ragged_batch_inputs",
            [
                "dynamic_batching {",
                "  preferred_batch_size: [16, 32]",
                "  max_queue_delay_microseconds: 2000",
                "}",
            ],
            id="ragged",
        ),
    ],
)
def test_golden_cases_scheduling_exact(case: str, expected: list[str]) -> None:
    spec, plan, kind = GOLDEN_CASES[case]
    text = render_model_config(spec, plan, instance_kind=kind)
    assert _scheduling_lines(text) == expected
    assert text.count("_batching {") == 1


def test_batching_off_exact() -> None:
    spec, plan, _ = GOLDEN_CASES["batching_off"]
    text = render_model_config(spec, plan)
    assert text.splitlines()[:3] == ['name: "segmenter"', 'platform: "tensorrt_plan"', "max_batch_size: 0"]
    assert "dims: [-1, 3, 512, 864]" in text
    assert "dims: [-1, 512, 864, 3]" in text
    for absent in (
        "dynamic_batching",
        "sequence_batching",
        "preferred_batch_size",
        "max_queue_delay",
        "backend",
    ):
        assert absent not in text


def test_ragged_exact() -> None:
    spec, plan, _ = GOLDEN_CASES["ragged_batch_inputs"]
    text = render_model_config(spec, plan)
    blocks = text.split("batch_input {\n")[1:]
    assert [b.split("}\n")[0] for b in blocks] == [
        '  kind: BATCH_ACCUMULATED_ELEMENT_COUNT\n  target_name: "INDEX"\n  data_type: TYPE_INT32\n'
        '  source_input: "input_ids"\n',
        # BATCH_ELEMENT_COUNT is enum value 0, which proto3 printing would drop: it is written anyway.
        '  kind: BATCH_ELEMENT_COUNT\n  target_name: "LENGTHS"\n  data_type: TYPE_INT32\n  source_input: "input_ids"\n',
    ]
    cfg = parse(text)
    assert [(i.name, list(i.dims), i.allow_ragged_batch) for i in cfg.input] == [("input_ids", [-1], True)]


def test_cpu_instance_kind_exact() -> None:
    spec, plan, kind = GOLDEN_CASES["cpu_instance_kind"]
    text = render_model_config(spec, plan, instance_kind=kind)
    assert text.endswith("instance_group {\n  count: 4\n  kind: KIND_CPU\n}\n")  # 2 per GPU x 2 GPUs


# --- max_batch_size always stated, delay in exact microseconds (docs/field-cases.md C01, C03) ----------


@pytest.mark.parametrize("mbs", [0, 1, 8, 65_536])
def test_max_batch_size_line_always_present(mbs: int) -> None:
    plan = make_plan(mbs, [], 1000 if mbs else 0)
    text = render_model_config(make_spec(), plan)
    assert re.findall(r"^max_batch_size: (\d+)$", text, re.MULTILINE) == [str(mbs)]


def test_c03_delay_is_the_exact_microsecond_integer() -> None:
    # The seed rule for CASES_DOC (docs/field-cases.md#queue-delay-units): (50 ms - 35 ms) * 1000 = 15000 µs.
    # Not 15, not 15000000.
    spec = make_spec(sla={"latencyP99Ms": 50, "networkOverheadMs": 0})
    text = render_model_config(spec, make_plan(32, [32], 15_000))
    assert re.findall(r"max_queue_delay_microseconds: (\d+)$", text, re.MULTILINE) == ["15000"]
    assert parse(text).dynamic_batching.max_queue_delay_microseconds == 15_000


# --- dims and the batch axis (docs/field-cases.md#batch-axis-in-dims) ----------------------------------


@pytest.mark.parametrize(
    ("mbs", "input_dims", "output_dims"),
    [
        pytest.param(16, [3, 512, 864], [512, 864, 3], id="batching-on-drops-one-axis"),
        pytest.param(1, [3, 512, 864], [512, 864, 3], id="max-batch-1-still-batching"),
        pytest.param(0, [-1, 3, 512, 864], [-1, 512, 864, 3], id="batching-off-keeps-full-shape"),
    ],
)
def test_c02_dims_follow_max_batch_size(mbs: int, input_dims: list[int], output_dims: list[int]) -> None:
    spec = make_spec(C02_MODEL, profile=C02_PROFILE)
    plan = make_plan(mbs, [], 1000 if mbs else 0)
    cfg = parse(render_model_config(spec, plan))
    assert list(cfg.input[0].dims) == input_dims
    assert list(cfg.output[0].dims) == output_dims


@pytest.mark.parametrize(
    ("tensor", "mbs", "expected"),
    [
        pytest.param({"dims": [-1]}, 32, [-1], id="token-sequence-leading-minus-one-kept"),
        pytest.param({"dims": [-1, 768]}, 32, [-1, 768], id="unmarked-leading-minus-one-kept"),
        pytest.param({"dims": [8, -1, 4], "includesBatchDim": True}, 32, [-1, 4], id="marked-axis-any-value"),
        pytest.param({"dims": [-1, -1, 4], "includesBatchDim": True}, 32, [-1, 4], id="only-one-axis-removed"),
        pytest.param({"dims": [-1, 4], "includesBatchDim": True, "rank": 2}, 32, [4], id="rank-batching-on"),
        pytest.param({"dims": [-1, 4], "includesBatchDim": True, "rank": 2}, 0, [-1, 4], id="rank-batching-off"),
        pytest.param({"dims": [4], "rank": 2}, 32, [4], id="rank-sample-dims"),
    ],
)
def test_dims_table(tensor: dict[str, Any], mbs: int, expected: list[int]) -> None:
    spec = make_spec({"inputs": [{"name": "x", "dataType": "TYPE_FP32", **tensor}]})
    cfg = build_model_config(spec, make_plan(mbs, [], 100 if mbs else 0))
    assert list(cfg.input[0].dims) == expected


def test_same_spec_two_dims_lists_deterministically() -> None:
    spec = make_spec(C02_MODEL, profile=C02_PROFILE)
    on = [render_model_config(spec, make_plan(16, [16], 30_000)) for _ in range(3)]
    off = [render_model_config(spec, make_plan(0)) for _ in range(3)]
    assert len(set(on)) == 1
    assert len(set(off)) == 1
    assert on[0] != off[0]


# --- scheduling ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "plan", "expected"),
    [
        pytest.param(
            {},
            make_plan(8, [4, 8], 6000),
            (
                "dynamic_batching",
                None,
                {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 6000},
            ),
            id="stateless-batching",
        ),
        pytest.param(
            {},
            make_plan(8, [], 1),
            ("dynamic_batching", None, {"preferred_batch_size": [], "max_queue_delay_microseconds": 1}),
            id="stateless-no-preferred",
        ),
        pytest.param({}, make_plan(0), (None, None, {}), id="stateless-batching-off"),
        pytest.param(
            {"stateful": True},  # sequenceStrategy defaults to Oldest and is still written out
            make_plan(8, [8], 6000),
            (
                "sequence_batching",
                "oldest",
                {
                    "max_candidate_sequences": 8,
                    "preferred_batch_size": [8],
                    "max_queue_delay_microseconds": 6000,
                },
            ),
            id="oldest-default-strategy",
        ),
        pytest.param(
            {"stateful": True, "sequenceStrategy": "Oldest"},
            make_plan(0),
            ("sequence_batching", "oldest", {"max_candidate_sequences": 1, "preferred_batch_size": []}),
            id="oldest-batching-off",
        ),
        pytest.param(
            {"stateful": True, "sequenceStrategy": "Direct"},
            make_plan(8, [], 6000, minimumSlotUtilization=0.5),
            (
                "sequence_batching",
                "direct",
                {"max_queue_delay_microseconds": 6000, "minimum_slot_utilization": 0.5},
            ),
            id="direct-plan-utilization",
        ),
        pytest.param(
            {"stateful": True, "sequenceStrategy": "Direct"},
            make_plan(8, [4, 8], 6000),  # preferred sizes do not exist in Direct: not written
            (
                "sequence_batching",
                "direct",
                {"max_queue_delay_microseconds": 6000, "minimum_slot_utilization": 1.0},
            ),
            id="direct-drops-plan-preferred",
        ),
    ],
)
def test_scheduling_table(
    model: dict[str, Any], plan: PlanStatus, expected: tuple[str | None, str | None, dict[str, Any]]
) -> None:
    scheduler, strategy, fields = expected
    text = render_model_config(make_spec(model), plan)
    cfg = parse(text)
    assert cfg.WhichOneof("scheduling_choice") == scheduler
    block = getattr(cfg, scheduler) if scheduler else None
    if strategy is not None:
        assert block is not None
        assert block.WhichOneof("strategy_choice") == strategy
        block = getattr(block, strategy)
    if block is not None:
        got = {name: getattr(block, name) for name in fields}
        got = {k: list(v) if not isinstance(v, int | float) else v for k, v in got.items()}
        assert got == fields
    if scheduler == "sequence_batching":
        assert "dynamic_batching" not in text
        assert f"  {strategy} {{" in text  # the strategy is written even where it is Triton's default
    if strategy == "direct":
        assert "preferred_batch_size" not in text


# --- instance group ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "instances", "override", "kind", "count"),
    [
        pytest.param(1, 1, None, "KIND_GPU", 1, id="gpu-default"),
        pytest.param(4, 2, None, "KIND_GPU", 2, id="gpu-count-is-per-gpu"),
        pytest.param(0, 3, None, "KIND_CPU", 3, id="no-gpu-is-cpu"),
        pytest.param(1, 2, "KIND_CPU", "KIND_CPU", 2, id="cpu-stand-in-1-gpu"),
        pytest.param(4, 2, "KIND_CPU", "KIND_CPU", 8, id="cpu-stand-in-keeps-parallelism"),
        pytest.param(0, 2, "KIND_CPU", "KIND_CPU", 2, id="cpu-forced-no-gpu"),
        pytest.param(2, 1, "KIND_GPU", "KIND_GPU", 1, id="gpu-forced"),
    ],
)
def test_instance_group_table(gpus: int, instances: int, override: Any, kind: str, count: int) -> None:
    spec = make_spec(triton={"gpusPerReplica": gpus})
    cfg = parse(render_model_config(spec, make_plan(8, [8], 6000, instances), instance_kind=override))
    assert len(cfg.instance_group) == 1
    group = cfg.instance_group[0]
    assert mc.ModelInstanceGroup.Kind.Name(group.kind) == kind
    assert group.count == count
    assert list(group.gpus) == []  # KIND_GPU without gpus: `count` instances on every visible GPU


# --- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "plan", "kind", "error", "message"),
    [
        pytest.param(
            make_spec(triton={"gpusPerReplica": 0}),
            make_plan(8, [8], 6000),
            "KIND_GPU",
            ValueError,
            "instance_kind=KIND_GPU but spec.triton.gpusPerReplica=0",
            id="gpu-kind-without-gpu",
        ),
        pytest.param(make_spec(), make_plan(8, [8], 6000), "KIND_TPU", ValueError, "instance_kind=", id="bad-kind"),
        pytest.param(
            make_spec(),
            make_plan(8, [4, 16], 6000),
            None,
            ValueError,
            r"plan.preferredBatchSizes\[1\]=16 is outside \[1, plan.maxBatchSize=8\]",
            id="c01-preferred-above-max",
        ),
        pytest.param(
            make_spec(),
            make_plan(0, [2], 0),
            None,
            ValueError,
            r"plan.preferredBatchSizes\[0\]=2 given with plan.maxBatchSize=0",
            id="c01-preferred-with-batching-off",
        ),
        pytest.param(
            make_spec(),
            make_plan(8, [8, 8], 6000),
            None,
            ValueError,
            "listed twice",
            id="preferred-duplicate",
        ),
        pytest.param(
            make_spec(),
            make_plan(8, [8], 0),
            None,
            ValueError,
            "plan.maxQueueDelayMicroseconds=0 must be >= 1",
            id="c03-zero-delay",
        ),
        pytest.param(
            make_spec({"stateful": True, "sequenceStrategy": "Direct"}),
            make_plan(8, [], 6000, minimumSlotUtilization=0.0),
            None,
            ValueError,
            "plan.minimumSlotUtilization=0.0 must be in",
            id="c06-direct-zero-utilization",
        ),
        pytest.param(
            make_spec(batching={"maxBatchSize": 4}),
            make_plan(8, [8], 6000),
            None,
            ValueError,
            "plan.maxBatchSize=8 exceeds spec.batching.maxBatchSize=4",
            id="plan-above-memory-cap",
        ),
        pytest.param(
            make_spec({"platform": "onnxruntime_onnx"}),
            make_plan(8, [8], 6000),
            None,
            SpecError,
            "spec.model.backend: exactly one of backend or spec.model.platform must be set; both are set",
            id="backend-and-platform",
        ),
        pytest.param(
            make_spec({"inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [-1], "includesBatchDim": True}]}),
            make_plan(8, [8], 6000),
            None,
            SpecError,
            r"spec.model.inputs\[0\].dims=\[-1\] holds only the batch axis",
            id="dims-only-batch-axis",
        ),
        pytest.param(
            make_spec({"inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [-1, 3, 512, 864], "rank": 4}]}),
            make_plan(16, [16], 6000),
            None,
            SpecError,
            r"spec.model.inputs\[0\].dims=\[-1, 3, 512, 864\] renders 4 dims but model rank is 4",
            id="c02-rank-contradiction",
        ),
        pytest.param(
            make_spec({"outputs": [{"name": "y", "dataType": "TYPE_FP32", "dims": [3, 4], "rank": 3}]}),
            make_plan(0),
            None,
            SpecError,
            r"spec.model.outputs\[0\].dims=\[3, 4\] renders 2 dims but model rank is 3 and batching is off",
            id="rank-batching-off-needs-full-shape",
        ),
        pytest.param(
            make_spec({"inputs": [{"name": "ids", "dataType": "TYPE_INT64", "dims": [-1], "allowRaggedBatch": True}]}),
            make_plan(8, [8], 6000),
            None,
            SpecError,
            r"spec.model.inputs\[0\].allowRaggedBatch: ragged batching requires batch_input entries",
            id="c07-ragged-without-batch-inputs",
        ),
    ],
)
def test_errors(spec: BatchedModelSpec, plan: PlanStatus, kind: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        render_model_config(spec, plan, instance_kind=kind)


def test_spec_error_is_a_value_error_with_field_paths() -> None:
    spec = make_spec({"inputs": [{"name": "ids", "dataType": "TYPE_INT64", "dims": [-1], "allowRaggedBatch": True}]})
    with pytest.raises(SpecError) as info:
        build_model_config(spec, make_plan(8, [8], 6000))
    assert isinstance(info.value, ValueError)
    assert [p.path for p in info.value.problems] == ["spec.model.inputs[0].allowRaggedBatch"]


def test_ragged_flag_dropped_when_batching_off() -> None:
    # allow_ragged_batch is never written with max_batch_size 0; the batch inputs the model reads stay
    # (docs/field-cases.md#variable-length-inputs).
    spec, _, _ = GOLDEN_CASES["ragged_batch_inputs"]
    text = render_model_config(spec, make_plan(0))
    assert "allow_ragged_batch" not in text
    assert text.count("batch_input {") == 2
    assert "max_batch_size: 0\n" in text


# --- hash and round trip -------------------------------------------------------------------------------


def test_config_hash_exact() -> None:
    assert config_hash("") == "e3b0c44298fc1c14"  # sha256 of no bytes
    assert config_hash(SEED_TEXT) == hashlib.sha256(SEED_TEXT.encode()).hexdigest()[:16]
    assert re.fullmatch(r"[0-9a-f]{16}", config_hash(SEED_TEXT))
    other = render_model_config(make_spec(), make_plan(8, [8], 6001))
    assert config_hash(other) != config_hash(SEED_TEXT)


def test_equal_specs_render_byte_identical() -> None:
    a = render_model_config(make_spec(), SEED_PLAN)
    b = render_model_config(make_spec(), SEED_PLAN.model_copy(deep=True))
    assert a == b
    assert config_hash(a) == config_hash(b)


def test_build_is_not_printed_zero_but_text_is() -> None:
    """proto3 drops max_batch_size 0 in plain printing; render_model_config does not."""
    spec, plan, _ = GOLDEN_CASES["batching_off"]
    cfg = build_model_config(spec, plan)
    assert "max_batch_size" not in text_format.MessageToString(cfg)
    assert "max_batch_size: 0\n" in render_model_config(spec, plan)


# --- property test -------------------------------------------------------------------------------------


@st.composite
def specs_and_plans(draw: st.DrawFn) -> tuple[BatchedModelSpec, PlanStatus, InstanceKind | None]:
    mbs = draw(st.one_of(st.just(0), st.integers(1, 128)))
    stateful = draw(st.booleans())
    strategy = draw(st.sampled_from(["Oldest", "Direct"]))
    direct = stateful and strategy == "Direct"
    preferred: list[int] = []
    if mbs > 0 and not direct:
        preferred = draw(st.lists(st.integers(1, mbs), unique=True, max_size=min(mbs, 6)))
    delay = draw(st.integers(1, 3_600_000)) if mbs > 0 else draw(st.sampled_from([0, 250]))
    utilization = draw(st.one_of(st.none(), st.floats(min_value=0.01, max_value=1.0)))
    gpus = draw(st.integers(0, 8))
    kinds: list[InstanceKind | None] = [None, "KIND_CPU"]
    if gpus > 0:
        kinds.append("KIND_GPU")
    kind = draw(st.sampled_from(kinds))
    # spec.batching.maxBatchSize: a cap >= the plan's size, or 0 (batching off, as the policy plans it today),
    # or unset with a plan of 0 (batching off by the plan alone: the renderer must cope with that too).
    cap = draw(st.one_of(st.none(), st.integers(mbs, mbs + 64))) if mbs > 0 else draw(st.sampled_from([0, None]))

    def tensors(prefix: str, n: int, inputs: bool) -> list[dict[str, Any]]:
        out = []
        for i in range(n):
            sample = draw(st.lists(st.one_of(st.just(-1), st.integers(1, 4096)), min_size=1, max_size=4))
            marked = draw(st.booleans())
            dims = [draw(st.sampled_from([-1, 1, 16])), *sample] if marked else sample
            t: dict[str, Any] = {
                "name": f"{prefix}{i}",
                "dataType": draw(st.sampled_from(["TYPE_FP32", "TYPE_INT64"])),
            }
            t |= {"dims": dims, "includesBatchDim": marked}
            if draw(st.booleans()):  # declare the true rank, consistent with the spec and the plan
                if marked or mbs > 0:
                    t["rank"] = len(sample) + 1
                elif cap == 0:
                    t["rank"] = len(sample)
                # unmarked dims with batching off by the plan alone: a declared rank would contradict
                # either check_spec (which assumes batching) or the rendered full shape, so none
            if inputs and cap != 0 and draw(st.booleans()):
                t["allowRaggedBatch"] = True
            out.append(t)
        return out

    inputs = tensors("IN_", draw(st.integers(1, 4)), True)
    outputs = tensors("OUT_", draw(st.integers(1, 3)), False)
    batch_inputs = [
        {
            "kind": draw(
                st.sampled_from(["BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_ITEM_SHAPE"])
            ),
            "targetName": f"BI_{k}",
            "dataType": draw(st.sampled_from(["TYPE_INT32", "TYPE_FP32"])),
            "sourceInputs": [draw(st.sampled_from([t["name"] for t in inputs]))],
        }
        for k in range(draw(st.integers(0, 2)))
    ]
    if any(t.get("allowRaggedBatch") for t in inputs) and not batch_inputs:
        batch_inputs = [
            {
                "kind": "BATCH_ELEMENT_COUNT",
                "targetName": "BI_0",
                "dataType": "TYPE_INT32",
                "sourceInputs": ["IN_0"],
            }
        ]
    engine = draw(
        st.sampled_from([{"backend": "onnxruntime"}, {"backend": "python"}, {"platform": "onnxruntime_onnx"}])
    )
    model = {
        "name": "m",
        "backend": None,
        **engine,
        "stateful": stateful,
        "sequenceStrategy": strategy,
        "inputs": inputs,
        "outputs": outputs,
        "batchInputs": batch_inputs,
    }
    spec = make_spec(model, triton={"gpusPerReplica": gpus}, batching={"maxBatchSize": cap})
    plan = make_plan(mbs, preferred, delay, draw(st.integers(1, 8)), minimumSlotUtilization=utilization)
    return spec, plan, kind


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs_and_plans())
def test_property_rendered_config_is_valid(
    case: tuple[BatchedModelSpec, PlanStatus, InstanceKind | None],
) -> None:
    spec, plan, kind = case
    assert check_spec(spec) == []  # the generator only makes specs the operator accepts
    mbs = plan.maxBatchSize
    text = render_model_config(spec, plan, instance_kind=kind)
    cfg = parse(text)

    assert cfg == build_model_config(spec, plan, instance_kind=kind)
    assert text == render_model_config(spec, plan, instance_kind=kind)
    assert re.findall(r"^max_batch_size: (\d+)$", text, re.MULTILINE) == [str(mbs)]
    assert cfg.max_batch_size == mbs

    scheduler = cfg.WhichOneof("scheduling_choice")
    assert not (cfg.HasField("dynamic_batching") and cfg.HasField("sequence_batching"))
    assert text.count("dynamic_batching {") + text.count("sequence_batching {") <= 1
    preferred: list[int] = []
    if spec.model.stateful:
        assert scheduler == "sequence_batching"
        strategy = cfg.sequence_batching.WhichOneof("strategy_choice")
        assert strategy == spec.model.sequenceStrategy.value.lower()
        if strategy == "oldest":
            preferred = list(cfg.sequence_batching.oldest.preferred_batch_size)
            assert cfg.sequence_batching.oldest.max_candidate_sequences == max(1, mbs)
        else:
            assert "preferred_batch_size" not in text
            assert 0 < cfg.sequence_batching.direct.minimum_slot_utilization <= 1
    elif mbs > 0:
        assert scheduler == "dynamic_batching"
        preferred = list(cfg.dynamic_batching.preferred_batch_size)
        assert cfg.dynamic_batching.max_queue_delay_microseconds == plan.maxQueueDelayMicroseconds >= 1
    else:
        assert scheduler is None
    assert all(1 <= p <= mbs for p in preferred)
    if mbs == 0:
        assert "preferred_batch_size" not in text
        assert "allow_ragged_batch" not in text
        assert "max_queue_delay_microseconds" not in text

    for given_tensors, rendered in ((spec.model.inputs, cfg.input), (spec.model.outputs, cfg.output)):
        assert [r.name for r in rendered] == [t.name for t in given_tensors]
        for t, r in zip(given_tensors, rendered, strict=True):
            expected = t.dims[1:] if (mbs > 0 and t.includesBatchDim) else t.dims
            assert list(r.dims) == expected
            assert len(r.dims) >= 1
    for t, r in zip(spec.model.inputs, cfg.input, strict=True):
        assert r.allow_ragged_batch == (t.allowRaggedBatch and mbs > 0)
    assert len(cfg.batch_input) == len(spec.model.batchInputs)

    assert len(cfg.instance_group) == 1
    group = cfg.instance_group[0]
    want_kind = kind or ("KIND_GPU" if spec.triton.gpusPerReplica > 0 else "KIND_CPU")
    assert mc.ModelInstanceGroup.Kind.Name(group.kind) == want_kind
    if want_kind == "KIND_GPU":
        assert spec.triton.gpusPerReplica > 0
        assert group.count == plan.instanceCount
    else:
        assert group.count == plan.instanceCount * max(1, spec.triton.gpusPerReplica)
    assert list(group.gpus) == []
    assert re.fullmatch(r"[0-9a-f]{16}", config_hash(text))


# --- layering ------------------------------------------------------------------------------------------

FORBIDDEN_IN_RENDER = (
    "kopf",
    "kubernetes",
    "prometheus_api_client",
    "prometheus_client",
    "requests",
    "urllib3",
    "subprocess",
    "socket",
    "batchfill.adapters",
    "batchfill.controller",  # a package stands for all its modules (matched by prefix below)
    "batchfill.testbed",
    "batchfill.cli",
)


def test_render_imports_only_the_triton_schema() -> None:
    """Same rule as the import-linter contract, checked on the source so it holds without lint-imports."""
    package = Path(batchfill.render.__file__).parent
    seen: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                seen.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                seen.add(node.module)
                seen.update(f"{node.module}.{alias.name}" for alias in node.names)
    bad = sorted(m for m in seen if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_IN_RENDER))
    assert bad == []
    triton = sorted(m for m in seen if m.split(".")[0] == "tritonclient")
    assert triton == ["tritonclient.grpc.model_config_pb2"]


# --- api/validate.py checks added with the renderer ----------------------------------------------------


@pytest.mark.parametrize(
    ("model", "path", "message"),
    [
        pytest.param(
            {"platform": "onnxruntime_onnx"},
            "spec.model.backend",
            "exactly one of backend or spec.model.platform must be set",
            id="backend-and-platform",
        ),
        pytest.param(
            {"backend": None},
            "spec.model.backend",
            "exactly one of backend or spec.model.platform must be set",
            id="neither-backend-nor-platform",
        ),
        pytest.param(
            {
                "inputs": [
                    {"name": "a", "dataType": "TYPE_INT64", "dims": [-1]},
                    {"name": "b", "dataType": "TYPE_INT64", "dims": [-1]},
                ],
                "batchInputs": [
                    {
                        "kind": "BATCH_ELEMENT_COUNT",
                        "targetName": "N",
                        "dataType": "TYPE_INT32",
                        "sourceInputs": ["a", "b"],
                    }
                ],
            },
            "spec.model.batchInputs[0].sourceInputs",
            "=['a', 'b']: Triton expects exactly 1 source input for kind BATCH_ELEMENT_COUNT",
            id="batch-input-two-sources",
        ),
        pytest.param(
            {
                "inputs": [{"name": "a", "dataType": "TYPE_INT64", "dims": [-1]}],
                "batchInputs": [
                    {
                        "kind": "BATCH_ELEMENT_COUNT",
                        "targetName": "N",
                        "dataType": "TYPE_INT64",
                        "sourceInputs": ["a"],
                    }
                ],
            },
            "spec.model.batchInputs[0].dataType",
            "=TYPE_INT64 must be TYPE_INT32 or TYPE_FP32",
            id="batch-input-data-type",
        ),
    ],
)
def test_check_spec_rejects_what_triton_rejects(model: dict[str, Any], path: str, message: str) -> None:
    problems = check_spec(make_spec(model))
    assert [(p.path, p.message) for p in problems] == [(path, message)]


def test_config_on_cpu_and_with_parameters_keep_everything_else() -> None:
    import tritonclient.grpc.model_config_pb2 as pb
    from google.protobuf import text_format

    from batchfill.render import config_on_cpu, config_with_parameters

    gpu = 'name: "m"\nmax_batch_size: 4\ndynamic_batching {\n  preferred_batch_size: [1, 2, 3, 4]\n}\n' \
          'instance_group {\n  count: 2\n  kind: KIND_GPU\n  gpus: [0]\n}\n'  # fmt: skip
    cpu = text_format.Parse(config_on_cpu(gpu), pb.ModelConfig())
    assert [(g.kind, list(g.gpus), g.count) for g in cpu.instance_group] == [(pb.ModelInstanceGroup.KIND_CPU, [], 2)]
    assert list(cpu.dynamic_batching.preferred_batch_size) == [1, 2, 3, 4]
    assert "max_batch_size: 4" in config_on_cpu(gpu)
    text = config_with_parameters(config_on_cpu(gpu), {"beta_ms": "2", "alpha_ms": "10"})
    parsed = text_format.Parse(text, pb.ModelConfig())
    assert {k: v.string_value for k, v in parsed.parameters.items()} == {"alpha_ms": "10", "beta_ms": "2"}
    parsed.ClearField("parameters")
    assert parsed == cpu
    assert text.index('key: "alpha_ms"') < text.index('key: "beta_ms"')  # deterministic order
