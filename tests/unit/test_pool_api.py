"""The sharing API: spec.placement and spec.triton.gpuResource on BatchedModel, status.placement, and the GPUPool
resource with its generated CRD (crds/gpupool.yaml)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from batchfill.api.crd import POOL_CRD_NAME, POOL_REGENERATE_COMMAND, build_pool_crd, render_pool_crd_yaml
from batchfill.api.errors import SpecError
from batchfill.api.pool import GPUPool, GPUPoolSpec
from batchfill.api.spec import GPU_RESOURCE, BatchedModelSpec, PlacementMode
from batchfill.api.status import PLACEMENT_PODS_MAX, BatchedModelStatus, PlacementStatus
from batchfill.api.validate import load_model, pool_problems
from batchfill.cli.main import main

from .conftest import SEED_DOC
from .test_crd import errors, walk

ROOT = Path(__file__).resolve().parents[2]
POOL_COMMITTED = ROOT / "crds" / "gpupool.yaml"

POOL_DOC: dict[str, Any] = {
    "apiVersion": "batchfill.io/v1alpha1",
    "kind": "GPUPool",
    "metadata": {"name": "small-models", "namespace": "ml"},
    "spec": {
        "gpuResource": "nvidia.com/mig-1g.10gb",
        "gpuMemoryMiB": 10240,
        "repository": {"pvc": {"claimName": "models"}},
        "maxPods": 4,
    },
}


def _doc(**spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SEED_DOC)
    doc["spec"].update(spec)
    return doc


def pool_schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_pool_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# ------------------------------------------------------------------------------------------ spec.placement


def test_placement_defaults_keep_todays_behaviour() -> None:
    spec = load_model(SEED_DOC).spec
    assert spec.placement.mode is PlacementMode.DEDICATED
    assert spec.placement.pool is None
    assert spec.placement.memoryMiB is None
    assert spec.triton.gpuResource == GPU_RESOURCE == "nvidia.com/gpu"


def test_shared_placement_names_a_pool() -> None:
    spec = load_model(_doc(placement={"mode": "Auto", "pool": "small-models", "memoryMiB": 900})).spec
    assert (spec.placement.mode, spec.placement.pool, spec.placement.memoryMiB) == (
        PlacementMode.AUTO,
        "small-models",
        900,
    )


@pytest.mark.parametrize("mode", ["Shared", "Auto"])
def test_shared_or_auto_without_a_pool_is_refused(mode: str) -> None:
    with pytest.raises(SpecError) as err:
        load_model(_doc(placement={"mode": mode}))
    assert [p.path for p in err.value.problems] == ["spec.placement.pool"]
    assert mode in err.value.problems[0].message


@pytest.mark.parametrize(
    "placement",
    [{"mode": "Sometimes", "pool": "p"}, {"mode": "Shared", "pool": "Not_A_Name"}, {"memoryMiB": 0}],
)
def test_bad_placement_is_refused(placement: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        load_model(_doc(placement=placement))


# ------------------------------------------------------------------------------- spec.triton.gpuResource


def test_a_mig_slice_is_the_replicas_gpu() -> None:
    spec = load_model(_doc(triton={"gpuResource": "nvidia.com/mig-1g.10gb", "gpusPerReplica": 1})).spec
    assert spec.triton.gpuResource == "nvidia.com/mig-1g.10gb"


def test_an_nvidia_resource_other_than_gpu_resource_is_refused() -> None:
    """Today's trap: gpusPerReplica 0 and a MIG request ran KIND_CPU and counted 0 GPU-hours; now it is an error."""
    with pytest.raises(SpecError) as err:
        load_model(
            _doc(
                triton={
                    "gpusPerReplica": 0,
                    "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}, "requests": {"nvidia.com/mig-1g.10gb": 1}},
                }
            )
        )
    paths = [p.path for p in err.value.problems]
    assert paths == [
        "spec.triton.resources.requests[nvidia.com/mig-1g.10gb]",
        "spec.triton.resources.limits[nvidia.com/mig-1g.10gb]",
    ]
    assert "gpuResource=nvidia.com/mig-1g.10gb" in err.value.problems[0].message


def test_gpu_resource_quantity_must_equal_gpus_per_replica() -> None:
    mig = "nvidia.com/mig-2g.20gb"
    with pytest.raises(SpecError) as err:
        load_model(_doc(triton={"gpuResource": mig, "gpusPerReplica": 1, "resources": {"limits": {mig: 2}}}))
    assert [p.path for p in err.value.problems] == [f"spec.triton.resources.limits[{mig}]"]
    ok = load_model(_doc(triton={"gpuResource": mig, "gpusPerReplica": 2, "resources": {"limits": {mig: 2}}}))
    assert ok.spec.triton.gpusPerReplica == 2


@pytest.mark.parametrize("name", ["gpu", "nvidia.com/", "/gpu", "Nvidia.com/gpu", "nvidia.com/mig 1g"])
def test_gpu_resource_must_be_an_extended_resource_name(name: str) -> None:
    with pytest.raises(ValidationError):
        BatchedModelSpec.model_validate({**SEED_DOC["spec"], "triton": {"gpuResource": name}})


# ------------------------------------------------------------------------------------------ status.placement


def test_placement_status_is_bounded() -> None:
    status = BatchedModelStatus(
        placement=PlacementStatus(
            mode="Shared",
            pool="p",
            pods=["p-0", "p-1"],
            podCount=2,
            gpuShare=0.31,
            planHeadroom=0.2,
            reason="SharedBelowOneGpu",
        )
    )
    assert status.model_dump(exclude_none=True)["placement"]["gpuShare"] == 0.31
    with pytest.raises(ValidationError):
        PlacementStatus(mode="Shared", pods=[f"p-{i}" for i in range(PLACEMENT_PODS_MAX + 1)])
    with pytest.raises(ValidationError):
        PlacementStatus(mode="Elsewhere")
    with pytest.raises(ValidationError):
        PlacementStatus(mode="Shared", gpuShare=float("nan"))
    with pytest.raises(ValidationError):
        PlacementStatus(mode="Shared", planHeadroom=1.5)


# ------------------------------------------------------------------------------------------------ GPUPool


def test_pool_document_parses_with_defaults() -> None:
    pool = GPUPool.model_validate(POOL_DOC)
    assert pool.spec.gpuResource == "nvidia.com/mig-1g.10gb"
    assert (pool.spec.gpusPerPod, pool.spec.minPods, pool.spec.maxPods, pool.spec.maxModelsPerPod) == (1, 0, 4, 16)
    assert pool.spec.triton.image.startswith("nvcr.io/nvidia/tritonserver:")


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpuMemoryMiB", 0), ("gpusPerPod", 0), ("gpusPerPod", 9), ("maxModelsPerPod", 65), ("maxPods", 0)],
)
def test_pool_bounds(field: str, value: Any) -> None:
    spec = {**POOL_DOC["spec"], field: value}
    with pytest.raises(ValidationError):
        GPUPoolSpec.model_validate(spec)
    assert errors(spec, pool_schema()["properties"]["spec"]), f"the CRD should refuse {field}={value}"


def test_pool_needs_memory_and_repository() -> None:
    schema = pool_schema()["properties"]["spec"]
    assert set(schema["required"]) == {"gpuMemoryMiB", "repository"}
    assert errors(POOL_DOC["spec"], schema) == []


def test_committed_pool_crd_matches_the_generator() -> None:
    assert POOL_COMMITTED.exists(), f"crds/gpupool.yaml is missing; generate it with: {POOL_REGENERATE_COMMAND}"
    assert POOL_COMMITTED.read_text(encoding="utf-8").rstrip("\n") == render_pool_crd_yaml().rstrip("\n"), (
        f"crds/gpupool.yaml is out of date with batchfill.api; regenerate it with: {POOL_REGENERATE_COMMAND}"
    )


def test_cli_prints_the_pool_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd", "--kind", "GPUPool"]) == 0
    assert capsys.readouterr().out.strip() == POOL_COMMITTED.read_text().strip()


def test_pool_crd_names_columns_and_rules() -> None:
    crd = build_pool_crd()
    assert crd["metadata"]["name"] == POOL_CRD_NAME == "gpupools.batchfill.io"
    assert crd["spec"]["names"]["kind"] == "GPUPool"
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "GPU", "Models", "Pods", "Ready", "Desired", "Age"
    ]  # fmt: skip
    spec = pool_schema()["properties"]["spec"]
    assert [r["rule"] for r in spec["x-kubernetes-validations"]] == ["self.minPods <= self.maxPods"]
    rules = spec["properties"]["triton"]["x-kubernetes-validations"]
    assert "nvidia.com/" in rules[0]["rule"]


def test_every_pool_string_and_list_is_bounded() -> None:
    for path, node in walk(pool_schema()["properties"]["spec"], "spec"):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path
        if node.get("type") == "array":
            assert "maxItems" in node, path


def test_the_largest_placement_status_is_small() -> None:
    """Written every tick the placement changes: at its bounds it stays a small part of the status budget."""
    largest = PlacementStatus(
        mode="Dedicated", pool="p" * 253, pods=["x" * 253] * PLACEMENT_PODS_MAX, podCount=100_000, gpuShare=100_000,
        planHeadroom=1, reason="R" * 64, message="m" * 1024, since="2026-12-02T09:00:00Z",
    )  # fmt: skip
    assert len(largest.model_dump_json()) < 6 * 1024


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"minPods": 5, "maxPods": 2}, ["spec.minPods=5 must be <= spec.maxPods=2"]),
        ({"repository": {}}, ["spec.repository: exactly one of pvc, image or uri must be set"]),
        (
            {"triton": {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "1"}}}},
            ["spec.triton.resources.requests[cpu]: must be less than or equal to spec.triton.resources.limits[cpu]"],
        ),
        (
            {"triton": {"resources": {"requests": {"cpu": "-1"}}}},
            ["spec.triton.resources.requests[cpu]='-1' must not be negative"],
        ),
        (
            {"triton": {"resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}}},
            [
                "spec.triton.resources.requests[nvidia.com/gpu]: the pool's GPU is spec.gpuResource and "
                "spec.gpusPerPod, not triton.resources",
                "spec.triton.resources.limits[nvidia.com/gpu]: the pool's GPU is spec.gpuResource and "
                "spec.gpusPerPod, not triton.resources",
                "spec.triton.resources.requests[nvidia.com/gpu]: must equal its limit (extended resources cannot be "
                "overcommitted)",
            ],
        ),
        ({}, []),
    ],
)
def test_pool_problems_name_the_fields_the_crd_or_the_deployment_would_refuse(
    spec: dict[str, Any], expected: list[str]
) -> None:
    """What the CRD's CEL rules refuse (checked again for an object stored before them) and what only the API
    server's check of the pool's Deployment would: the operator says it on the GPUPool (pool_loop._refuse)."""
    parsed = GPUPoolSpec.model_validate({**POOL_DOC["spec"], **spec})
    assert [str(p) for p in pool_problems(parsed)] == expected


def test_the_committed_pool_example_is_accepted_by_its_crd_and_the_operator() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "shared" / "pool.yaml").read_text())
    assert errors(doc["spec"], pool_schema()["properties"]["spec"]) == []
    assert pool_problems(GPUPool.model_validate(doc).spec) == []
