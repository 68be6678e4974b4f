"""Property tests: any spec either plans with every invariant holding or fails with field-named problems."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from google.protobuf import text_format
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2

from batchfill.api.errors import SpecError
from batchfill.api.validate import load_model
from batchfill.policy.plan import plan_batching
from batchfill.policy.profile import LatencyProfile
from batchfill.render import render_model_config

FIELD_ROOTS = ("spec.", "spec:", "metadata", "kind", "apiVersion")


@st.composite
def profiles(draw: st.DrawFn) -> list[dict[str, Any]]:
    sizes = sorted(draw(st.sets(st.integers(1, 256), min_size=1, max_size=8)))
    alpha = draw(st.floats(0.2, 80))
    beta = draw(st.floats(0.01, 10))
    noise = draw(st.lists(st.floats(0.8, 1.2), min_size=len(sizes), max_size=len(sizes)))
    return [{"batchSize": b, "latencyMs": round((alpha + beta * b) * f, 3)} for b, f in zip(sizes, noise, strict=True)]


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly plannable specs (the SLA is drawn relative to the profile), with invalid values mixed in."""
    profile = draw(profiles())
    overhead = draw(st.floats(0, 50))
    # factor < 1 makes the SLA infeasible on purpose (about one case in eight)
    sla = profile[0]["latencyMs"] * draw(st.floats(0.8, 12)) + overhead * draw(st.sampled_from([1.0, 1.0, 1.2]))
    batching: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        batching["maxBatchSize"] = draw(st.integers(-1, 300))
    if draw(st.integers(0, 5)) == 0:
        batching["preferredBatchSizes"] = draw(st.lists(st.integers(-1, 300), min_size=1, max_size=3))
    if draw(st.integers(0, 5)) == 0:
        batching["maxQueueDelayMicroseconds"] = draw(st.integers(-10, 3_000_000))
    spec: dict[str, Any] = {
        "model": {
            "name": "m",
            "backend": "python",
            "stateful": draw(st.integers(0, 4)) == 0,
            "sequenceStrategy": draw(st.sampled_from(["Oldest", "Direct"])),
            "inputs": [
                {
                    "name": "x",
                    "dataType": "TYPE_FP32",
                    "dims": draw(st.lists(st.sampled_from([-1, 1, 3, 8]), min_size=1, max_size=3)),
                    "includesBatchDim": draw(st.integers(0, 4)) == 0,
                }
            ],
        },
        "sla": {"latencyP99Ms": sla, "networkOverheadMs": overhead},
        "profile": profile,
        "batching": batching,
        "triton": {"gpusPerReplica": draw(st.sampled_from([0, 1, 1, 2, 4, -1]))},
    }
    return {"spec": spec}


# No shrink phase: a failing case is reported as generated (shrinking planner runs takes minutes). The
# examples also depend on which modules are imported (Hypothesis mines their constants), so every failure this
# test ever found is kept below as an explicit example.
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
)
@given(specs())
@example(  # batching off, l(1) close to T: a tiny capacity that once rounded to 0
    {
        "spec": {
            "model": {"name": "m", "backend": "python", "stateful": True},
            "sla": {"latencyP99Ms": 417.8, "networkOverheadMs": 49.0},
            "profile": [{"batchSize": 31, "latencyMs": 359.0}],
            "batching": {"maxBatchSize": 0},
        }
    }
)
@example(  # p99 within the budget but rounded above it (3.38 > 3.375)
    {
        "spec": {
            "model": {"name": "m", "backend": "python"},
            "sla": {"latencyP99Ms": 3.375},
            "profile": [{"batchSize": 2, "latencyMs": 3.0}],
            "triton": {"gpusPerReplica": 0},
        }
    }
)
def test_any_spec_plans_with_invariants_or_fails_with_field_named_errors(doc: dict[str, Any]) -> None:
    check_plan_or_field_errors(doc)


def seeded_spec(seed: int) -> dict[str, Any]:
    """A plannable random spec from a seeded generator: independent of what Hypothesis mines from modules."""
    rng = np.random.default_rng(seed)
    sizes = sorted({int(x) for x in rng.integers(1, 257, size=int(rng.integers(1, 9)))})
    alpha, beta = float(rng.uniform(0.2, 80)), float(rng.uniform(0.01, 10))
    profile = [
        {"batchSize": b, "latencyMs": round((alpha + beta * b) * float(rng.uniform(0.9, 1.1)), 3)} for b in sizes
    ]
    overhead = float(rng.uniform(0, 50))
    sla = profile[0]["latencyMs"] * float(rng.uniform(1.3, 12)) + overhead
    return {
        "spec": {
            "model": {"name": "m", "backend": "python", "stateful": bool(rng.integers(0, 4) == 0)},
            "sla": {"latencyP99Ms": round(sla, 3), "networkOverheadMs": round(overhead, 3)},
            "profile": profile,
            "triton": {"gpusPerReplica": int(rng.integers(0, 3))},
        }
    }


def test_seeded_random_specs_plan_with_every_invariant() -> None:
    planned = sum(check_plan_or_field_errors(seeded_spec(seed)) for seed in range(25))
    assert planned >= 20, f"only {planned} of 25 plannable specs planned"


def check_plan_or_field_errors(doc: dict[str, Any]) -> bool:
    """Plan ``doc`` and check every invariant (True), or check its errors are field-named (False)."""
    try:
        bm = load_model(doc)
        result = plan_batching(bm.spec)
    except SpecError as err:
        problems = err.problems
        bm = None
    if bm is None:
        assert problems
        for p in problems:
            assert p.path.startswith(FIELD_ROOTS), p
            assert p.message
        return False
    spec, status = bm.spec, result.to_status()
    profile = LatencyProfile.from_points(spec.profile or [])
    B, D = status.maxBatchSize, status.maxQueueDelayMicroseconds
    T = spec.sla.latencyP99Ms - spec.sla.networkOverheadMs
    assert 0 <= B <= profile.largest
    if spec.batching.maxBatchSize is not None:
        assert spec.batching.maxBatchSize >= B
    assert all(1 <= p <= B for p in status.preferredBatchSizes)
    if B > 0:
        assert D >= 1
        assert profile.latency_ms(B) * 1000 + D <= T * 1000 + 1e-6
    assert status.capacityPerReplicaRps > 0
    assert status.predictedP99Ms <= T + 1e-9
    assert status.minClientTimeoutMs >= status.predictedP99Ms - 1e-9
    # JSON has no NaN: status must serialize strictly
    json.dumps(status.model_dump(mode="json"), allow_nan=False)
    assert all(math.isfinite(x) for x in (status.capacityPerReplicaRps, status.predictedP99Ms))
    # The rendered config: explicit max_batch_size, never both schedulers, preferred within [1, B].
    text = render_model_config(spec, status)
    assert any(line.startswith("max_batch_size:") for line in text.splitlines())
    cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert cfg.max_batch_size == B
    assert not (cfg.HasField("dynamic_batching") and cfg.HasField("sequence_batching"))
    if B == 0:
        assert not cfg.HasField("dynamic_batching")
    if cfg.HasField("dynamic_batching"):
        assert all(1 <= p <= B for p in cfg.dynamic_batching.preferred_batch_size)
        assert cfg.dynamic_batching.max_queue_delay_microseconds == D
    return True
