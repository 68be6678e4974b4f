"""The Kubernetes children of a BatchedModel: owner references, GPUs (docs/field-cases.md#gpu-requests-limits),
probes, config hash."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest

from batchfill.api.errors import SpecError
from batchfill.api.spec import API_VERSION, KIND
from batchfill.api.validate import load_model
from batchfill.render.kube import (
    CONFIG_HASH_ANNOTATION,
    Owner,
    build_configmap,
    build_deployment,
    build_service,
    build_service_monitor,
    template_config_name,
    triton_args,
)

from .conftest import SEED_DOC

OWNER = Owner(name="resnet50", namespace="ml", uid="1234-abcd")


def spec_with(**triton: Any) -> Any:
    doc = copy.deepcopy(SEED_DOC)
    doc["spec"]["model"]["repository"] = {"pvc": {"claimName": "models", "path": "/repo"}}
    doc["spec"]["model"]["inputs"] = [{"name": "input", "dataType": "TYPE_FP32", "dims": [3, 224, 224]}]
    doc["spec"]["model"]["outputs"] = [{"name": "logits", "dataType": "TYPE_FP32", "dims": [1000]}]
    doc["spec"]["triton"] = triton
    return load_model(doc).spec


def container(dep: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return c


def test_every_child_is_owned_by_its_batchedmodel() -> None:
    spec = spec_with()
    for obj in (
        build_configmap(OWNER, 'name: "m"\n', "h"),
        build_deployment(OWNER, spec, "h", 1),
        build_service(OWNER),
        build_service_monitor(OWNER),
    ):
        refs = obj["metadata"]["ownerReferences"]
        assert refs == [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": "resnet50",
                "uid": "1234-abcd",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "batchfill"


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_c20_gpu_in_limits_and_equal_requests(gpus: int) -> None:
    dep = build_deployment(OWNER, spec_with(gpusPerReplica=gpus, resources={"limits": {"memory": "8Gi"}}), "h", 1)
    res = container(dep)["resources"]
    assert res["limits"] == {"memory": "8Gi", "nvidia.com/gpu": str(gpus)}
    assert res["requests"] == {"nvidia.com/gpu": str(gpus)}


def test_c20_cpu_replica_has_no_gpu() -> None:
    dep = build_deployment(OWNER, spec_with(gpusPerReplica=0), "h", 1)
    assert "nvidia.com/gpu" not in str(container(dep).get("resources", {}))


def test_probes_ports_and_triton_flags() -> None:
    c = container(build_deployment(OWNER, spec_with(args=["--log-verbose=1"]), "h", 1))
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 600
    assert [p["containerPort"] for p in c["ports"]] == [8000, 8001, 8002]
    assert "--metrics-config=summary_latencies=true" in c["args"]
    assert "--disable-auto-complete-config" in c["args"]  # inputs and outputs are declared
    assert c["args"][-1] == "--log-verbose=1"


def test_auto_complete_stays_on_when_tensors_are_not_declared() -> None:
    doc = copy.deepcopy(SEED_DOC)
    assert "--disable-auto-complete-config" not in triton_args(load_model(doc).spec)


def test_config_hash_in_pod_template_rolls_pods_only_on_config_change() -> None:
    spec = spec_with()
    a, b = build_deployment(OWNER, spec, "aaaa", 1), build_deployment(OWNER, spec, "bbbb", 1)
    assert a["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == "aaaa"
    assert a == build_deployment(OWNER, spec, "aaaa", 1)  # deterministic
    a["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] = "bbbb"
    # the pods mount the ConfigMap of their own config, named by its digest
    assert template_config_name(a["spec"]["template"]["spec"]) == "resnet50-triton-config-aaaa"
    a["spec"]["template"]["spec"] = b["spec"]["template"]["spec"]
    assert a == b


def test_the_configmap_is_immutable_and_named_by_its_digest() -> None:
    cm = build_configmap(OWNER, "max_batch_size: 8", "0123456789abcdef")
    assert cm["metadata"]["name"] == "resnet50-triton-config-0123456789abcdef"
    assert cm["immutable"] is True
    assert cm["metadata"]["annotations"] == {CONFIG_HASH_ANNOTATION: "0123456789abcdef"}
    assert cm["data"] == {"config.pbtxt": "max_batch_size: 8"}


def _run_init_container(init: dict[str, Any], root: Path) -> subprocess.CompletedProcess[str]:
    """Run the init container's command with a real ``sh``, its mount paths moved under ``root``."""
    mounts = [m["mountPath"] for m in init["volumeMounts"]]
    argv = [next((str(root) + a[len(m) :] for m in mounts if a.startswith(m + "/")), a) for a in init["command"]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_init_container_places_the_derived_config_over_the_model_files(tmp_path: Path) -> None:
    dep = build_deployment(OWNER, spec_with(), "h", 1)
    init = dep["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][:2] == ["sh", "-c"]
    assert init["command"][4:] == [
        "/model-source/repo/resnet50",
        "/models/resnet50",
        "/etc/batchfill/config/config.pbtxt",
    ]
    model = tmp_path / "repo" / "resnet50"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_text("weights")
    (model / "config.pbtxt").write_text("shipped with the model")
    (tmp_path / "config.pbtxt").write_text("derived by batchfill")
    r = _run_init_container(init, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "resnet50" / "1" / "model.onnx").read_text() == "weights"
    assert (tmp_path / "resnet50" / "config.pbtxt").read_text() == "derived by batchfill"
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["model-source"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert vols["config"]["configMap"]["name"] == "resnet50-triton-config-h"


def test_a_repository_path_is_data_to_the_init_container_never_shell_code(tmp_path: Path) -> None:
    doc = copy.deepcopy(SEED_DOC)
    evil = 'x"; touch "$HOME/pwned"; echo "$(touch pwned2)'
    doc["spec"]["model"]["repository"] = {"pvc": {"claimName": "models", "path": evil}}
    try:
        spec = load_model(doc).spec
    except SpecError:
        return  # rejected by validation: also safe
    init = build_deployment(OWNER, spec, "h", 1)["spec"]["template"]["spec"]["initContainers"][0]
    assert evil not in init["command"][2]  # not rejected by validation: the render must make it safe
    r = _run_init_container(init, tmp_path)
    assert r.returncode != 0  # no such directory: the copy fails, nothing else runs
    assert not list(tmp_path.rglob("pwned*"))
    assert not (Path.home() / "pwned").exists()


def test_deploying_without_a_repository_is_a_field_error() -> None:
    with pytest.raises(SpecError, match=r"spec\.model\.repository"):
        build_deployment(OWNER, load_model(copy.deepcopy(SEED_DOC)).spec, "h", 1)


def test_service_exposes_http_grpc_metrics() -> None:
    svc = build_service(OWNER)
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("http", 8000), ("grpc", 8001), ("metrics", 8002)]
    assert svc["spec"]["selector"] == {"app.kubernetes.io/name": "triton", "batchfill.io/batchedmodel": "resnet50"}


def test_termination_serves_stale_endpoints_then_drains_before_the_grace_period_ends() -> None:
    pod = build_deployment(OWNER, spec_with(), "h", 1)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "10"]}}
    exit_timeout = next(int(a.split("=")[1]) for a in c["args"] if a.startswith("--exit-timeout-secs="))
    # the hook's delay, then Triton's drain, both inside the grace period (SIGKILL after it)
    assert 10 + exit_timeout < pod["terminationGracePeriodSeconds"]
    assert (exit_timeout, pod["terminationGracePeriodSeconds"]) == (30, 60)


def test_grpc_connections_are_aged_so_clients_rebalance_and_a_user_flag_wins() -> None:
    args = build_deployment(OWNER, spec_with(), "h", 1)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--grpc-max-connection-age=30000" in args
    assert "--grpc-max-connection-age-grace=10000" in args
    mine = spec_with(args=["--grpc-max-connection-age=5000"])
    args = build_deployment(OWNER, mine, "h", 1)["spec"]["template"]["spec"]["containers"][0]["args"]
    ages = [a for a in args if a.startswith("--grpc-max-connection-age=")]
    assert ages == ["--grpc-max-connection-age=30000", "--grpc-max-connection-age=5000"]  # tritonserver keeps the last
