"""The operator against the real API server, running as the install's ServiceAccount (not system:masters).

The operator runs as a subprocess (`batchfill run`) with a token kubeconfig of ServiceAccount
batchfill-system/batchfill, whose RBAC comes from `deploy/base` (the same rules as the Helm chart), so a
missing permission fails these tests. Triton pods are kwok pods on fake GPU nodes: scheduling, GPU counting and
readiness are the real scheduler's and controllers' behaviour; no Triton process runs here.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.api.reasons import ConditionReason, ConditionType, EventReason, SpecReason
from batchfill.api.spec import GROUP, KIND, PLURAL, VERSION
from batchfill.render.kube import CONFIG_HASH_ANNOTATION, template_config_name
from batchfill.testbed.install import install_operator_rbac, operator_as_service_account

from .conftest import USE_EXISTING
from .support import Kube, free_gpus, model_volume, rbac_denials, require_gpus, temp_namespace, until, wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
#: How long the steady-state check watches for writes (docs/field-cases.md#status-write-loops), 5 minutes by default.
STEADY_SECONDS = float(os.environ.get("BATCHFILL_STEADY_STATE_SECONDS", "300"))


def batched_model(name: str, **spec_changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["model"]["repository"] = {"pvc": {"claimName": "models"}}
    for key, value in spec_changes.items():
        doc["spec"][key] = value
    return doc


@pytest.fixture(scope="module")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """Install CRD + RBAC from deploy/base (server-side apply), then run the operator as its ServiceAccount."""
    work = tmp_path_factory.mktemp("operator")
    install_operator_rbac(kube.kubeconfig, work)
    log = work / "operator.log"
    with operator_as_service_account(kube.kubeconfig, work, log, args=("--verbose",)) as proc:
        time.sleep(3)
        assert proc.poll() is None, f"operator exited: {log.read_text()[-3000:]}"
        yield proc
    denied = rbac_denials(log.read_text())
    assert not denied, "the ServiceAccount lacked a permission:\n" + "\n".join(denied[:10])


def is_true(bm: dict[str, Any], type_: str) -> bool:
    return (condition(bm, type_) or {}).get("status") == "True"


def custom(kube: Kube) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api)


def get_bm(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom(kube).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return obj


def condition(bm: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (bm.get("status") or {}).get("conditions", []) if c["type"] == type_), None)


def children(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with suppress(ApiException):
        out["deployment"] = kube.apps.read_namespaced_deployment(f"{name}-triton", ns)
    if "deployment" in out:  # the config its template mounts (named by its digest)
        template = kube.api.sanitize_for_serialization(out["deployment"].spec.template.spec)
        with suppress(ApiException):
            out["configmap"] = kube.core.read_namespaced_config_map(template_config_name(template) or "-", ns)
    with suppress(ApiException):
        out["service"] = kube.core.read_namespaced_service(f"{name}-triton", ns)
    return out


def warning_events(kube: Kube, ns: str, name: str) -> list[Any]:
    events = kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e for e in events if e.type == "Warning"]


@dataclass(frozen=True)
class Steady:
    """A model left alone while the module's other tests run: its namespace, children's and own resourceVersions
    once settled, and when they were read (monotonic s)."""

    ns: str
    children: dict[str, str]
    bm: str
    since_s: float


@pytest.fixture(scope="module")
def steady(kube: Kube, operator: Any) -> Iterator[Steady]:
    """docs/field-cases.md#status-write-loops: a model created, Ready and settled early, so the 5-minute watch for
    writes runs while the module's other tests make the operator busy, instead of after them."""
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("steady"))
        wait_for(
            "Ready=True",
            lambda: (condition(get_bm(kube, ns, "steady"), ConditionType.READY) or {}).get("status") == "True" or None,
            120,
        )
        time.sleep(20)  # let the first timer ticks settle
        before = {k: v.metadata.resource_version for k, v in children(kube, ns, "steady").items()}
        yield Steady(ns, before, get_bm(kube, ns, "steady")["metadata"]["resourceVersion"], time.monotonic())


def test_the_steady_model_settles(steady: Steady) -> None:
    """Starts the steady-state watch (the fixture) before the module's other tests."""
    assert set(steady.children) == {"deployment", "configmap", "service"}


def test_valid_model_is_deployed_onto_gpu_nodes_with_status(kube: Kube, operator: Any) -> None:
    require_gpus(kube)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("resnet"))
        kids = until("children", lambda: children(kube, ns, "resnet"), lambda c: len(c) == 3, 90)
        bm = get_bm(kube, ns, "resnet")
        for obj in kids.values():
            refs = obj.metadata.owner_references
            assert [(r.kind, r.name, r.uid, r.controller) for r in refs] == [
                (KIND, "resnet", bm["metadata"]["uid"], True)
            ]
        config = kids["configmap"].data["config.pbtxt"]
        assert "max_batch_size: 7" in config
        dep = kids["deployment"]
        limits = dep.spec.template.spec.containers[0].resources.limits
        assert limits["nvidia.com/gpu"] == "1"
        assert dep.spec.template.spec.containers[0].resources.requests["nvidia.com/gpu"] == "1"
        # pods scheduled onto the fake GPU nodes by the real scheduler, Ready through kwok
        pods = wait_for(
            "a Running Triton pod",
            lambda: [p for p in kube.core.list_namespaced_pod(ns).items if p.status.phase == "Running"] or None,
            90,
        )
        node = kube.core.read_node(pods[0].spec.node_name)
        assert int(node.status.allocatable["nvidia.com/gpu"]) >= 1
        bm = until("Ready=True", lambda: get_bm(kube, ns, "resnet"), lambda b: is_true(b, ConditionType.READY), 60)
        status = bm["status"]
        assert not bm["metadata"].get("finalizers"), "deletion must not depend on the operator running"
        assert status["observedGeneration"] == bm["metadata"]["generation"]
        assert status["plan"]["maxBatchSize"] == 7
        assert status["plan"]["seedRule"]["maxQueueDelayMicroseconds"] == 40000
        assert (condition(bm, ConditionType.PLANNED) or {})["status"] == "True"
        assert status["readyReplicas"] == 1
        table = kube.kubectl("get", "bm", "-n", ns).stdout
        header = table.splitlines()[0].split()
        assert header[:3] == ["NAME", "SLA", "REPLICAS"]
        assert {"DESIRED", "FILL", "QUEUE", "READY", "PROGRESSING", "AGE"} <= set(header)


def test_api_server_rejects_min_above_max_replicas(kube: Kube, operator: Any) -> None:
    with temp_namespace(kube) as ns:
        body = batched_model("bad", scaling={"minReplicas": 3, "maxReplicas": 1})
        with pytest.raises(ApiException) as info:
            custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        assert info.value.status == 422
        details = json.loads(info.value.body)["details"]["causes"]
        assert {
            "field": "spec.scaling.minReplicas",
            "message": "Invalid value: minReplicas must be <= maxReplicas",
        } in [{"field": c.get("field"), "message": c.get("message")} for c in details]


@pytest.mark.parametrize(
    ("batching", "field", "message"),
    [
        ({"maxBatchSize": 8, "preferredBatchSizes": [4, 16]}, "spec.batching.preferredBatchSizes",
         "every preferredBatchSizes entry must be <= maxBatchSize"),
        ({"maxBatchSize": 0, "preferredBatchSizes": [2]}, "spec.batching.preferredBatchSizes",
         "preferredBatchSizes need batching: maxBatchSize must be > 0"),
        ({"preferredBatchSizes": [0, 8]}, "spec.batching.preferredBatchSizes[0]",
         "should be greater than or equal to 1"),
    ],
    ids=["C01a", "C01b", "C01c"],
)  # fmt: skip
def test_api_server_rejects_the_c01_specs_with_the_field(
    kube: Kube, operator: Any, batching: dict[str, Any], field: str, message: str
) -> None:
    """docs/field-cases.md#preferred-above-max on the real API server: the CRD's schema and CEL rules refuse them
    before any operator runs."""
    with temp_namespace(kube) as ns:
        with pytest.raises(ApiException) as info:
            custom(kube).create_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, batched_model("c01", batching=batching)
            )
        assert info.value.status == 422
        causes = json.loads(info.value.body)["details"]["causes"]
        assert any(c.get("field") == field and message in c.get("message", "") for c in causes), causes


def test_operator_rejects_with_a_field_named_condition_and_one_event(kube: Kube, operator: Any) -> None:
    with temp_namespace(kube) as ns:
        # preferred sizes beyond the profile: a rule the API server cannot check
        body = batched_model("beyond", batching={"preferredBatchSizes": [4, 16]})
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        bm = until(
            ConditionType.CONFIG_VALID,
            lambda: get_bm(kube, ns, "beyond"),
            lambda b: condition(b, ConditionType.CONFIG_VALID),
            60,
        )
        c = condition(bm, ConditionType.CONFIG_VALID) or {}
        assert c["status"] == "False"
        assert c["reason"] == SpecReason.INVALID_BATCHING
        assert "spec.batching.preferredBatchSizes[1]=16 exceeds the largest profiled batch size 8" in c["message"]
        time.sleep(20)  # a retry loop would show up as more events and handler runs
        assert len(warning_events(kube, ns, "beyond")) == 1
        assert children(kube, ns, "beyond") == {}
        # fixing the spec lets the update handler run once and succeed
        custom(kube).patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "beyond", {"spec": {"batching": {"preferredBatchSizes": [4, 8]}}}
        )
        wait_for("children after the fix", lambda: len(children(kube, ns, "beyond")) == 3 or None, 60)
        bm = until(
            "ConfigValid=True",
            lambda: get_bm(kube, ns, "beyond"),
            lambda b: is_true(b, ConditionType.CONFIG_VALID),
            60,
        )
        assert bm["status"]["plan"]["preferredBatchSizes"] == [4, 8]


def test_sla_edit_rerenders_and_rolls_once_then_delete_collects_children(kube: Kube, operator: Any) -> None:
    require_gpus(kube)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("edit"))
        kids = until("children", lambda: children(kube, ns, "edit"), lambda c: len(c) == 3, 90)
        gen0 = kids["deployment"].metadata.generation
        old_config = kids["configmap"].data["config.pbtxt"]
        custom(kube).patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "edit", {"spec": {"sla": {"latencyP99Ms": 70, "networkOverheadMs": 10}}}
        )
        new = until(
            "a new config",
            lambda: children(kube, ns, "edit"),
            lambda c: c["configmap"].data["config.pbtxt"] != old_config,
            90,
        )
        time.sleep(10)  # anything that would roll twice has had time to
        dep = kube.apps.read_namespaced_deployment("edit-triton", ns)
        assert dep.metadata.generation == gen0 + 1
        replica_sets = kube.apps.list_namespaced_replica_set(ns).items
        assert len(replica_sets) == 2
        assert (
            new["configmap"].metadata.annotations[CONFIG_HASH_ANNOTATION]
            == (dep.spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION])
        )
        custom(kube).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "edit")
        wait_for("garbage collection of every child", lambda: children(kube, ns, "edit") == {} or None, 90)
        wait_for("pods gone", lambda: not kube.core.list_namespaced_pod(ns).items or None, 90)


def _served_hash(kube: Kube, ns: str, name: str) -> str:
    dep = kube.apps.read_namespaced_deployment(f"{name}-triton", ns)
    return str(dep.spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION])


def _rolled_forward(kube: Kube, ns: str, bm: dict[str, Any], old: str) -> bool:
    """The Deployment serves the plan's config (the Planned message names it), not ``old``."""
    served = _served_hash(kube, ns, bm["metadata"]["name"])
    return served != old and f"config {served}" in (condition(bm, ConditionType.PLANNED) or {}).get("message", "")


def test_rollout_undo_restores_the_previous_config_and_holds_until_the_spec_changes(kube: Kube, operator: Any) -> None:
    """Each config is an immutable ConfigMap named by its digest and owned by the ReplicaSets that mount it, so a
    real ``kubectl rollout undo`` brings back the old pods with their own config, and the operator leaves the
    rollback alone (ConfigApplied=False, RolledBackByHand) until the spec changes."""
    require_gpus(kube)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("undo"))
        first = until("children", lambda: children(kube, ns, "undo"), lambda c: len(c) == 3, 90)
        h1 = first["configmap"].metadata.annotations[CONFIG_HASH_ANNOTATION]
        assert first["configmap"].immutable is True
        assert first["configmap"].metadata.name == f"undo-triton-config-{h1}"
        custom(kube).patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "undo", {"spec": {"sla": {"latencyP99Ms": 70, "networkOverheadMs": 10}}}
        )
        second = until(
            "the second config rolled out",
            lambda: children(kube, ns, "undo"),
            lambda c: c["configmap"].metadata.annotations[CONFIG_HASH_ANNOTATION] != h1,
            90,
        )
        h2 = second["configmap"].metadata.annotations[CONFIG_HASH_ANNOTATION]
        kube.kubectl("rollout", "status", "deployment/undo-triton", "-n", ns, "--timeout=90s")
        # the first config is still there, owned by the ReplicaSet of revision 1 only
        old = until(
            "the first config handed to its ReplicaSet",
            lambda: kube.core.read_namespaced_config_map(f"undo-triton-config-{h1}", ns),
            lambda cm: [r.kind for r in cm.metadata.owner_references or []] == ["ReplicaSet"],
            60,
        )
        assert old.data["config.pbtxt"] != second["configmap"].data["config.pbtxt"]

        kube.kubectl("rollout", "undo", "deployment/undo-triton", "-n", ns)
        kube.kubectl("rollout", "status", "deployment/undo-triton", "-n", ns, "--timeout=90s")
        bm = until(
            "ConfigApplied=False (RolledBackByHand)",
            lambda: get_bm(kube, ns, "undo"),
            lambda b: (
                (condition(b, ConditionType.CONFIG_APPLIED) or {}).get("reason") == ConditionReason.ROLLED_BACK_BY_HAND
            ),
            60,
        )
        assert h1 in condition(bm, ConditionType.CONFIG_APPLIED)["message"]
        assert h2 in condition(bm, ConditionType.CONFIG_APPLIED)["message"]
        time.sleep(35)  # two scaling ticks: the operator must not roll forward again
        assert _served_hash(kube, ns, "undo") == h1
        pods = kube.core.list_namespaced_pod(ns, label_selector="batchfill.io/batchedmodel=undo").items
        mounted = {
            v.config_map.name for p in pods if p.metadata.deletion_timestamp is None for v in p.spec.volumes
            if v.config_map is not None
        }  # fmt: skip
        assert mounted == {f"undo-triton-config-{h1}"}, "every pod serves the config it was rolled back to"
        listed = kube.core.list_namespaced_event(ns, field_selector="involvedObject.name=undo").items
        events = [e.reason for e in listed]
        assert events.count(EventReason.ROLLED_BACK_BY_HAND) == 1, events
        # scaling meanwhile works with the served config's capacity (read from its ConfigMap), and says so
        (said,) = [e.message for e in listed if e.reason == EventReason.ROLLED_BACK_BY_HAND]
        assert "scaling uses that config's capacity" in said, said

        # the user's next spec change wins: the pods roll forward to the plan's config
        custom(kube).patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "undo", {"spec": {"sla": {"latencyP99Ms": 90, "networkOverheadMs": 10}}}
        )
        bm = until(
            "the new spec applied and ConfigApplied gone",
            lambda: get_bm(kube, ns, "undo"),
            lambda b: condition(b, ConditionType.CONFIG_APPLIED) is None and _rolled_forward(kube, ns, b, h1),
            90,
        )


def _fill_gpus(kube: Kube, ns: str) -> list[str]:
    """Pods (kwok: nothing runs) holding every free nvidia.com/gpu, one per node; returns their names."""
    made = []
    for node, free in free_gpus(kube).items():
        if free <= 0:
            continue
        name = f"filler-{len(made)}"
        kube.core.create_namespaced_pod(ns, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "hold", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"limits": {"nvidia.com/gpu": str(free)}}}]},
        })  # fmt: skip
        made.append(name)
    wait_for("the fillers bound", lambda: all(free_gpus(kube).get(n, 0) <= 0 for n in free_gpus(kube)) or None, 60)
    return made


def test_a_rollout_with_no_free_gpu_for_a_surge_pod_goes_in_place_and_completes(kube: Kube, operator: Any) -> None:
    """A GPU-tight cluster (every GPU held): the config change's surge pod stays Pending for want of GPUs, so the
    operator rolls in place (maxSurge 0, maxUnavailable 1), the rollout completes, and the surge strategy comes back."""
    require_gpus(kube)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("tight"))
        first = until("children", lambda: children(kube, ns, "tight"), lambda c: len(c) == 3, 90)
        kube.kubectl("rollout", "status", "deployment/tight-triton", "-n", ns, "--timeout=90s")
        h1 = first["configmap"].metadata.annotations[CONFIG_HASH_ANNOTATION]
        _fill_gpus(kube, ns)
        t0 = time.monotonic()
        custom(kube).patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "tight", {"spec": {"sla": {"latencyP99Ms": 70, "networkOverheadMs": 10}}}
        )
        until(
            "the surge pod Pending for want of GPUs",
            lambda: kube.core.list_namespaced_pod(ns, label_selector="batchfill.io/batchedmodel=tight").items,
            lambda pods: any(
                c.type == "PodScheduled" and c.status == "False" and "nvidia.com/gpu" in (c.message or "")
                for p in pods for c in p.status.conditions or []
            ),
            60,
        )  # fmt: skip
        until(
            "the rollout turned in place",
            lambda: kube.apps.read_namespaced_deployment("tight-triton", ns).spec.strategy.rolling_update,
            lambda r: str(r.max_surge) == "0",
            120,
        )
        in_place_s = time.monotonic() - t0
        kube.kubectl("rollout", "status", "deployment/tight-triton", "-n", ns, "--timeout=120s")
        assert _served_hash(kube, ns, "tight") != h1
        until(
            "the surge strategy back",
            lambda: kube.apps.read_namespaced_deployment("tight-triton", ns).spec.strategy.rolling_update,
            lambda r: (str(r.max_surge), str(r.max_unavailable)) == ("1", "0"),
            60,
        )
        done_s = time.monotonic() - t0
        listed = kube.core.list_namespaced_event(ns, field_selector="involvedObject.name=tight").items
        assert [e.reason for e in listed].count(EventReason.ROLLING_IN_PLACE) == 1
        print(f"GPU-tight rollout: in place after {in_place_s:.0f} s, complete and surge restored after {done_s:.0f} s")


class ConflictWebhook:
    """A validating admission webhook that makes the real API server answer 409 Conflict to the first write of one
    Deployment, then admits everything (docs/field-cases.md#retries: API trouble is temporary).

    The real API server cannot be made to return a 409 to a forced server-side apply on its own; an admission
    webhook denying with ``code: 409`` is the API server's own way of producing one, so the operator sees exactly
    the response a real conflict gives. Served on 127.0.0.1 with a self-signed certificate.
    """

    def __init__(self, workdir: Path, deployment: str) -> None:
        import ssl
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.deployment = deployment
        self.calls: list[tuple[str, str, bool]] = []  # (operation, name, allowed)
        cert, key = workdir / "tls.crt", workdir / "tls.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.ca_bundle = base64.b64encode(cert.read_bytes()).decode()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                req = review["request"]
                name = req.get("name") or (req.get("object") or {}).get("metadata", {}).get("name", "")
                first = name == hook.deployment and not any(n == name for _, n, _ in hook.calls)
                hook.calls.append((req["operation"], name, not first))
                response: dict[str, Any] = {"uid": req["uid"], "allowed": not first}
                if first:
                    response["status"] = {"code": 409, "reason": "Conflict", "message": "injected conflict (test)"}
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": response}).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/validate"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.skipif(
    USE_EXISTING, reason="the webhook listens on this machine's loopback, out of a remote API server's reach"
)
def test_conflict_on_first_deployment_write_is_retried_and_converges(kube: Kube, operator: Any, tmp_path: Path) -> None:
    """docs/field-cases.md#retries: a 409 from the API server is temporary: retried with backoff, no
    PermanentError, children converge."""
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        hook = ConflictWebhook(tmp_path, "conflict-triton")
        name = f"batchfill-test-conflict-{ns}"
        config = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "conflict.test.batchfill.io",
                    "clientConfig": {"url": hook.url, "caBundle": hook.ca_bundle},
                    "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                               "resources": ["deployments"], "scope": "Namespaced"}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }  # fmt: skip
        admission = client.AdmissionregistrationV1Api(kube.api)
        admission.create_validating_webhook_configuration(config)
        try:
            # the webhook is live once a probe Deployment write in the namespace reaches it
            probe = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probe"},
                     "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "probe"}},
                              "template": {"metadata": {"labels": {"app": "probe"}},
                                           "spec": {"containers": [{"name": "c", "image": "pause"}]}}}}  # fmt: skip
            deadline = time.monotonic() + 30
            while not hook.calls and time.monotonic() < deadline:
                with suppress(ApiException):  # AlreadyExists after the first: admission ran before that check
                    kube.apps.create_namespaced_deployment(ns, probe)
                time.sleep(0.5)
            assert hook.calls, "the API server never called the webhook"
            custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("conflict"))
            kids = until(
                "children despite the conflict", lambda: children(kube, ns, "conflict"), lambda c: len(c) == 3, 60
            )
            ours = [c for c in hook.calls if c[1] == "conflict-triton"]
            assert ours[0][2] is False, ours  # the first write got the 409
            assert any(allowed for _, _, allowed in ours[1:]), ours  # and a retry went through
            annotation = CONFIG_HASH_ANNOTATION
            assert (
                kids["deployment"].spec.template.metadata.annotations[annotation]
                == kids["configmap"].metadata.annotations[annotation]
            )
            bm = until(
                "Planned=True", lambda: get_bm(kube, ns, "conflict"), lambda b: is_true(b, ConditionType.PLANNED), 60
            )
            assert is_true(bm, ConditionType.CONFIG_VALID)
            assert not [e for e in warning_events(kube, ns, "conflict") if e.reason in (SpecReason.APPLY_REJECTED,)]
        finally:
            admission.delete_validating_webhook_configuration(name)
            hook.close()


SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList", "plural": "servicemonitors",
                  "singular": "servicemonitor"},
        "scope": "Namespaced",
        "versions": [{"name": "v1", "served": True, "storage": True,
                      "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}  # fmt: skip


def test_steady_state_writes_nothing_to_children(kube: Kube, steady: Steady) -> None:
    """docs/field-cases.md#status-write-loops: with no spec change for STEADY_SECONDS, while the module's other
    tests ran (before the ServiceMonitor CRD comes, which adds a child to every model), no child is written
    (resourceVersions stay) and the BatchedModel settles."""
    time.sleep(max(0.0, steady.since_s + STEADY_SECONDS - time.monotonic()))
    print(f"watched for writes for {time.monotonic() - steady.since_s:.0f} s")
    after = {k: v.metadata.resource_version for k, v in children(kube, steady.ns, "steady").items()}
    assert after == steady.children
    assert get_bm(kube, steady.ns, "steady")["metadata"]["resourceVersion"] == steady.bm


@pytest.mark.skipif(USE_EXISTING, reason="installs and removes the cluster-wide ServiceMonitor CRD")
def test_service_monitor_created_when_prometheus_operator_crd_is_served(kube: Kube, operator: Any) -> None:
    """A ServiceMonitor child appears when prometheus-operator's CRD is served, also when installed afterwards."""
    ext = client.ApiextensionsV1Api(kube.api)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("monitored"))
        until("children", lambda: children(kube, ns, "monitored"), lambda c: len(c) == 3, 90)
        ext.create_custom_resource_definition(SERVICE_MONITOR_CRD)
        try:
            kube.kubectl("wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com")

            def monitor() -> Any:
                with suppress(ApiException):
                    return custom(kube).get_namespaced_custom_object(
                        "monitoring.coreos.com", "v1", ns, "servicemonitors", "monitored-triton"
                    )
                return None

            # the operator's discovery answer is reused for 30 s; then the status timer adds the child
            sm = wait_for("the ServiceMonitor", monitor, 90)
            bm = get_bm(kube, ns, "monitored")
            assert [(r["kind"], r["name"], r["uid"]) for r in sm["metadata"]["ownerReferences"]] == [
                (KIND, "monitored", bm["metadata"]["uid"])
            ]
            endpoints = sm["spec"].get("endpoints") or sm["spec"].get("podMetricsEndpoints")
            assert endpoints, sm["spec"]
            custom(kube).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "monitored")
            wait_for("the ServiceMonitor collected with its owner", lambda: monitor() is None or None, 90)
        finally:
            ext.delete_custom_resource_definition("servicemonitors.monitoring.coreos.com")
