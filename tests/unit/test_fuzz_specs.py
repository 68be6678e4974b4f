"""Bad input, pure level: any spec plans to a finite, JSON-safe status or fails with ``spec.``-named problems.

The specs come from :mod:`tests.fuzz_specs` (near-valid specs with wrong types, huge and tiny numbers, missing
and unknown fields, long strings, reordered or duplicated profiles). Besides the plan, the status the operator
would write for the spec (:func:`~batchfill.controller.status.desired_status` or
:func:`~batchfill.controller.status.rejection_status`) must pass the status schema, which is the CRD's: a
message over the API server's 32 KiB limit on a condition would make the status write fail (and the handler retry
forever).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings

from batchfill.api.errors import SpecError
from batchfill.api.reasons import ConditionType
from batchfill.api.status import BatchedModelStatus
from batchfill.controller.desired import desired_state
from batchfill.controller.status import desired_status, rejection_status

from ..fuzz_specs import MIB, RICH_SPEC, SEED_SPEC, fuzzed_specs, numbers, sample_specs

# NaN that appears inside the planner's arithmetic is a bug even when it does not reach the status
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
NOW = 1_700_000_000.0
#: Examples per run: the derandomized run takes about a minute on the 2-core CI machine (most specs are
#: rejected in microseconds; a plannable one runs the planner's simulation, ~0.1-0.4 s, cached by spec).
EXAMPLES = 3000


def check_plan_or_field_named_rejection(spec: dict[str, Any]) -> str:
    """The property. Returns "planned" or "rejected" (for statistics)."""
    body = {"metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 3}, "spec": spec}
    error: SpecError | None = None
    try:
        desired = desired_state(spec)
    except SpecError as err:
        error = err
    if error is not None:
        assert error.problems
        for p in error.problems:
            assert p.path.startswith("spec."), f"problem not named by a spec field: {p}"
            assert p.message, p
        status = rejection_status(error, {}, 3, NOW)
        text = json.dumps(status, allow_nan=False)
        BatchedModelStatus.model_validate_json(text)  # the CRD's status schema: the API server would take it
        planned = next(c for c in status["conditions"] if c["type"] == ConditionType.PLANNED)
        assert planned["status"] == "False"
        assert "spec." in planned["message"]
        return "rejected"
    plan = desired.plan_status.model_dump(mode="json")
    json.dumps(plan, allow_nan=False)
    assert all(math.isfinite(x) for x in numbers(plan)), plan
    assert desired.config
    assert desired.config_hash
    status = desired_status(body, desired, None, now=NOW)
    BatchedModelStatus.model_validate_json(json.dumps(status, allow_nan=False))
    assert all(math.isfinite(x) for x in numbers(status))
    return "planned"


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(fuzzed_specs(json_only=False))
@example(SEED_SPEC)
@example(RICH_SPEC)
@example({**SEED_SPEC, "sla": {"latencyP99Ms": 1e308, "networkOverheadMs": -0.0}})
@example({**SEED_SPEC, "sla": {"latencyP99Ms": math.nan}})
@example({**SEED_SPEC, "sla": {"latencyP99Ms": -100, "networkOverheadMs": -10}})
@example({**SEED_SPEC, "profile": [{"batchSize": 2**63, "latencyMs": 10}]})
@example({**SEED_SPEC, "profile": [*reversed(SEED_SPEC["profile"])]})
@example({**SEED_SPEC, "profile": [SEED_SPEC["profile"][0], *SEED_SPEC["profile"]]})
@example({**SEED_SPEC, "profile": []})
@example({**SEED_SPEC, "model": {**SEED_SPEC["model"], "name": "m" * MIB}})
@example({**SEED_SPEC, "description": "d" * MIB})
# found by this test: each failed before the fix named in its comment
@example(  # a condition message over 32 KiB (api/errors.py: problems clipped and counted)
    {
        **SEED_SPEC,
        "model": {
            **SEED_SPEC["model"],
            "inputs": [{"name": "n" * 253, "dataType": "TYPE_FP32", "dims": [1]}] * 64,
            "outputs": [{"name": "n" * 253, "dataType": "TYPE_FP32", "dims": [1]}] * 64,
        },
    }
)
@example({**SEED_SPEC, "triton": {"resources": {"requests": {"nvidia.com/gpu": "7" * 100_000}}}})  # same
@example({**SEED_SPEC, "triton": {"resources": {"limits": {"nvidia.com/gpu": 10**400}}}})  # OverflowError
@example(  # capacity overflowed to inf: ValidationError of PlanStatus (policy/plan.py: latency floor)
    {**SEED_SPEC, "profile": [{"batchSize": 1, "latencyMs": 5e-324}, {"batchSize": 8, "latencyMs": 1e-300}]}
)
@example({**SEED_SPEC, "scaling": {"targetUtilization": 5e-324}})  # inf - inf in the simulation (mean_fill)
def test_fuzzed_spec_plans_finitely_or_is_rejected_with_spec_fields(spec: dict[str, Any]) -> None:
    event(check_plan_or_field_named_rejection(spec))


def test_the_fuzzed_specs_are_mostly_near_valid() -> None:
    """The generator is worth running: both outcomes are common and the specs differ."""
    specs = sample_specs(60, json_only=False)
    assert len(specs) == 60
    outcomes = Counter(check_plan_or_field_named_rejection(s) for s in specs)
    assert outcomes["planned"] >= 5, outcomes
    assert outcomes["rejected"] >= 20, outcomes


@pytest.mark.parametrize("key", [1, None, 2.5])
def test_non_string_keys_from_yaml_are_rejected_by_field(key: Any) -> None:
    """YAML allows ``1: x`` as a key; JSON does not, so this reaches only ``batchfill plan``-style callers."""
    from batchfill.api.validate import load_model

    with pytest.raises(SpecError) as info:
        load_model({"spec": {**SEED_SPEC, key: "x"}})
    assert all(p.path.startswith("spec") for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("triton", "path"),
    [
        ({"nodeSelector": {"zone": "a b/c"}}, "spec.triton.nodeSelector[zone]"),
        ({"nodeSelector": {"Bad_Prefix/zone": "a"}}, "spec.triton.nodeSelector[Bad_Prefix/zone]"),
        ({"resources": {"requests": {"cpu": "abc"}}}, "spec.triton.resources.requests[cpu]"),
        ({"resources": {"requests": {"memory": -1}}}, "spec.triton.resources.requests[memory]"),
        ({"resources": {"requests": {"gpus": "1"}}}, "spec.triton.resources.requests[gpus]"),
        ({"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}}, "spec.triton.resources.requests[cpu]"),
        ({"resources": {"limits": {"example.com/fpga": "1.5"}}}, "spec.triton.resources.limits[example.com/fpga]"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "spec.triton.tolerations[0].operator"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]}, "spec.triton.tolerations[0].value"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "spec.triton.tolerations[0].tolerationSeconds"),
    ],
)
def test_pod_values_the_api_server_would_refuse_in_the_deployment_are_named(triton: dict[str, Any], path: str) -> None:
    """Found by the cluster test: the CRD took these, the Deployment apply failed, and no condition said why."""
    with pytest.raises(SpecError) as info:
        desired_state({**SEED_SPEC, "triton": triton})
    assert path in [p.path for p in info.value.problems], info.value.problems


@pytest.mark.parametrize(
    "triton",
    [
        {"nodeSelector": {"kubernetes.io/os": "linux", "pool": ""}},
        {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": 2, "memory": "1.5e9"}}},
        {"resources": {"requests": {"example.com/fpga": 1}, "limits": {"example.com/fpga": "1"}}},
        {
            "tolerations": [
                {"operator": "Exists"},
                {"key": "k", "value": "v", "effect": "NoExecute", "tolerationSeconds": 1},
            ]
        },
    ],
)
def test_valid_pod_values_still_plan(triton: dict[str, Any]) -> None:
    assert desired_state({**SEED_SPEC, "triton": triton}).plan_status.maxBatchSize > 0
