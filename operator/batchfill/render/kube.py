"""Pure builders of the Kubernetes objects a BatchedModel owns: ConfigMap, Deployment, Service, ServiceMonitor.

Plain dicts (what the API takes), in the style of dask-kubernetes' manifest builders: no client objects, no
I/O. Every child carries a controller ownerReference to its BatchedModel, so deleting the BatchedModel is
garbage collection by the API server, not a finalizer.

Triton's ports, probes and flags follow the Triton docs (user_guide/metrics.md, protocol/extension_*.md,
`tritonserver --help`); GPUs follow Kubernetes' device-plugin rules (extended resources: limits, and requests
equal to limits when given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchfill.api.errors import Problem, SpecError
from batchfill.api.spec import API_VERSION, KIND, BatchedModelSpec

#: The server-side apply field manager of every write batchfill makes (managedFields tell its writes from others').
FIELD_MANAGER = "batchfill"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODEL_DIR = "/models"
SOURCE_DIR = "/model-source"
CONFIG_DIR = "/etc/batchfill/config"
CONFIG_KEY = "config.pbtxt"
CONFIG_HASH_ANNOTATION = "batchfill.io/config-hash"
#: managedFields (``fieldsV1``) paths of the Deployment fields whose owners the loops read: who set the replica
#: count (a hand scale) and who set the pod template's config hash (a hand rollback).
REPLICAS_FIELD = ("f:spec", "f:replicas")
CONFIG_HASH_FIELD = ("f:spec", "f:template", "f:metadata", "f:annotations", f"f:{CONFIG_HASH_ANNOTATION}")


def managed_field(fields: Any, path: Sequence[str]) -> Any:
    """The node at ``path`` in one managedFields entry's ``fieldsV1`` (None when the entry does not own it)."""
    for key in path:
        fields = fields.get(key) if isinstance(fields, Mapping) else None
    return fields


MODEL_LABEL = "batchfill.io/batchedmodel"
#: Triton's NGC images run as this user (uid 1000, "triton-server").
TRITON_UID = 1000
#: Model loads can be slow (large engines, cold object stores): allow 20 minutes before liveness applies.
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 120
#: Termination, in order (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination): a
#: deleted pod leaves the EndpointSlices while its preStop hook runs, but kube-proxy, load balancers and client-side
#: balancers see that only later. The hook keeps Triton serving for PRESTOP_DELAY_S so that a request sent to the
#: stale endpoint meanwhile is still answered; then SIGTERM, and Triton finishes its in-flight requests for up to
#: EXIT_TIMEOUT_S (``--exit-timeout-secs``); the grace period covers both with room to spare before SIGKILL.
#: An exec ``sleep``, not the hook's ``sleep`` action, which Kubernetes before 1.30 drops (the chart allows 1.29).
PRESTOP_DELAY_S = 10
EXIT_TIMEOUT_S = 30
TERMINATION_GRACE_S = PRESTOP_DELAY_S + EXIT_TIMEOUT_S + 20
#: gRPC clients (tritonclient among them) keep one HTTP/2 connection, and a ClusterIP Service balances connections,
#: not requests: a client stays on the pods that existed when it connected. Triton closes each gRPC connection
#: after GRPC_MAX_CONNECTION_AGE_MS (a GOAWAY; requests in flight get GRPC_MAX_CONNECTION_AGE_GRACE_MS more), the
#: client reconnects on its own, and the Service picks a pod again, so a replica added by a scale-out gets traffic
#: within one age (https://github.com/grpc/proposal/blob/master/A9-server-side-conn-mgt.md). A later
#: ``spec.triton.args`` entry of the same flag overrides it (tritonserver keeps the last).
GRPC_MAX_CONNECTION_AGE_MS = 30_000
GRPC_MAX_CONNECTION_AGE_GRACE_MS = 10_000


@dataclass(frozen=True)
class Owner:
    """The object that owns the children (from its metadata): a BatchedModel, or a GPUPool (``kind``)."""

    name: str
    namespace: str
    uid: str
    kind: str = KIND

    def reference(self) -> dict[str, Any]:
        """A controller ownerReference: garbage collection deletes the child with its owner."""
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def names(owner: Owner) -> dict[str, str]:
    """Child object names, derived from the BatchedModel's name (stable across reconciles). The ConfigMaps are
    named by their content: :func:`configmap_name`."""
    return {
        "deployment": f"{owner.name}-triton",
        "service": f"{owner.name}-triton",
        "servicemonitor": f"{owner.name}-triton",
    }


#: Label selector of every BatchedModel's Triton pods and Deployment, in any namespace.
CHILDREN_SELECTOR = f"app.kubernetes.io/name=triton,{MODEL_LABEL}"


def selector_labels(owner: Owner) -> dict[str, str]:
    """Labels that select this BatchedModel's Triton pods (immutable once the Deployment exists)."""
    return {"app.kubernetes.io/name": "triton", MODEL_LABEL: owner.name}


def labels(owner: Owner) -> dict[str, str]:
    """Labels on every child."""
    return {
        **selector_labels(owner),
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": "inference-server",
        "app.kubernetes.io/managed-by": "batchfill",
    }


def _meta(
    owner: Owner,
    name: str,
    annotations: Mapping[str, str] | None = None,
    owners: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner),
        "ownerReferences": [owner.reference()] if owners is None else [dict(r) for r in owners],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def configmap_name(owner: Owner, config_hash: str) -> str:
    """The name of the ConfigMap holding the config of digest ``config_hash`` (``render.config_hash``).

    Named by content and immutable: a pod of an older ReplicaSet that restarts mid-rollout mounts its own config,
    not the new one, and ``kubectl rollout undo`` brings back a template whose config still exists (an older
    config is owned by the ReplicaSets that mount it, so it is garbage-collected with the last of them:
    ``controller.configs``).
    """
    return f"{owner.name}{CONFIG_NAME_INFIX}{config_hash}"


#: Between the BatchedModel's name and the config digest in a config ConfigMap's name.
CONFIG_NAME_INFIX = "-triton-config-"
#: The pod volume that mounts the config ConfigMap.
CONFIG_VOLUME = "config"


def template_config_name(pod_spec: Mapping[str, Any] | None) -> str | None:
    """The ConfigMap a pod spec (a Pod's, or a pod template's ``spec``) mounts as its config (None: none)."""
    for volume in (pod_spec or {}).get("volumes") or []:
        if volume.get("name") == CONFIG_VOLUME:
            name = (volume.get("configMap") or {}).get("name")
            return str(name) if name else None
    return None


def build_configmap(
    owner: Owner, config_pbtxt: str, config_hash: str, owners: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The immutable ConfigMap holding the rendered ``config.pbtxt``, named by its digest (:func:`configmap_name`).

    ``owners``: its ownerReferences, when not the BatchedModel (an older config is owned by the ReplicaSets that
    mount it: ``controller.configs``).
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, configmap_name(owner, config_hash), {CONFIG_HASH_ANNOTATION: config_hash}, owners),
        "immutable": True,
        "data": {CONFIG_KEY: config_pbtxt},
    }


def _gpu_resources(spec: BatchedModelSpec) -> dict[str, dict[str, Any]]:
    """Container resources: the user's, with ``spec.triton.gpuResource`` (nvidia.com/gpu, a MIG slice, ...) set in
    limits AND requests to gpusPerReplica.

    Extended resources cannot be overcommitted: requests must equal limits
    (docs/field-cases.md#gpu-requests-limits). validate.py has already rejected a user value that disagrees with
    gpusPerReplica.
    """
    gpu = spec.triton.gpuResource
    requests = {k: v for k, v in spec.triton.resources.requests.items() if k != gpu}
    limits = {k: v for k, v in spec.triton.resources.limits.items() if k != gpu}
    gpus = spec.triton.gpusPerReplica
    if gpus > 0:
        limits[gpu] = str(gpus)
        requests[gpu] = str(gpus)
    out: dict[str, dict[str, Any]] = {}
    if requests:
        out["requests"] = {k: str(v) for k, v in sorted(requests.items())}
    if limits:
        out["limits"] = {k: str(v) for k, v in sorted(limits.items())}
    return out


def triton_args(spec: BatchedModelSpec) -> list[str]:
    """tritonserver's command line.

    ``summary_latencies`` gives the server-side p99 the autoscaler reads; auto-complete is off when the spec
    declares every input and output, so Triton cannot silently change the derived config
    (docs/field-cases.md#preferred-above-max).
    """
    args = [
        "tritonserver",
        f"--model-repository={MODEL_DIR}",
        "--model-control-mode=none",
        "--strict-readiness=true",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=true",
        "--metrics-config=summary_latencies=true",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        f"--grpc-max-connection-age={GRPC_MAX_CONNECTION_AGE_MS}",
        f"--grpc-max-connection-age-grace={GRPC_MAX_CONNECTION_AGE_GRACE_MS}",
    ]
    if spec.model.inputs and spec.model.outputs:
        args.append("--disable-auto-complete-config")
    return args + list(spec.triton.args)


def _source_volume(spec: BatchedModelSpec) -> tuple[dict[str, Any], str]:
    """The volume holding the model files, and the path of the model repository inside it."""
    repo = spec.model.repository
    if repo is None:
        raise SpecError([Problem("spec.model.repository", "is required to deploy (pvc or image)")])
    if repo.pvc is not None:
        return {"name": "model-source", "persistentVolumeClaim": {"claimName": repo.pvc.claimName, "readOnly": True}}, (
            repo.pvc.path.strip("/")
        )
    if repo.image is not None:
        return {"name": "model-source", "image": {"reference": repo.image.reference, "pullPolicy": "IfNotPresent"}}, (
            repo.image.path.strip("/")
        )
    raise SpecError(
        [
            Problem(
                "spec.model.repository.uri",
                "object-store repositories cannot carry batchfill's derived config.pbtxt yet; use pvc or image",
            )
        ]
    )


#: ``spec.strategy.rollingUpdate``: a new pod loads the model before an old one goes (needs a free GPU), or, on a
#: GPU-tight cluster, one old pod goes first and its GPU takes the new one (``controller.rollout``).
SURGE_STRATEGY = {"maxSurge": 1, "maxUnavailable": 0}
IN_PLACE_STRATEGY = {"maxSurge": 0, "maxUnavailable": 1}


def build_deployment(
    owner: Owner, spec: BatchedModelSpec, config_hash: str, replicas: int, *, in_place: bool = False
) -> dict[str, Any]:
    """The Triton Deployment (``in_place``: roll one replica at a time without a surge pod, for a cluster with no
    free GPU).

    An init container (the same Triton image) assembles the model repository in an emptyDir: the model's
    files from the source volume, and ``config.pbtxt`` from the ConfigMap, which replaces any config shipped
    with the model. ``config_hash`` in a pod-template annotation rolls the pods exactly when the config
    changes. ``replicas`` is the count to create with; the operator scales through the scale subresource.

    Long because it is one Deployment manifest, field by field as the API shows it.
    """
    source, sub_path = _source_volume(spec)
    model = spec.model.name
    src = f"{SOURCE_DIR}/{sub_path}/{model}" if sub_path else f"{SOURCE_DIR}/{model}"
    # The paths come from the spec, so they are the script's arguments ($1..$3), never part of its text: a path
    # holding `"` or `$(` is then just an odd file name, not shell code.
    assemble = 'set -eu; mkdir -p "$2"; cp -RL "$1/." "$2/"; cp "$3" "$2/"'
    assemble_args = [src, f"{MODEL_DIR}/{model}", f"{CONFIG_DIR}/{CONFIG_KEY}"]
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": TRITON_UID,
        "runAsGroup": TRITON_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    probe_get = {"port": "http"}
    container: dict[str, Any] = {
        "name": "triton",
        "image": spec.triton.image,
        "args": triton_args(spec),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", **probe_get},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", **probe_get},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "startupProbe": {
            "httpGet": {"path": "/v2/health/ready", **probe_get},
            "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": STARTUP_FAILURES,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_DELAY_S)]}}},
        "volumeMounts": [
            {"name": "models", "mountPath": MODEL_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},  # the Python backend talks to its stubs through it
        ],
        "securityContext": restricted,
    }
    resources = _gpu_resources(spec)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "fsGroup": TRITON_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [
            {
                "name": "assemble-model-repository",
                "image": spec.triton.image,
                "command": ["sh", "-c", assemble, "assemble-model-repository", *assemble_args],
                "volumeMounts": [
                    {"name": "model-source", "mountPath": SOURCE_DIR, "readOnly": True},
                    {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
                    {"name": "models", "mountPath": MODEL_DIR},
                ],
                "securityContext": restricted,
            }
        ],
        "containers": [container],
        "volumes": [
            source,
            {"name": CONFIG_VOLUME, "configMap": {"name": configmap_name(owner, config_hash)}},
            {"name": "models", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "enableServiceLinks": False,
    }
    if spec.triton.nodeSelector:
        pod_spec["nodeSelector"] = dict(sorted(spec.triton.nodeSelector.items()))
    if spec.triton.tolerations:
        pod_spec["tolerations"] = [t.model_dump(mode="json", exclude_none=True) for t in spec.triton.tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, names(owner)["deployment"]),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(owner)},
            # Never drop below the replicas that carry the load while new pods load the model, unless no GPU is
            # free for the new pod.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": dict(IN_PLACE_STRATEGY if in_place else SURGE_STRATEGY),
            },
            "template": {
                "metadata": {
                    "labels": labels(owner),
                    "annotations": {
                        CONFIG_HASH_ANNOTATION: config_hash,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(METRICS_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def build_service(owner: Owner) -> dict[str, Any]:
    """ClusterIP Service: HTTP 8000, gRPC 8001, metrics 8002."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(
            owner,
            names(owner)["service"],
            {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"},
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_service_monitor(owner: Owner, interval_s: int = 15) -> dict[str, Any]:
    """prometheus-operator ServiceMonitor scraping Triton's metrics port; keeps the namespace and pod labels."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(owner, names(owner)["servicemonitor"]),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner)},
            "namespaceSelector": {"matchNames": [owner.namespace]},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": f"{interval_s}s"}],
        },
    }
