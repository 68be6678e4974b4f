"""The planner against the plans the pure-Python batcher made: the compiled batcher must not change any plan.

``golden/plans_before_numba.json`` holds 46 specs (the two examples and 44 drawn by benchmarks/plan_specs.py with
seed 11: profile shapes, noise, SLAs, network overheads, batch limits, overrides, GPUs per replica, Direct
sequences, batching off) with the seed each is planned with and what the planner of commit 099221c (which
benchmarks/plan_baseline.py loads from git history) chose: max batch size, preferred sizes and queue delay,
capacity at SLA, or the error.
Generated once from that planner; a change that moves any plan fails here.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from batchfill.api.errors import InfeasibleSLAError, SpecError
from batchfill.api.validate import load_model
from batchfill.policy.plan import plan_batching

GOLDEN = json.loads((Path(__file__).parent / "golden" / "plans_before_numba.json").read_text())
CAPACITY_TOLERANCE = 0.01


def test_the_golden_set_covers_the_shapes_it_is_meant_to() -> None:
    expected = [case["expected"] for case in GOLDEN]
    plans = [e for e in expected if "error" not in e]
    assert len(GOLDEN) == 46
    assert any("error" in e for e in expected)
    assert any(e["maxBatchSize"] == 0 for e in plans)  # batching off
    assert any(e["preferredBatchSizes"] == [] and e["maxBatchSize"] > 0 for e in plans)  # Direct sequences
    assert any(e["maxQueueDelayMicroseconds"] > 10_000 for e in plans)  # a held batch (seed rule or override)
    assert any(e["maxBatchSize"] >= 64 for e in plans)
    assert {case["seed"] for case in GOLDEN} == {0, 1, 2}


@pytest.mark.parametrize("case", GOLDEN, ids=[case["spec"]["model"]["name"] for case in GOLDEN])
def test_plan_equals_the_pure_python_planners(case: dict[str, Any]) -> None:
    spec = load_model({"apiVersion": "batchfill.io/v1alpha1", "kind": "BatchedModel", "spec": case["spec"]}).spec
    expected = case["expected"]
    if "error" in expected:
        with pytest.raises((SpecError, InfeasibleSLAError)) as err:
            plan_batching(spec, seed=case["seed"])
        assert type(err.value).__name__ == expected["error"]
        assert str(err.value) == expected["message"]
        return
    chosen = plan_batching(spec, seed=case["seed"]).chosen
    assert chosen.max_batch_size == expected["maxBatchSize"]
    assert list(chosen.preferred_batch_sizes) == expected["preferredBatchSizes"]
    assert chosen.max_queue_delay_us == expected["maxQueueDelayMicroseconds"]
    assert math.isclose(chosen.capacity_rps, expected["capacityPerReplicaRps"], rel_tol=CAPACITY_TOLERANCE)


def test_plans_take_tens_of_milliseconds() -> None:
    """The throughput the compiled batcher buys, in CPU time (so a loaded machine does not fail it): the first
    20 plans of the set took 0.18 s of CPU a spec with the pure-Python batcher and 0.007 s compiled; 0.05 s leaves
    a margin of 7 for slower machines and fails if the simulation falls back to Python."""
    specs = [
        load_model({"apiVersion": "batchfill.io/v1alpha1", "kind": "BatchedModel", "spec": c["spec"]}).spec
        for c in GOLDEN
        if "error" not in c["expected"]
    ][:20]
    plan_batching(specs[0])  # the first plan of a process loads (or compiles) the batcher
    t0 = time.process_time()
    for spec in specs:
        plan_batching(spec)
    assert (time.process_time() - t0) / len(specs) < 0.05
