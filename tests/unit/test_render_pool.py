"""A GPUPool's Deployment, the per-model label and Service of shared models, and the Triton repository-API requests
that load and unload them (batchfill.render.pool)."""

from __future__ import annotations

import json
import re

import pytest
import tritonclient.grpc.model_config_pb2 as mc
from google.protobuf import json_format

from batchfill.api.pool import GPUPoolSpec
from batchfill.render.kube import Owner, build_service, build_service_monitor
from batchfill.render.pool import (
    LOADED,
    PoolOwner,
    build_pool_deployment,
    build_shared_service,
    load_request,
    loaded_label,
    pool_triton_args,
    ready_path,
    unload_request,
)

from .test_pool_api import POOL_DOC
from .test_render_kube import spec_with
from .test_render_model_config import make_plan

POOL = GPUPoolSpec.model_validate(POOL_DOC["spec"])
POOL_OWNER = PoolOwner(name="small-models", namespace="ml", uid="u-1")
MIG = "nvidia.com/mig-1g.10gb"
#: Label key name part (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set)
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def test_pool_pods_run_triton_with_explicit_model_control_and_the_pools_gpu() -> None:
    dep = build_pool_deployment(POOL_OWNER, POOL, 2)
    assert dep["metadata"]["name"] == "small-models-pool"
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "GPUPool"
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert "--model-control-mode=explicit" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--load-model")], "pods start with no model"
    assert "--model-repository=/model-source" in c["args"]
    assert c["resources"] == {"requests": {MIG: "1"}, "limits": {MIG: "1"}}
    assert pod["volumes"][0] == {
        "name": "model-source",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    }
    assert set(dep["spec"]["selector"]["matchLabels"].items()) <= set(
        dep["spec"]["template"]["metadata"]["labels"].items()
    )


def test_an_object_store_pool_has_no_volume_and_extra_args_come_last() -> None:
    pool = GPUPoolSpec.model_validate(
        {**POOL_DOC["spec"], "repository": {"uri": "s3://bucket/models"}, "triton": {"args": ["--log-verbose=1"]}}
    )
    args = pool_triton_args(pool)
    assert args[1] == "--model-repository=s3://bucket/models"
    assert args[-1] == "--log-verbose=1"
    vols = build_pool_deployment(POOL_OWNER, pool, 0)["spec"]["template"]["spec"]["volumes"]
    assert [v["name"] for v in vols] == ["dshm"]


def test_pool_replicas_are_bounded_by_max_pods() -> None:
    with pytest.raises(ValueError, match=r"maxPods=4"):
        build_pool_deployment(POOL_OWNER, POOL, 5)


@pytest.mark.parametrize("name", ["m", "resnet50", "a.b-c", "x" * 63, "y" * 64, "z" * 253, "q" * 51 + "-" + "r" * 60])
def test_the_loaded_label_is_a_valid_label_key(name: str) -> None:
    key = loaded_label(name)
    prefix, part = key.split("/")
    assert prefix == "models.batchfill.io"
    assert LABEL_NAME.match(part), key
    if len(name) <= 63:
        assert part == name


def test_long_names_get_distinct_labels() -> None:
    a, b = "n" * 70 + "a", "n" * 70 + "b"
    assert loaded_label(a) != loaded_label(b)
    assert loaded_label(a) == loaded_label(a)


@pytest.mark.parametrize("bad", ["", "a/b", "a b", "ü"])
def test_the_loaded_label_refuses_what_is_no_object_name(bad: str) -> None:
    with pytest.raises(ValueError, match="object name"):
        loaded_label(bad)


def test_the_shared_service_keeps_the_models_address_and_selects_loaded_pool_pods() -> None:
    owner = Owner(name="resnet50", namespace="ml", uid="u-2")
    shared, dedicated = build_shared_service(owner, "small-models"), build_service(owner)
    assert shared["metadata"]["name"] == dedicated["metadata"]["name"]
    assert shared["metadata"]["labels"] == dedicated["metadata"]["labels"]
    # the ports clients use; not the metrics port, which the model's ServiceMonitor (it selects these labels)
    # would scrape, each pool pod's series then counted once per model's Service on top of the pool's
    assert [p["name"] for p in dedicated["spec"]["ports"]] == ["http", "grpc", "metrics"]
    assert shared["spec"]["ports"] == dedicated["spec"]["ports"][:2]
    monitor = build_service_monitor(owner)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= shared["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"metrics"}
    assert shared["spec"]["selector"] == {
        "app.kubernetes.io/name": "triton",
        "batchfill.io/gpupool": "small-models",
        "models.batchfill.io/resnet50": LOADED,
    }


def test_the_load_request_carries_the_derived_config_on_the_pools_gpu() -> None:
    spec = spec_with(gpusPerReplica=0)  # a CPU spec of its own: on the pool it runs on the pool's GPU
    req = load_request(spec, make_plan(8, [4, 8], 2500, instanceCount=2), POOL)
    assert (req.method, req.path) == ("POST", "/v2/repository/models/resnet50/load")
    config = json_format.ParseDict(json.loads(req.body["parameters"]["config"]), mc.ModelConfig())
    assert config.name == "resnet50"
    assert config.max_batch_size == 8
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2500
    assert [(g.kind, g.count) for g in config.instance_group] == [(mc.ModelInstanceGroup.KIND_GPU, 2)]


def test_a_cluster_without_gpus_loads_cpu_instances() -> None:
    """Triton refuses a KIND_GPU group without a GPU (HTTP 400, tests/component/test_pool_models_real.py)."""
    req = load_request(spec_with(), make_plan(8, [4, 8], 2500, instanceCount=2), POOL, instance_kind="KIND_CPU")
    config = json_format.ParseDict(json.loads(req.body["parameters"]["config"]), mc.ModelConfig())
    assert [(g.kind, g.count) for g in config.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 2)]
    assert config.max_batch_size == 8


def test_unload_and_ready() -> None:
    req = unload_request("resnet50")
    assert (req.method, req.path, dict(req.body)) == (
        "POST",
        "/v2/repository/models/resnet50/unload",
        {"parameters": {"unload_dependents": False}},
    )
    assert ready_path("resnet50") == "/v2/models/resnet50/ready"
