"""A GPUPool's Kubernetes objects and the Triton repository-API requests that load models onto its pods (pure).

The pool's pods run tritonserver with ``--model-control-mode=explicit`` on the pool's model repository and start
with no model. The operator loads each shared model with its own derived configuration (the load request's
``config`` parameter overrides any config.pbtxt in the repository) and unloads it the same way, so models join and
leave a pod without restarting it (Triton's model repository extension,
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md).

Routing: after a successful load the operator labels the pod ``models.batchfill.io/<model>: loaded``
(:func:`loaded_label`), and the model's Service (the same name as its dedicated Service, so clients keep their
address when the model moves) selects the pool's pods with that label (:func:`build_shared_service`). Removing the
label takes the pod out of the model's endpoints before the unload.

``--strict-readiness=false``: a pod is Ready when the server is live, whatever one model's load did; readiness per
model is the label, set only after the model reports ready (``READY`` in the repository index, the fact
``GET v2/models/<m>/ready`` gives; batchfill.controller.pool_models decides when).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from batchfill.api.pool import POOL_KIND, GPUPoolSpec
from batchfill.api.spec import GROUP, BatchedModelSpec
from batchfill.api.status import PlanStatus
from batchfill.render.kube import (
    EXIT_TIMEOUT_S,
    GRPC_MAX_CONNECTION_AGE_GRACE_MS,
    GRPC_MAX_CONNECTION_AGE_MS,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    PRESTOP_DELAY_S,
    SOURCE_DIR,
    TERMINATION_GRACE_S,
    TRITON_UID,
    Owner,
    build_service,
)
from batchfill.render.model_config import InstanceKind, build_model_config

POOL_LABEL = f"{GROUP}/gpupool"
#: Label selector of every pool's pods and Deployments (the pool loop's caches).
POOL_CHILDREN_SELECTOR = f"app.kubernetes.io/name=triton,{POOL_LABEL}"
#: Prefix of the per-model label a pool pod carries while that model is loaded and ready on it.
LOADED_LABEL_PREFIX = f"models.{GROUP}/"
LOADED = "loaded"
#: The ReplicaSet's deletion-cost annotation: a pool pod's number of models served (controller/pool_models.py).
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: Longest name part of a label key (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/).
LABEL_NAME_MAX = 63
_HASH_CHARS = 10


def PoolOwner(name: str, namespace: str, uid: str) -> Owner:  # noqa: N802 (reads as the type it builds)
    """The GPUPool that owns the pool's Deployment: deleting the pool deletes its pods."""
    return Owner(name=name, namespace=namespace, uid=uid, kind=POOL_KIND)


def pool_deployment_name(pool: str) -> str:
    """Name of the pool's Deployment (and the prefix of its pods' names)."""
    return f"{pool}-pool"


def pool_selector_labels(pool: str) -> dict[str, str]:
    """Labels that select a pool's pods (immutable once the Deployment exists)."""
    return {"app.kubernetes.io/name": "triton", POOL_LABEL: pool}


def loaded_label(model: str) -> str:
    """The label key ``models.batchfill.io/<model>`` of a pool pod that serves BatchedModel ``model``.

    A label key's name part is at most 63 characters of ``[A-Za-z0-9._-]``, starting and ending alphanumeric; a
    BatchedModel name (a DNS subdomain: lowercase alphanumerics, ``-`` and ``.``) is up to 253, so a longer name
    becomes its first 52 characters and 10 hex digits of its SHA-256, distinct per name with overwhelming odds.

    Raises:
        ValueError: ``model`` is empty or has a character no object name has.
    """
    if not model or not all(ch.isascii() and (ch.isalnum() or ch in "-.") for ch in model):
        raise ValueError(f"model={model!r} is not a Kubernetes object name")
    if len(model) <= LABEL_NAME_MAX:
        return LOADED_LABEL_PREFIX + model
    digest = hashlib.sha256(model.encode()).hexdigest()[:_HASH_CHARS]
    head = model[: LABEL_NAME_MAX - _HASH_CHARS - 1].rstrip("-.")
    return f"{LOADED_LABEL_PREFIX}{head}-{digest}"


def _repository(pool: GPUPoolSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """(volumes, volume mounts, --model-repository) of the pool's repository."""
    repo = pool.repository
    if repo.pvc is not None:
        volume: dict[str, Any] = {"persistentVolumeClaim": {"claimName": repo.pvc.claimName, "readOnly": True}}
        sub = repo.pvc.path.strip("/")
    elif repo.image is not None:
        volume = {"image": {"reference": repo.image.reference, "pullPolicy": "IfNotPresent"}}
        sub = repo.image.path.strip("/")
    else:
        return [], [], str(repo.uri)
    mount = {"name": "model-source", "mountPath": SOURCE_DIR, "readOnly": True}
    return [{"name": "model-source", **volume}], [mount], f"{SOURCE_DIR}/{sub}" if sub else SOURCE_DIR


def pool_triton_args(pool: GPUPoolSpec) -> list[str]:
    """tritonserver's command line on a pool pod: explicit model control, no model at start."""
    _, _, repository = _repository(pool)
    return [
        "tritonserver",
        f"--model-repository={repository}",
        "--model-control-mode=explicit",
        "--strict-readiness=false",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=true",
        "--metrics-config=summary_latencies=true",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        f"--grpc-max-connection-age={GRPC_MAX_CONNECTION_AGE_MS}",
        f"--grpc-max-connection-age-grace={GRPC_MAX_CONNECTION_AGE_GRACE_MS}",
        *pool.triton.args,
    ]


def _resources(pool: GPUPoolSpec) -> dict[str, dict[str, str]]:
    """The user's CPU and memory with the pool's GPU resource in requests and limits (extended: equal)."""
    t = pool.triton.resources
    gpu = {pool.gpuResource: str(pool.gpusPerPod)}
    return {
        "requests": dict(sorted({**{k: str(v) for k, v in t.requests.items()}, **gpu}.items())),
        "limits": dict(sorted({**{k: str(v) for k, v in t.limits.items()}, **gpu}.items())),
    }


def build_pool_deployment(owner: Owner, pool: GPUPoolSpec, replicas: int) -> dict[str, Any]:
    """The pool's Deployment: ``replicas`` Triton pods, each with ``gpusPerPod`` of ``gpuResource``, no model loaded.

    Rolling updates replace a pod only after a new one is Ready (the operator then loads that pod's models);
    ``replicas`` is the count to create with, the operator scales from the joint plan.

    Raises:
        ValueError: ``replicas`` outside [0, spec.maxPods].
    """
    if not 0 <= replicas <= pool.maxPods:
        raise ValueError(f"replicas={replicas} must be within [0, spec.maxPods={pool.maxPods}]")
    volumes, mounts, _ = _repository(pool)
    labels = {**pool_selector_labels(owner.name), "app.kubernetes.io/managed-by": "batchfill"}
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": TRITON_UID,
        "runAsGroup": TRITON_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    probe = {"port": "http"}
    container = {
        "name": "triton",
        "image": pool.triton.image,
        "args": pool_triton_args(pool),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", **probe}, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", **probe}, "periodSeconds": 10, "failureThreshold": 6},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_DELAY_S)]}}},
        "resources": _resources(pool),
        "volumeMounts": [*mounts, {"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": restricted,
    }
    pod_spec: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "fsGroup": TRITON_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [*volumes, {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "enableServiceLinks": False,
    }
    if pool.triton.nodeSelector:
        pod_spec["nodeSelector"] = dict(sorted(pool.triton.nodeSelector.items()))
    if pool.triton.tolerations:
        pod_spec["tolerations"] = [t.model_dump(mode="json", exclude_none=True) for t in pool.triton.tolerations]
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": pool_deployment_name(owner.name),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": pool_selector_labels(owner.name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec},
        },
    }


def build_shared_service(owner: Owner, pool: str) -> dict[str, Any]:
    """The model's Service while it is shared: its usual name and ports, selecting the pool's pods it is loaded on.

    Not a scrape target (no ``prometheus.io/`` annotations, and no ``metrics`` port, which the model's own
    ServiceMonitor scrapes: it selects this Service by its labels, kept for ``kubectl get -l``): a pod serving
    several models would be scraped once per model's Service, and every series summed twice or more; the pool's
    own Service (:func:`build_pool_service`) is the one scraped, and each series' ``model`` label tells the models
    apart.
    """
    service = build_service(owner)
    service["spec"]["selector"] = {**pool_selector_labels(pool), loaded_label(owner.name): LOADED}
    service["spec"]["ports"] = [p for p in service["spec"]["ports"] if p["name"] != "metrics"]
    annotations = service["metadata"].get("annotations") or {}
    service["metadata"]["annotations"] = {k: v for k, v in annotations.items() if not k.startswith("prometheus.io/")}
    return service


def build_pool_service(owner: Owner) -> dict[str, Any]:
    """The pool's metrics Service ``<pool>-pool``: every pool pod's Triton metrics port, the pool's one scrape
    target (annotated for annotation-based discovery; :func:`build_pool_service_monitor` for prometheus-operator)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": pool_deployment_name(owner.name),
            "namespace": owner.namespace,
            "labels": {**pool_selector_labels(owner.name), "app.kubernetes.io/managed-by": "batchfill"},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(METRICS_PORT),
                "prometheus.io/path": "/metrics",
            },
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": pool_selector_labels(owner.name),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def build_pool_service_monitor(owner: Owner, interval_s: int = 15) -> dict[str, Any]:
    """prometheus-operator ServiceMonitor of the pool's metrics Service (keeps the namespace and pod labels, which
    the signals group by, as a model's own ServiceMonitor does)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": pool_deployment_name(owner.name),
            "namespace": owner.namespace,
            "labels": {**pool_selector_labels(owner.name), "app.kubernetes.io/managed-by": "batchfill"},
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "selector": {"matchLabels": pool_selector_labels(owner.name)},
            "namespaceSelector": {"matchNames": [owner.namespace]},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": f"{interval_s}s"}],
        },
    }


@dataclass(frozen=True)
class TritonRequest:
    """One HTTP request to a pool pod's Triton (port ``HTTP_PORT``): ``method``, ``path``, JSON ``body``."""

    method: str
    path: str
    body: Mapping[str, Any]


def shared_spec(spec: BatchedModelSpec, pool: GPUPoolSpec) -> BatchedModelSpec:
    """``spec`` as served on ``pool``'s pods: the pool's GPU resource and count replace the model's own."""
    triton = spec.triton.model_copy(update={"gpuResource": pool.gpuResource, "gpusPerReplica": pool.gpusPerPod})
    return spec.model_copy(update={"triton": triton})


def load_request(
    spec: BatchedModelSpec, plan: PlanStatus, pool: GPUPoolSpec, *, instance_kind: InstanceKind | None = None
) -> TritonRequest:
    """``POST v2/repository/models/<m>/load`` with the model's derived config as the ``config`` parameter.

    The config is Triton's ModelConfig in protobuf's JSON mapping (proto field names, as Triton's config endpoint
    returns it), built by :func:`batchfill.render.build_model_config` for the model on the pool's GPU (KIND_GPU).
    ``instance_kind="KIND_CPU"`` is a cluster without GPUs (``BATCHFILL_TRITON_CPU_IMAGE``): Triton 2.51 refuses
    a KIND_GPU group there with HTTP 400 ("has kind KIND_GPU but no GPUs are available",
    tests/component/test_pool_models_real.py).

    Raises:
        ValueError: as :func:`batchfill.render.build_model_config` (a plan the spec cannot take).
    """
    cfg = build_model_config(shared_spec(spec, pool), plan, instance_kind=instance_kind)
    config = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return TritonRequest("POST", f"/v2/repository/models/{spec.model.name}/load", {"parameters": {"config": text}})


def unload_request(model: str) -> TritonRequest:
    """``POST v2/repository/models/<m>/unload``; the model's dependents (ensembles) stay loaded."""
    return TritonRequest("POST", f"/v2/repository/models/{model}/unload", {"parameters": {"unload_dependents": False}})


def ready_path(model: str) -> str:
    """``GET`` this path on a pod: 200 once ``model`` is loaded and ready there (Triton's HTTP health API)."""
    return f"/v2/models/{model}/ready"
