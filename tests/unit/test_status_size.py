"""What one BatchedModel puts into the cluster is bounded: its status and its rendered config.pbtxt stay small for the
largest spec the API accepts and for a model Triton measured at thousands of batch sizes, and huge lists in a file
are refused by field before anything is planned."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchfill.api.spec import PROFILE_POINTS_MAX, BatchedModelSpec
from batchfill.api.status import BatchedModelStatus
from batchfill.cli.main import main
from batchfill.controller.desired import desired_state
from batchfill.controller.profiling import profile_tick
from batchfill.controller.status import desired_status
from batchfill.policy.profile_fit import BatchTotals, fit_profile
from batchfill.render.kube import Owner, build_configmap

#: Bounds of what one model writes, bytes: its status (the API server takes 1.5 MiB per object, shared with the
#: spec and kopf's annotations; a status near that would be refused, and every tick rewrites parts of it) and its
#: config.pbtxt (one ConfigMap per planned config, each kept while a ReplicaSet mounts it).
STATUS_BYTES_MAX = 16 * 1024
CONFIG_BYTES_MAX = 64 * 1024
NOW = 1_800_000_000.0


def _tensor(group: str, i: int, ragged: bool = False) -> dict[str, Any]:
    name = f"{group}{i:02d}".ljust(128, "_")  # TENSOR_NAME_MAX
    return {"name": name, "dataType": "TYPE_FP32", "dims": [-1] * 16, "allowRaggedBatch": ragged}


def largest_plannable_spec() -> dict[str, Any]:
    """A spec with every list that reaches config.pbtxt or status at its schema bound (the checks across fields
    allow), and a profile that plans."""
    inputs = [_tensor("in", i, ragged=True) for i in range(32)]
    sizes = list(range(1, PROFILE_POINTS_MAX + 1))
    return {
        "model": {
            "name": "m" * 128,
            "platform": "onnxruntime_onnx",
            "inputs": inputs,
            "outputs": [_tensor("out", i) for i in range(32)],
            "batchInputs": [
                {
                    "kind": "BATCH_ACCUMULATED_ELEMENT_COUNT",
                    "targetName": f"bi{j}".ljust(128, "_"),
                    "dataType": "TYPE_INT32",
                    "sourceInputs": [inputs[j]["name"]],
                }
                for j in range(8)
            ],
        },
        "sla": {"latencyP99Ms": 3_600_000, "networkOverheadMs": 0.5},
        "profile": [{"batchSize": b, "latencyMs": 1.0 + 0.25 * b} for b in sizes],
        "batching": {"maxBatchSize": sizes[-1], "preferredBatchSizes": sizes[-32:], "instancesPerGpu": 16},
        "scaling": {"minReplicas": 10_000, "maxReplicas": 10_000},
        "triton": {"args": [f"--x{i}=" + "y" * 1000 for i in range(16)]},
    }


def _status_bytes(status: dict[str, Any]) -> int:
    BatchedModelStatus.model_validate(status)  # what the CRD's status schema takes
    return len(json.dumps(status, separators=(",", ":")))


def test_the_largest_spec_plans_to_a_small_status_and_config() -> None:
    spec = largest_plannable_spec()
    BatchedModelSpec.model_validate(spec)
    desired = desired_state(spec)
    assert desired.plan_status.preferredBatchSizes  # it planned, with batching
    body = {"metadata": {"name": "n" * 253, "namespace": "ns", "uid": "u", "generation": 3}, "spec": spec}
    status = desired_status(body, desired, {"status": {"replicas": 10_000, "readyReplicas": 10_000}}, now=NOW)
    assert _status_bytes(status) <= STATUS_BYTES_MAX
    assert 8 * 1024 < len(desired.config.encode()) <= CONFIG_BYTES_MAX  # the bound is near what the lists give
    configmap = build_configmap(Owner("n" * 253, "ns", "u"), desired.config, desired.config_hash)
    assert len(json.dumps(configmap)) <= CONFIG_BYTES_MAX + 4096


def test_a_model_measured_at_thousands_of_batch_sizes_writes_a_small_status() -> None:
    """Triton reports one batch_stats entry per batch size it executed; a model with max_batch_size 4096 under
    steady load executes thousands of sizes. Every fitted point went into status twice (measuredProfile and
    plannedProfile): 4,096 sizes were 500 KB of status."""
    spec = {
        "model": {"name": "big", "backend": "python"},
        "sla": {"latencyP99Ms": 60_000},
        "batching": {"maxBatchSize": 4096},
        "profiling": {"minExecutions": 1},
    }
    totals = [BatchTotals(b, 1000, round(1000 * (5.0 + 0.01 * b) * 1e6)) for b in range(1, 4097)]
    tick = profile_tick({"metadata": {"name": "big", "generation": 1}, "spec": spec, "status": {}}, totals, 1, now=NOW)
    assert tick.replan
    measured = tick.status["measuredProfile"]["points"]
    assert len(measured) == PROFILE_POINTS_MAX
    assert tick.status["plannedProfile"]["points"] == measured
    assert measured[0]["batchSize"] == 1
    assert measured[-1]["batchSize"] == 4096  # the largest measured size is kept: the plan may use it
    assert _status_bytes(tick.status) <= STATUS_BYTES_MAX / 2


def test_a_thinned_profile_keeps_the_ends_evenly_spaced_and_the_line_through_every_point() -> None:
    totals = [BatchTotals(b, 10, round(10 * (5.0 + b) * 1e6)) for b in range(1, 1001)]
    points = fit_profile(totals, min_executions=1)
    assert len(points) == PROFILE_POINTS_MAX
    sizes = [p.batch_size for p in points]
    assert sizes[0] == 1
    assert sizes[-1] == 1000
    assert sizes == sorted(set(sizes))
    steps = [b - a for a, b in itertools.pairwise(sizes)]
    assert max(steps) - min(steps) <= 1
    extended = fit_profile(totals, min_executions=1, up_to=2000)
    assert len(extended) == PROFILE_POINTS_MAX
    assert extended[-1].extrapolated
    assert extended[-1].batch_size == 2000
    assert extended[-1].latency_ms == pytest.approx(5.0 + 2000)  # the line fitted through all 1,000 sizes
    assert len(fit_profile(totals[:PROFILE_POINTS_MAX], min_executions=1)) == PROFILE_POINTS_MAX  # not thinned


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (
            {"batching": {"maxBatchSize": 8, "preferredBatchSizes": list(range(1, 50_001))}},
            "batching.preferredBatchSizes",
        ),
        ({"profile": [{"batchSize": b, "latencyMs": 1 + b} for b in range(1, 5001)]}, "spec.profile"),
        ({"triton": {"args": ["--x"] * 20_000}}, "spec.triton.args"),
        ({"triton": {"nodeSelector": {f"k{i}": "v" for i in range(10_000)}}}, "spec.triton.nodeSelector"),
    ],
    ids=["preferredBatchSizes", "profile", "args", "nodeSelector"],
)
def test_huge_lists_are_refused_by_field_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, Any], path: str
) -> None:
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "seed-example.yaml").read_text())
    doc["spec"].update(edit)
    f = tmp_path / "huge.yaml"
    f.write_text(json.dumps(doc))
    assert main(["plan", str(f)]) == 2
    err = capsys.readouterr().err
    assert path in err
    assert len(err.splitlines()) == 1, err[:2000]
    assert len(err) < 1000, err[:2000]
