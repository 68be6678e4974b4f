"""The "keep your autoscaler" recipe (README "Keeping your autoscaler") on the real API server.

The recipe's own files (deploy/examples/keda/) are applied as a user would, server-side with strict field
validation: the HPA against the API server's autoscaling/v2 schema, the KEDA ScaledObject against a fixture CRD
(tests/cluster/fixtures/keda-scaledobject-crd.yaml; no KEDA controller runs). The example BatchedModel with
``scaling.mode: Off`` is served by the operator (as the install's ServiceAccount, with its /metrics on a free
port); another manager sets the Deployment's replicas through the scale subresource, as the HPA controller does,
and the operator must leave that count alone while it keeps exporting the capacity and desired replicas the
recipe scales on. Triton pods are kwok pods on fake GPU nodes; no Prometheus runs, so the signals stay unknown
(the operator's desired count holds at the current one).
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from batchfill.api.reasons import ScalingReason
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.testbed.install import install_operator_rbac, operator_as_service_account

from .support import Kube, model_volume, rbac_denials, require_gpus, temp_namespace, until

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "deploy" / "examples" / "keda"
FIXTURE_CRD = Path(__file__).parent / "fixtures" / "keda-scaledobject-crd.yaml"
EXAMPLE = ROOT / "deploy" / "examples" / "ocr-recognizer.yaml"
#: The field manager of the "other autoscaler" (the HPA controller writes the scale subresource under its own).
OTHER_MANAGER = "recipe-test-autoscaler"
INTERVAL_S = 2.0  # the operator's tick here (BATCHFILL_RECONCILE_INTERVAL_SECONDS is 15 s by default)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The operator as its ServiceAccount with /metrics on a free port; yields that port."""
    work = tmp_path_factory.mktemp("operator-keda")
    install_operator_rbac(kube.kubeconfig, work)
    log, port = work / "operator.log", free_port()
    args = ("--metrics-port", str(port), "--interval", str(INTERVAL_S))
    with operator_as_service_account(kube.kubeconfig, work, log, args=args) as proc:
        time.sleep(3)
        assert proc.poll() is None, f"operator exited: {log.read_text()[-3000:]}"
        yield port
    denied = rbac_denials(log.read_text())
    assert not denied, "the ServiceAccount lacked a permission:\n" + "\n".join(denied[:10])


def recipe_doc(file: str, ns: str) -> dict[str, Any]:
    """One manifest of deploy/examples/keda, moved into the test's namespace."""
    doc: dict[str, Any] = yaml.safe_load((RECIPE / file).read_text())
    doc["metadata"]["namespace"] = ns
    return doc


def off_model(ns: str) -> dict[str, Any]:
    """The example BatchedModel with the recipe's merge patch (scaling-off.yaml), on the test's volume."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    patch = yaml.safe_load((RECIPE / "scaling-off.yaml").read_text())
    doc["metadata"]["namespace"] = ns
    doc["spec"]["model"]["repository"] = {"pvc": {"claimName": "models"}}
    doc["spec"]["scaling"].update(patch["spec"]["scaling"])
    return doc


def apply(kube: Kube, doc: dict[str, Any], path: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``kubectl apply --server-side`` (strict field validation, kubectl's default) of one object."""
    path.write_text(yaml.safe_dump(doc))
    result: subprocess.CompletedProcess[str] = kube.kubectl(
        "apply", "--server-side", "--field-manager=recipe-user", "-f", str(path), check=check
    )
    return result


def operator_samples(port: int) -> dict[tuple[str, str, str], float]:
    """The operator's gauges as (metric name, namespace, name) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, s.labels.get("namespace", ""), s.labels.get("name", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def refused(kube: Kube, doc: dict[str, Any], path: Path, field: str) -> None:
    """The API server refuses ``doc`` with a message naming ``field``."""
    result = apply(kube, doc, path, check=False)
    assert result.returncode != 0, f"accepted: {doc['spec']}"
    assert field in result.stderr, result.stderr


def apply_recipe(kube: Kube, ns: str, deployment: str, per_replica_rps: float, work: Path) -> None:
    """Apply the recipe's ScaledObject and HPA (both accepted, as written) and check that the fixture's schema
    refuses a misspelt and a missing field; ``per_replica_rps``: u x C from the operator's plan."""
    custom = client.CustomObjectsApi(kube.api)
    scaled = recipe_doc("scaledobject.yaml", ns)
    hpa = recipe_doc("hpa.yaml", ns)
    assert scaled["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"] == deployment
    threshold = float(scaled["spec"]["triggers"][0]["metadata"]["threshold"])
    assert threshold == pytest.approx(per_replica_rps, abs=0.01), "the recipe's threshold is not u x C"
    apply(kube, scaled, work / "scaledobject.yaml")
    apply(kube, hpa, work / "hpa.yaml")
    stored = custom.get_namespaced_custom_object("keda.sh", "v1alpha1", ns, "scaledobjects", deployment)
    assert stored["spec"]["triggers"][0]["metadata"]["threshold"] == f"{threshold:g}"
    read = client.AutoscalingV2Api(kube.api).read_namespaced_horizontal_pod_autoscaler(deployment, ns)
    metric = read.spec.metrics[0].external
    assert metric.metric.name == "batchfill_recommended_replicas"
    assert metric.metric.selector.match_labels == {"name": deployment.removesuffix("-triton")}
    assert metric.target.average_value == "1"
    typo = recipe_doc("scaledobject.yaml", ns)
    typo["metadata"]["name"] = "typo"
    typo["spec"]["maxReplicas"] = typo["spec"].pop("maxReplicaCount")
    refused(kube, typo, work / "typo.yaml", "maxReplicas")
    typo["spec"]["maxReplicaCount"] = typo["spec"].pop("maxReplicas")
    del typo["spec"]["triggers"]
    refused(kube, typo, work / "typo.yaml", "triggers")


def test_recipe_manifests_accepted_and_an_external_replica_count_is_left_alone(
    kube: Kube, operator: int, tmp_path: Path
) -> None:
    require_gpus(kube)
    kube.kubectl("apply", "--server-side", "-f", str(FIXTURE_CRD))
    kube.kubectl("wait", "--for=condition=Established", "crd/scaledobjects.keda.sh", "--timeout=60s")
    custom = client.CustomObjectsApi(kube.api)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        model = off_model(ns)
        name = model["metadata"]["name"]
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, model)
        bm = until(
            "the plan and a first scaling tick",
            lambda: custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name),
            lambda b: (b.get("status") or {}).get("lastScaleReason") == ScalingReason.SCALING_OFF,
            90,
        )
        capacity = bm["status"]["plan"]["capacityPerReplicaRps"]
        utilization = bm["spec"]["scaling"].get("targetUtilization", 0.85)

        deployment = f"{name}-triton"
        apply_recipe(kube, ns, deployment, utilization * capacity, tmp_path)

        # another autoscaler sets the count through the scale subresource, under its own field manager
        kube.apps.patch_namespaced_deployment_scale(
            deployment, ns, {"spec": {"replicas": 3}}, field_manager=OTHER_MANAGER
        )
        time.sleep(5 * INTERVAL_S)  # several operator ticks
        dep = kube.apps.read_namespaced_deployment(deployment, ns)
        assert dep.spec.replicas == 3, "scaling.mode Off changed a replica count another manager set"
        owners = {
            m.manager for m in dep.metadata.managed_fields if "f:replicas" in (m.fields_v1 or {}).get("f:spec", {})
        }
        assert owners == {OTHER_MANAGER}, f"spec.replicas is owned by {owners}"
        status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)["status"]
        assert "appliedReplicas" not in status
        assert status["lastScaleReason"] == ScalingReason.SCALING_OFF

        # a spec change re-plans and re-applies the Deployment: with the other manager's count
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name, {"spec": {"sla": {"latencyP99Ms": 600}}}
        )
        bm = until(
            "the new generation applied",
            lambda: custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name),
            lambda b: (b.get("status") or {}).get("observedGeneration") == b["metadata"]["generation"] > 1,
            60,
        )
        new_capacity = bm["status"]["plan"]["capacityPerReplicaRps"]
        assert new_capacity != capacity, "a new SLA, a new plan"
        time.sleep(3 * INTERVAL_S)
        assert kube.apps.read_namespaced_deployment(deployment, ns).spec.replicas == 3, "the re-apply reset replicas"

        samples = until(
            "the operator's gauges to see 3 replicas",
            lambda: operator_samples(operator),
            lambda s: (
                s.get(("batchfill_replicas", ns, name)) == 3
                and s.get(("batchfill_capacity_per_replica", ns, name)) == pytest.approx(new_capacity)
            ),
            30,
        )
        assert samples[("batchfill_desired_replicas", ns, name)] == 3  # Off: desired is the current count
        # no Prometheus runs here: the load is unknown, so no recommendation an autoscaler would act on
        assert samples[("batchfill_metrics_available", ns, name)] == 0
        assert ("batchfill_recommended_replicas", ns, name) not in samples
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    kube.kubectl("delete", "-f", str(FIXTURE_CRD), "--wait=true")
