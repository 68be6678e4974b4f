"""spec.model.warmup rendered as Triton's ``model_warmup`` (render/warmup.py): which batch sizes, what inputs, and
the specs it cannot warm up named by field. tests/component/test_pool_models_real.py has the real Triton run it."""

from __future__ import annotations

from typing import Any

import pytest
import tritonclient.grpc.model_config_pb2 as mc
from google.protobuf import text_format

from batchfill.api.errors import SpecError
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.validate import check_spec
from batchfill.render import render_model_config
from batchfill.render.warmup import warmup_batch_sizes

from .test_render_model_config import SEED_PLAN, make_plan, make_spec


def warmups(spec: BatchedModelSpec, mbs: int = 8) -> list[Any]:
    plan = SEED_PLAN if mbs == 8 else make_plan(mbs, [mbs] if mbs else [], 1000 if mbs else 0)
    return list(text_format.Parse(render_model_config(spec, plan), mc.ModelConfig()).model_warmup)


@pytest.mark.parametrize(
    ("requested", "mbs", "expected"),
    [([], 8, [1, 8]), ([], 1, [1]), ([4, 2, 4], 8, [2, 4]), ([16, 3], 8, [3, 8]), ([5], 0, [1]), ([], 0, [1])],
)
def test_batch_sizes_default_to_one_and_the_planned_maximum_capped_at_it(
    requested: list[int], mbs: int, expected: list[int]
) -> None:
    assert warmup_batch_sizes(requested, mbs) == expected


def test_no_warmup_renders_no_model_warmup() -> None:
    assert warmups(make_spec()) == []


def test_each_batch_size_is_one_request_of_every_input_run_count_times() -> None:
    spec = make_spec(
        {
            "inputs": [
                {"name": "INPUT__0", "dataType": "TYPE_FP32", "dims": [3, 224, 224]},
                {"name": "MASK", "dataType": "TYPE_BOOL", "dims": [-1, 7], "includesBatchDim": True},
            ],
            "warmup": {"count": 3},
        }
    )
    got = warmups(spec)
    assert [(w.name, w.batch_size, w.count) for w in got] == [("batch_1", 1, 3), ("batch_8", 8, 3)]
    for w in got:
        assert {k: (mc.DataType.Name(v.data_type), list(v.dims), v.zero_data) for k, v in w.inputs.items()} == {
            "INPUT__0": ("TYPE_FP32", [3, 224, 224], True),
            "MASK": ("TYPE_BOOL", [7], True),  # the batch axis is the batch_size, as in the input's dims
        }


def test_random_data_and_batching_off() -> None:
    spec = make_spec({"warmup": {"data": "Random", "batchSizes": [4]}})
    (w,) = warmups(spec, mbs=0)
    assert (w.batch_size, w.count) == (1, 1)
    assert w.inputs["INPUT__0"].WhichOneof("input_data_type") == "random_data"
    assert list(w.inputs["INPUT__0"].dims) == [3, 224, 224]


@pytest.mark.parametrize(
    ("model", "field", "words"),
    [
        ({"inputs": [], "warmup": {}}, "spec.model.warmup", "set spec.model.inputs"),
        (
            {"inputs": [{"name": "ids", "dataType": "TYPE_INT64", "dims": [-1]}], "warmup": {}},
            "spec.model.inputs[0].dims",
            "=[-1] has a variable (-1) dim",
        ),
    ],
)
def test_a_spec_it_cannot_warm_up_is_named_by_field(model: dict[str, Any], field: str, words: str) -> None:
    """check_spec says so before any plan (``batchfill plan``, the operator's ConfigValid), the renderer too."""
    assert [(p.path, words in p.message) for p in check_spec(make_spec(model))] == [(field, True)]
    with pytest.raises(SpecError) as e:
        render_model_config(make_spec(model), SEED_PLAN)
    assert [(p.path, words in p.message) for p in e.value.problems] == [(field, True)]


def test_a_batch_axis_in_dims_is_not_a_variable_dim_to_warm_up() -> None:
    model = {"inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [-1, 4], "includesBatchDim": True}]}
    assert check_spec(make_spec({**model, "warmup": {}})) == []
    off = make_spec({**model, "warmup": {}}, batching={"maxBatchSize": 0})
    assert [p.path for p in check_spec(off)] == ["spec.model.inputs[0].dims"]  # off: -1 is part of the shape


def test_the_crd_bounds_warmup() -> None:
    for bad in ({"count": 0}, {"count": 101}, {"batchSizes": [0]}, {"batchSizes": list(range(1, 10))}, {"x": 1}):
        with pytest.raises(ValueError, match="warmup"):
            make_spec({"warmup": bad})
