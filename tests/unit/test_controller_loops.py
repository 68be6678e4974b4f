"""The scaling and profiling loops, several ticks in a row, against a fake API server that records every call.

What the loops read is shaped exactly as the production adapters return it:

* :class:`FakeKube` answers like ``batchfill.adapters.kube.Kube``: BatchedModels as the API server stores them
  (the CRD's defaults applied, with tests/unit/test_crd.py's defaulting), status merge-patched under the
  resourceVersion precondition (a changed object: ``False``, as the adapter turns HTTP 409 into), every status
  checked against the CRD's status schema, children as a server-side apply returns them, with ``managedFields``
  naming who owns ``spec.replicas``, and 404s as ``KubeNotFoundError``;
* :class:`FakeView` answers like ``batchfill.adapters.informer.CachedView``: Deployments and pods as the informer
  caches hold them (trimmed by the informer's own trimming), a Deployment missing from the cache asked of the API;
* Triton's statistics come through the real ``adapters.pod_stats.read_pod_batch_stats``: only tritonclient's
  HTTP client is replaced, by one answering Triton's JSON (or refusing the connection);
* Prometheus is the source behind the real ``SignalHub``, answering ``QueryResults`` (what
  ``PrometheusSignals.query_all`` returns) from per-pod series the test sets.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import kopf
import pytest

from batchfill.adapters import operator_metrics
from batchfill.adapters.informer import _trim_deployment, _trim_pod  # the caches' own trimming
from batchfill.adapters.kube import KubeNotFoundError, KubePermanentError, KubeTemporaryError
from batchfill.adapters.metrics import QueryFailure, QueryResults, SignalTarget
from batchfill.adapters.signal_hub import SignalHub
from batchfill.api.crd import build_crd
from batchfill.api.reasons import ConditionType, EventReason, ReplanReason, ScalingReason, SignalsReason
from batchfill.api.spec import API_VERSION, KIND
from batchfill.api.status import PlannedProfileSource
from batchfill.controller.desired import desired_state
from batchfill.controller.handlers import _first_tick
from batchfill.controller.loops import ProfilingLoop, ScalingLoop
from batchfill.controller.profiling import UNREAD_WARNING_S
from batchfill.controller.reconcile import SERVICE_MONITOR, emitter, reapply, reconcile
from batchfill.controller.scaling import ScalingMemory
from batchfill.controller.settings import OperatorSettings
from batchfill.policy.conditions import find, rfc3339
from batchfill.render.kube import FIELD_MANAGER, Owner, names, selector_labels

from .test_crd import apply_defaults, errors

NS = "ml"


@pytest.fixture(autouse=True)
def _forget_metric_series() -> Iterator[None]:
    """The operator's metrics live in one process-wide registry: drop the series this test's models left, so
    no other test sees them (the dashboard test checks that a forgotten model leaves nothing)."""
    yield
    names = {
        s.labels["name"]
        for f in operator_metrics.REGISTRY.collect()
        for s in f.samples
        if s.labels.get("namespace") == NS and "name" in s.labels
    }
    for name in names:
        operator_metrics.forget(NS, name)


T0 = 1_800_000_000.0
#: The container status the kubelet writes for a tritonserver that exits on a model it cannot load.
CRASH_LOOP: dict[str, Any] = {
    "name": "triton",
    "ready": False,
    "started": False,
    "restartCount": 3,
    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
    "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
}
ROOT_SCHEMA: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
STATUS_SCHEMA: dict[str, Any] = ROOT_SCHEMA["properties"]["status"]
DEPLOYMENT = ("apps/v1", "Deployment")
WRITES = ("apply", "patch_status", "scale_deployment", "post_event")

MODEL: dict[str, Any] = {
    "name": "sleep",
    "backend": "python",
    "repository": {"pvc": {"claimName": "models"}},
    "inputs": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
    "outputs": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
}
#: The cluster tests' sleep model (tests/cluster/test_scaling.py): l(b) = 41 + 6.2 b ms declared.
SCALING_SPEC: dict[str, Any] = {
    "model": MODEL,
    "sla": {"latencyP99Ms": 200, "networkOverheadMs": 20},
    "profile": [{"batchSize": b, "latencyMs": round(41 + 6.2 * b, 1)} for b in (1, 2, 4, 8, 16)],
    "scaling": {"minReplicas": 1, "maxReplicas": 3, "targetUtilization": 0.8, "scaleDownStabilizationSeconds": 20},
    "triton": {"gpusPerReplica": 1},
}
#: No profile: the first plan (max_batch_size 32) is served until the pods' statistics are fitted (40 + 6 b ms),
#: whose plan batches less (l(32) = 232 ms is over the 180 ms budget): a new config.pbtxt.
PROFILING_SPEC: dict[str, Any] = {
    "model": MODEL,
    "sla": {"latencyP99Ms": 200, "networkOverheadMs": 20},
    "batching": {"maxBatchSize": 32},
    "profiling": {"minExecutions": 20, "replanIntervalSeconds": 60},
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (the status subresource's ``application/merge-patch+json``)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _matches(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


class FakeKube:
    """The API server as ``adapters.kube.Kube`` presents it, recording every call in ``calls``, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.models: dict[tuple[str, str], dict[str, Any]] = {}
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (apiVersion, kind, ns, name)
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.served = {DEPLOYMENT, ("v1", "ConfigMap"), ("v1", "Service")}
        self.events: list[tuple[str, str, str]] = []
        self.invalid: list[str] = []  # status writes the API server would reject (HTTP 422)
        self.refuse_scale = ""  # an admission policy's message: the scale subresource is refused
        self.before_status_patch: Callable[[], None] | None = None  # another writer, once, just before a patch
        self._version = 1000

    def _rv(self) -> str:
        self._version += 1
        return str(self._version)

    # -- the BatchedModel API ----------------------------------------------------------------------------------

    def list_batched_models(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        self.calls.append(("list_batched_models",))
        return [copy.deepcopy(m) for (ns, _), m in sorted(self.models.items()) if not namespaces or ns in namespaces]

    def get_batched_model(self, name: str, namespace: str) -> dict[str, Any] | None:
        self.calls.append(("get_batched_model", namespace, name))
        found = self.models.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def patch_status(self, body: Mapping[str, Any], status: Mapping[str, Any], plural: str = "") -> bool:
        meta = body["metadata"]
        if plural:
            return self.patch_kind_status(plural, body, status)
        self.calls.append(("patch_status", meta["namespace"], meta["name"], copy.deepcopy(dict(status))))
        hook, self.before_status_patch = self.before_status_patch, None
        if hook is not None:
            hook()
        stored = self.models.get((meta["namespace"], meta["name"]))
        if stored is None or stored["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            return False  # the adapter's answer to HTTP 409 (and 404)
        self.write_status(stored, status)
        return True

    def patch_kind_status(self, plural: str, body: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        raise AssertionError(f"status of {plural} patched, which this API server does not serve")

    def write_status(self, stored: dict[str, Any], patch: Mapping[str, Any]) -> None:
        merged = apply_defaults(merge_patch(stored.get("status") or {}, patch), STATUS_SCHEMA)
        self.invalid += errors(merged, STATUS_SCHEMA, "status")
        stored["status"] = merged
        stored["metadata"]["resourceVersion"] = self._rv()

    def post_event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = body["metadata"]
        self.calls.append(("post_event", meta["namespace"], meta["name"], type_, reason))
        self.events.append((type_, reason, message))

    # -- children ----------------------------------------------------------------------------------------------

    def has_kind(self, api_version: str, kind: str) -> bool:
        self.calls.append(("has_kind", kind))
        return (api_version, kind) in self.served

    def forget_kinds(self) -> None:
        self.calls.append(("forget_kinds",))

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind, namespace, name))
        found = self.objects.get((api_version, kind, namespace, name))
        return copy.deepcopy(found) if found is not None and (api_version, kind) in self.served else None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        self.calls.append(("apply", obj["kind"], meta["namespace"], meta["name"]))
        if (obj["apiVersion"], obj["kind"]) not in self.served:
            raise KubeNotFoundError(f"apply {obj['kind']} {meta['namespace']}/{meta['name']}: HTTP 404: not found")
        key = (obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        old = self.objects.get(key)
        new = copy.deepcopy(obj)
        new["metadata"] |= {
            "uid": old["metadata"]["uid"] if old else f"uid-{obj['kind'].lower()}-{meta['name']}",
            "resourceVersion": self._rv(),
            "creationTimestamp": old["metadata"]["creationTimestamp"] if old else rfc3339(T0 - 600),
            "generation": (old["metadata"]["generation"] + (old.get("spec") != obj.get("spec"))) if old else 1,
            "managedFields": copy.deepcopy(old["metadata"]["managedFields"]) if old else [],
        }
        new["status"] = copy.deepcopy(old.get("status") or {}) if old else {}
        if old and old.get("immutable") and old.get("data") != obj.get("data"):
            # the API server's answer to a changed immutable ConfigMap
            raise KubePermanentError(
                f"apply ConfigMap {meta['namespace']}/{meta['name']}: HTTP 422: field is immutable"
            )
        self.objects[key] = new
        if obj["kind"] == "Deployment":
            self.own_replicas(new, FIELD_MANAGER, "Apply")
            self.own_config_hash(new, FIELD_MANAGER, "Apply")
        return copy.deepcopy(new)

    def apply_all(self, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``Kube.apply_all``: every object applied (here in order), the first error raised once all were tried."""
        out: list[dict[str, Any]] = []
        first: Exception | None = None
        for obj in objs:
            try:
                out.append(self.apply(obj))
            except Exception as err:  # the adapter's contract: the first error, once all were tried
                first = first or err
        if first is not None:
            raise first
        return out

    def own_config_hash(self, dep: dict[str, Any], manager: str, operation: str) -> None:
        """managedFields after a write that set the pod template's config-hash annotation: ``manager`` owns it."""
        key = "f:batchfill.io/config-hash"
        entries = dep["metadata"]["managedFields"]
        for entry in entries:
            meta = entry["fieldsV1"].get("f:spec", {}).get("f:template", {}).get("f:metadata", {})
            meta.get("f:annotations", {}).pop(key, None)
        entry = next((e for e in entries if (e["manager"], e["operation"], e.get("subresource", "")) == (
            manager, operation, "")), None)  # fmt: skip
        if entry is None:
            entry = {"manager": manager, "operation": operation, "apiVersion": "apps/v1", "time": rfc3339(T0),
                     "fieldsType": "FieldsV1", "fieldsV1": {}}  # fmt: skip
            entries.append(entry)
        spec = entry["fieldsV1"].setdefault("f:spec", {})
        spec.setdefault("f:template", {}).setdefault("f:metadata", {}).setdefault("f:annotations", {})[key] = {}

    def rollout_undo(self, namespace: str, deployment: str, replica_set: str) -> None:
        """``kubectl rollout undo --to-revision``: the ReplicaSet's template patched into the Deployment by the
        field manager ``kubectl``, which thereby owns the fields it changed."""
        dep = self.objects[(*DEPLOYMENT, namespace, deployment)]
        dep["spec"]["template"] = copy.deepcopy(
            self.objects[("apps/v1", "ReplicaSet", namespace, replica_set)]["spec"]["template"]
        )
        dep["metadata"]["generation"] += 1
        dep["metadata"]["resourceVersion"] = self._rv()
        self.own_config_hash(dep, "kubectl", "Update")

    def scale_deployment(self, name: str, namespace: str, replicas: int) -> None:
        self.calls.append(("scale_deployment", namespace, name, replicas))
        dep = self.objects.get((*DEPLOYMENT, namespace, name))
        if dep is None:
            raise KubeNotFoundError(f"scale Deployment {namespace}/{name}: HTTP 404: not found")
        if self.refuse_scale:
            raise KubePermanentError(f"scale Deployment {namespace}/{name}: HTTP 422: {self.refuse_scale}")
        self.set_replicas(dep, replicas, FIELD_MANAGER, subresource="scale")

    def _listed(self, kind: str, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (_, k, ns, _), o in sorted(self.objects.items())
            if k == kind and ns == namespace and selector.items() <= (o["metadata"].get("labels") or {}).items()
        ]

    def list_config_maps(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        self.calls.append(("list_config_maps", namespace))
        return self._listed("ConfigMap", namespace, selector)

    def list_replica_sets(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        self.calls.append(("list_replica_sets", namespace))
        return self._listed("ReplicaSet", namespace, selector)

    # -- the rest of the cluster (the Deployment controller, the kubelets, people) ------------------------------

    def collect_garbage(self) -> list[str]:
        """The garbage collector: delete every object whose owners are all gone (returns their names)."""
        uids = {o["metadata"]["uid"] for o in self.objects.values()} | {
            m["metadata"]["uid"] for m in self.models.values()
        }
        gone = [
            key
            for key, o in self.objects.items()
            if (refs := o["metadata"].get("ownerReferences")) and not any(r["uid"] in uids for r in refs)
        ]
        for key in gone:
            del self.objects[key]
        return sorted(key[3] for key in gone)

    def roll(self, namespace: str, deployment: str, revision: int) -> str:
        """The Deployment controller: a ReplicaSet with the Deployment's current template (returns its name)."""
        dep = self.objects[(*DEPLOYMENT, namespace, deployment)]
        name = f"{deployment}-rs{revision}"
        self.objects[("apps/v1", "ReplicaSet", namespace, name)] = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-rs-{name}",
                "labels": dict(dep["spec"]["template"]["metadata"]["labels"]),
                "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                "ownerReferences": [
                    {"kind": "Deployment", "name": deployment, "uid": dep["metadata"]["uid"], "controller": True}
                ],
            },
            "spec": {"template": copy.deepcopy(dep["spec"]["template"])},
        }
        return name

    def own_replicas(self, dep: dict[str, Any], manager: str, operation: str, subresource: str = "") -> None:
        """managedFields after a write of spec.replicas: ``manager`` owns the field, nobody else does."""
        entries = dep["metadata"]["managedFields"]
        for entry in entries:
            entry["fieldsV1"].get("f:spec", {}).pop("f:replicas", None)
        wanted = {"manager": manager, "operation": operation, "apiVersion": "apps/v1", "time": rfc3339(T0),
                  "fieldsType": "FieldsV1"} | ({"subresource": subresource} if subresource else {})  # fmt: skip
        entry = next((e for e in entries if {k: e.get(k) for k in wanted if k != "time"} == {
            k: v for k, v in wanted.items() if k != "time"}), None)  # fmt: skip
        if entry is None:
            entry = wanted | {"fieldsV1": {}}
            entries.append(entry)
        entry["fieldsV1"].setdefault("f:spec", {})["f:replicas"] = {}

    def set_replicas(self, dep: dict[str, Any], replicas: int, manager: str, subresource: str = "") -> None:
        if dep["spec"].get("replicas") != replicas:
            dep["metadata"]["generation"] += 1
            if "status" in dep:  # the Deployment controller observes a scale at once (its pods come later)
                dep["status"]["observedGeneration"] = dep["metadata"]["generation"]
        dep["spec"]["replicas"] = replicas
        dep["metadata"]["resourceVersion"] = self._rv()
        self.own_replicas(dep, manager, "Update", subresource)

    def create_model(self, name: str, spec: Mapping[str, Any]) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": f"uid-bm-{name}",
                "generation": 1,
                "resourceVersion": self._rv(),
                "creationTimestamp": rfc3339(T0 - 600),
            },
            "spec": copy.deepcopy(dict(spec)),
        }
        self.models[(NS, name)] = apply_defaults(body, ROOT_SCHEMA)

    def handle(self, name: str, now: float = T0) -> None:
        """The create/update handler: reconcile, then kopf patches the status it returns (no precondition)."""
        stored = self.models[(NS, name)]
        body = copy.deepcopy(stored)
        self.write_status(stored, reconcile(body, self, now=now, emit=emitter(self, body)))  # type: ignore[arg-type]

    def run_pods(
        self, name: str, *, ready: int, starting: int = 0, pending: int = 0, first: int = 0, failing: int = 0
    ) -> list[str]:
        """The model's pods become ``ready`` Ready ones, then ``starting``, ``pending`` and ``failing`` ones
        (tritonserver exits 1 on a model it cannot load, the kubelet backs off: CRASH_LOOP; indices from ``first``;
        a pod keeps its uid and IP while its index stays), and the Deployment's status says so.
        Returns the pods' names."""
        owner = Owner(name=name, namespace=NS, uid=self.models[(NS, name)]["metadata"]["uid"])
        dep = self.objects[(*DEPLOYMENT, NS, names(owner)["deployment"])]
        self.pods = {k: p for k, p in self.pods.items() if not _matches(p, selector_labels(owner))}
        states = ["ready"] * ready + ["starting"] * starting + ["pending"] * pending + ["failing"] * failing
        out = []
        for i, state in enumerate(states, start=first):
            pod_name = f"{names(owner)['deployment']}-6b8f9c7d4-{i}"
            ip = f"10.244.0.{10 + i}"
            scheduled = {"type": "PodScheduled", "status": "True"}
            if state == "pending":
                scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}  # fmt: skip
            conditions = [scheduled]
            if state != "pending":
                up = "True" if state == "ready" else "False"
                conditions += [{"type": "Initialized", "status": "True"}, {"type": "ContainersReady", "status": up},
                               {"type": "Ready", "status": up}]  # fmt: skip
            status: dict[str, Any] = {"phase": "Running" if state == "ready" else "Pending", "conditions": conditions}
            if state != "pending":
                status |= {"podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "172.18.0.2"}
            if state == "failing":
                status |= {"phase": "Running", "containerStatuses": [copy.deepcopy(CRASH_LOOP)]}
            self.pods[(NS, pod_name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "namespace": NS,
                    "uid": f"uid-pod-{i}",
                    "resourceVersion": self._rv(),
                    "labels": {**selector_labels(owner), "pod-template-hash": "6b8f9c7d4"},
                },
                "spec": {"nodeName": "" if state == "pending" else "gpu-node-0", "containers": [{"name": "triton"}]},
                "status": status,
            }
            out.append(pod_name)
        dep["status"] = {"observedGeneration": dep["metadata"]["generation"], "replicas": len(states) - pending,
                         "updatedReplicas": len(states) - pending} | (
                             {"readyReplicas": ready, "availableReplicas": ready} if ready else {})  # fmt: skip
        dep["metadata"]["resourceVersion"] = self._rv()
        return out


class FakeView:
    """``adapters.informer.CachedView`` over a FakeKube: Deployments and pods from the caches (trimmed as the
    informer trims them), everything else from the API."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.stale = ""  # a cache whose watch broke: check() raises

    def check(self, kinds: tuple[str, ...] = ("pods", "deployments")) -> None:
        self.kube.calls.append(("cache.check", tuple(kinds)))
        if self.stale:
            raise KubeTemporaryError(self.stale)

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        self.kube.calls.append(("cache.list_pods", namespace))
        pods = sorted(self.kube.pods.items())
        return [_trim_pod(copy.deepcopy(p)) for (ns, _), p in pods if ns == namespace and _matches(p, selector)]

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        if (api_version, kind) == DEPLOYMENT:
            self.kube.calls.append(("cache.get", kind, namespace, name))
            found = self.kube.objects.get((api_version, kind, namespace, name))
            if found is not None:
                return _trim_deployment(copy.deepcopy(found))
        return self.kube.get(api_version, kind, name, namespace)  # not in the cache: asked by name

    def has_kind(self, api_version: str, kind: str) -> bool:
        return self.kube.has_kind(api_version, kind)


class FakePrometheus:
    """The source behind SignalHub (PrometheusSignals' ``window_s`` and ``query_all``), from per-pod series."""

    window_s = 60.0

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str], dict[str, float]] = {}
        self.failure: QueryFailure | None = None
        self.query_sets = 0

    def serve(self, pods: Sequence[str], *, rps: float, batch: float, queue_ms: float) -> None:
        """Each of ``pods`` served ``rps / len(pods)`` requests/s of one sample, in batches of ``batch``."""
        w = self.window_s
        self.series = {
            (NS, pod, MODEL["name"]): {
                "success": rps / len(pods) * w,
                "inferences": rps / len(pods) * w,
                "executions": rps / len(pods) * w / batch,
                "queue_us": rps / len(pods) * w * queue_ms * 1000.0,
                "pending": 0.0,
            }
            for pod in pods
        }

    def query_all(self, targets: Sequence[SignalTarget]) -> QueryResults | QueryFailure:
        self.query_sets += 1
        if self.failure is not None:
            return self.failure
        fields = ("success", "inferences", "executions", "queue_us", "pending")
        return QueryResults(**{f: {k: v[f] for k, v in self.series.items()} for f in fields})


def writes(kube: FakeKube) -> list[tuple[Any, ...]]:
    """The writes among the calls, in order, in short: (apply, kind), (status, fields), (scale, n), (event, reason)."""
    out: list[tuple[Any, ...]] = []
    for call in kube.calls:
        if call[0] == "apply":
            out.append(("apply", call[1]))
        elif call[0] == "patch_status":
            out.append(("status", sorted(call[3])))
        elif call[0] == "scale_deployment":
            out.append(("scale", call[3]))
        elif call[0] == "post_event":
            out.append(("event", call[4]))
    return out


def gpu_hours_of(name: str) -> float:
    """The operator's GPU-hours counter of a model (process-wide: compare before and after)."""
    labels = {"namespace": NS, "name": name}
    return operator_metrics.REGISTRY.get_sample_value("batchfill_gpu_hours_total", labels) or 0.0


def stored(kube: FakeKube, name: str) -> dict[str, Any]:
    return kube.models[(NS, name)]


def replicas(kube: FakeKube, name: str) -> int:
    return int(kube.objects[(*DEPLOYMENT, NS, f"{name}-triton")]["spec"]["replicas"])


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    fake = FakeKube()
    yield fake
    assert fake.invalid == [], "a status the API server would reject (CRD schema)"


def scaling_loop(kube: FakeKube, prom: FakePrometheus) -> ScalingLoop:
    settings = OperatorSettings(reconcile_interval_s=15.0)
    return ScalingLoop(kube, FakeView(kube), SignalHub(prom, max_age_s=15.0), settings)  # type: ignore[arg-type]


def planned_model(kube: FakeKube, name: str, spec: Mapping[str, Any], *, mode: str = "Auto") -> list[str]:
    """A model the create handler planned and applied, with one Ready pod; the calls so far forgotten."""
    kube.create_model(name, {**spec, "scaling": {**spec.get("scaling", {}), "mode": mode}})
    kube.handle(name)
    pods = kube.run_pods(name, ready=1)
    kube.calls.clear()
    kube.events.clear()
    return pods


# -- capacity of SCALING_SPEC's plan: u·C = 0.8 · 58.4 req/s per replica; saturated at a batch fill of 0.175 --

LOW = {"rps": 20.0, "batch": 2.0, "queue_ms": 0.5}  # fill 2/16, needs 0.43 replicas: within tolerance of 1
HIGH = {"rps": 70.0, "batch": 4.0, "queue_ms": 0.5}  # fill 4/16 >= 0.175, needs 1.5 replicas: saturated


def test_plan_numbers_the_scaling_scenarios_rely_on() -> None:
    plan = desired_state(SCALING_SPEC).plan_status
    assert (plan.maxBatchSize, plan.capacityPerReplicaRps, plan.batchFillAtTarget) == (16, 58.4, 0.175)


def test_scaling_ticks_steady_then_scale_out_then_capacity_on_the_way(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)

    loop.tick(T0)  # first decision: the scaling fields and the Ready pod (since the handler ran); the new reason
    assert writes(kube) == [
        ("status", ["appliedReplicas", "conditions", "desiredReplicas", "effectiveTargetUtilization",
                    "lastScaleReason", "observed", "readyReplicas", "replicas", "scalingHistory"]),
        ("event", ScalingReason.HOLD_WITHIN_TOLERANCE),
    ]  # fmt: skip
    reads = [c for c in kube.calls if c[0] not in WRITES]
    assert reads == [
        ("list_batched_models",),
        ("cache.check", ("pods", "deployments")),
        ("has_kind", "ServiceMonitor"),  # not served: not asked for the object
        ("cache.get", "Deployment", NS, "m-triton"),
        ("cache.list_pods", NS),
    ]
    memory = loop.memory["uid-bm-m"]
    assert [(h.time, h.replicas) for h in memory.history] == [(T0, 1), (T0, 1)]  # no history yet: now's count, vote
    assert (memory.last_tick, memory.holding, memory.monitored) == (T0, 1, False)
    status = stored(kube, "m")["status"]
    assert (status["desiredReplicas"], status["appliedReplicas"], status["lastScaleReason"]) == (
        1, 1, ScalingReason.HOLD_WITHIN_TOLERANCE)  # fmt: skip

    kube.calls.clear()
    gpu_hours = gpu_hours_of("m")
    loop.tick(T0 + 15)  # the same load: a steady tick writes nothing
    assert writes(kube) == []
    memory = loop.memory["uid-bm-m"]
    assert (memory.history[0].time, memory.history[-1].time) == (T0, T0 + 15), "votes carried from tick to tick"
    assert memory.last_tick == T0 + 15
    assert gpu_hours_of("m") - gpu_hours == pytest.approx(1 * 1 * 15 / 3600), "1 pod, 1 GPU, the 15 s between ticks"

    kube.calls.clear()
    prom.serve(pods, **HIGH)
    loop.tick(T0 + 30)  # saturated: status first (it records the count), then the scale subresource, then the event
    assert writes(kube) == [
        ("status", ["appliedReplicas", "desiredReplicas", "lastScaleReason", "lastScaleTime", "observed",
                    "scalingHistory"]),
        ("scale", 2),
        ("event", ScalingReason.SCALE_OUT_SATURATED),
    ]  # fmt: skip
    assert replicas(kube, "m") == 2
    assert stored(kube, "m")["status"]["appliedReplicas"] == 2
    assert loop.memory["uid-bm-m"].history[-1].replicas == 2

    kube.calls.clear()
    pods = kube.run_pods("m", ready=1, starting=1)  # the new replica is scheduled, its model still loading
    prom.serve(pods[:1], **HIGH)
    loop.tick(T0 + 45)
    assert writes(kube) == [
        ("status", ["conditions", "lastScaleReason", "replicas"]),  # Ready: 1/2; the same vote as the last one
        ("event", ScalingReason.HOLD_CAPACITY_ON_THE_WAY),
    ]
    assert replicas(kube, "m") == 2, "no second step for the same evidence"
    assert loop.memory["uid-bm-m"].holding == 2, "the starting pod holds its GPU too"


def test_a_status_write_that_loses_the_race_changes_nothing_and_the_next_tick_decides_again(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **HIGH)
    loop = scaling_loop(kube, prom)
    loop.memory["uid-bm-m"] = before = ScalingMemory(monitored=False)

    def handler_writes_status() -> None:  # e.g. the update handler, between the loop's list and its write
        kube.write_status(stored(kube, "m"), {"readyReplicas": 1})

    kube.before_status_patch = handler_writes_status
    loop.tick(T0)
    assert writes(kube) == [
        ("status", ["appliedReplicas", "conditions", "desiredReplicas", "effectiveTargetUtilization",
                    "lastScaleReason", "lastScaleTime", "observed", "readyReplicas", "replicas", "scalingHistory"]),
    ], "a lost status write: no scale, no event"  # fmt: skip
    assert replicas(kube, "m") == 1
    assert loop.memory["uid-bm-m"] == before, "the decision's votes are not kept"

    kube.calls.clear()
    loop.tick(T0 + 15)
    assert [w[0] for w in writes(kube)] == ["status", "scale", "event"]
    assert replicas(kube, "m") == 2
    assert {h.time for h in loop.memory["uid-bm-m"].history} == {T0 + 15}, "only the votes of the tick that landed"


def test_a_hand_edited_replica_count_is_restored_in_auto(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    kube.calls.clear()
    kube.events.clear()

    dep = kube.objects[(*DEPLOYMENT, NS, "m-triton")]
    kube.set_replicas(dep, 3, "kubectl", subresource="scale")  # kubectl scale --replicas 3
    loop.tick(T0 + 15)
    assert writes(kube) == [("status", ["lastScaleTime"]), ("scale", 1), ("event", EventReason.MANUAL_SCALE_REVERTED)]
    [(_, _, message)] = kube.events
    assert message.startswith("Deployment replicas 3 were set outside batchfill by kubectl;"), message
    assert replicas(kube, "m") == 1


def test_a_scale_refused_after_its_status_landed_is_resumed_by_the_next_operator(kube: FakeKube) -> None:
    """The status write records appliedReplicas before the scale call; a restarted operator (empty memory)
    continues from status: one scale to the recorded count, a ScaleResumed event, no second step."""
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **HIGH)
    loop = scaling_loop(kube, prom)
    kube.refuse_scale = "no scaling here (test policy)"
    loop.tick(T0)
    assert [w[0] for w in writes(kube)] == ["status", "scale"], "the refused scale ends the tick: no event"
    assert stored(kube, "m")["status"]["appliedReplicas"] == 2
    assert replicas(kube, "m") == 1
    assert "uid-bm-m" not in loop.memory, "a tick whose writes failed leaves no memory"

    kube.refuse_scale = ""
    kube.calls.clear()
    restarted = scaling_loop(kube, prom)
    restarted.tick(T0 + 15)
    assert writes(kube) == [
        ("status", ["lastScaleReason", "lastScaleTime"]),
        ("scale", 2),
        ("event", EventReason.SCALE_RESUMED),
        ("event", ScalingReason.HOLD_CAPACITY_ON_THE_WAY),  # 2 replicas for the load, 1 Ready: no second step
    ]
    assert replicas(kube, "m") == 2
    history = restarted.memory["uid-bm-m"].history
    assert (history[0].time, history[-1].replicas) == (T0, 2), "the votes come from status.scalingHistory"


def test_a_service_monitor_appears_with_prometheus_operator_and_is_then_not_looked_for(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    kube.calls.clear()

    kube.served.add(SERVICE_MONITOR)  # prometheus-operator installed after the model
    loop.tick(T0 + 15)
    assert ("get", "ServiceMonitor", NS, "m-triton") in kube.calls
    assert writes(kube) == [("apply", "ServiceMonitor")], "applied before anything else; steady otherwise"
    assert loop.memory["uid-bm-m"].monitored

    kube.calls.clear()
    loop.tick(T0 + 30)
    assert [c for c in kube.calls if "ServiceMonitor" in c] == [], "seen once: not looked for again"


def test_a_service_monitor_kind_gone_since_discovery_is_looked_for_again(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    kube.calls.clear()

    served_then_gone = kube.has_kind

    def discovery_says_served(api_version: str, kind: str) -> bool:
        return (api_version, kind) == SERVICE_MONITOR or served_then_gone(api_version, kind)

    kube.has_kind = discovery_says_served  # type: ignore[method-assign]  # a cached discovery answer
    loop.tick(T0 + 15)
    assert ("apply", "ServiceMonitor", NS, "m-triton") in kube.calls
    assert ("forget_kinds",) in kube.calls, "the 404 drops the cached discovery"
    assert not loop.memory["uid-bm-m"].monitored


def test_a_new_models_first_reconcile_reads_nothing_and_writes_what_a_full_one_writes(kube: FakeKube) -> None:
    """The create handler's first attempt skips the Deployment read and the config listing (three API requests
    per new model, ``docs/benchmarks/scale.md``); its writes and status are those of a full reconcile."""
    results = []
    for first in (True, False):
        name = f"m-{first}".lower()
        kube.create_model(name, SCALING_SPEC)
        body = copy.deepcopy(kube.models[(NS, name)])
        kube.calls.clear()
        status = reconcile(body, kube, now=T0, emit=emitter(kube, body), first=first)  # type: ignore[arg-type]
        reads = [c for c in kube.calls if c[0] in ("get", "list_config_maps", "list_replica_sets")]
        results.append((writes(kube), status, reads))
    (first_writes, first_status, first_reads), (full_writes, full_status, full_reads) = results
    assert first_reads == []
    assert len(full_reads) == 3
    assert first_writes == full_writes == [("apply", "ConfigMap"), ("apply", "Deployment"), ("apply", "Service"),
                                           ("event", EventReason.DEPLOYED)]  # fmt: skip
    assert first_status == full_status


def test_a_new_models_handler_writes_its_first_ticks_fields_so_that_tick_writes_nothing(kube: FakeKube) -> None:
    """The handler's status of a new model carries what the scaling loop's first tick writes while no pod is Ready
    (``controller.handlers._first_tick``): that tick, before the Deployment has a pod, makes no request; the pod
    turning Ready is still written. Without it the first tick wrote the scaling fields (benchmarks/scale.py: 898 of
    1,000 new models' first ticks)."""
    prom = FakePrometheus()
    memo = kopf.Memo()
    memo.signal_hub, memo.settings = SignalHub(prom, max_age_s=15.0), OperatorSettings(reconcile_interval_s=15.0)
    first_tick = _first_tick(memo)
    assert first_tick is not None
    for name, hook in (("with", first_tick), ("without", None)):
        kube.create_model(name, SCALING_SPEC)
        body = copy.deepcopy(kube.models[(NS, name)])
        status = reconcile(body, kube, now=T0, emit=emitter(kube, body), first=True, first_tick=hook)  # type: ignore[arg-type]
        kube.write_status(kube.models[(NS, name)], status)
    handled = stored(kube, "with")["status"]
    assert (handled["lastScaleReason"], handled["desiredReplicas"], handled["appliedReplicas"]) == (
        ScalingReason.HOLD_METRICS_UNKNOWN, 1, 1)  # fmt: skip
    metrics = find(handled["conditions"], ConditionType.METRICS_AVAILABLE)
    assert metrics is not None
    assert metrics["reason"] == SignalsReason.NO_READY_PODS
    kube.calls.clear()
    loop = scaling_loop(kube, prom)
    loop.tick(T0 + 15)
    status_writes = [c for c in kube.calls if c[0] == "patch_status"]
    assert [c[2] for c in status_writes] == ["without"], "the first tick of the model handled with it writes nothing"
    assert sorted(status_writes[0][3]) == [
        "appliedReplicas", "conditions", "desiredReplicas", "effectiveTargetUtilization", "lastScaleReason",
        "scalingHistory",
    ]  # fmt: skip
    same = {"conditions": None, "scalingHistory": None}  # the vote's time: the handler's, or the tick's
    assert stored(kube, "with")["status"] | same == stored(kube, "without")["status"] | same
    assert [(v["replicas"], v["ready"]) for v in stored(kube, "with")["status"]["scalingHistory"]] == [(1, 0)]
    kube.run_pods("with", ready=1)
    kube.calls.clear()
    loop.tick(T0 + 30)
    assert ("patch_status", NS, "with") in [c[:3] for c in kube.calls], "a pod turning Ready is written"


def test_a_first_reconcile_of_a_model_with_a_status_reads_its_children(kube: FakeKube) -> None:
    """``first`` holds only for an object with no status: a spec rejected before, then fixed, may have none of
    its children, but a model whose status says it was served may have all of them (and its replica count)."""
    planned_model(kube, "m", SCALING_SPEC)
    kube.scale_deployment("m-triton", NS, 2)
    body = copy.deepcopy(kube.models[(NS, "m")])
    kube.calls.clear()
    reconcile(body, kube, now=T0, emit=emitter(kube, body), first=True)  # type: ignore[arg-type]
    assert ("get", "Deployment", NS, "m-triton") in kube.calls
    assert kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["replicas"] == 2, "the scaled count is kept"


def test_a_deployment_deleted_by_hand_is_applied_again_instead_of_scaled(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    memory = loop.memory["uid-bm-m"]
    kube.calls.clear()

    del kube.objects[(*DEPLOYMENT, NS, "m-triton")]
    loop.tick(T0 + 15)
    assert writes(kube) == [
        ("apply", "ConfigMap"),
        ("apply", "Deployment"),
        ("apply", "Service"),
        ("event", EventReason.DEPLOYED),
        ("status", ["conditions", "readyReplicas", "replicas"]),  # the new Deployment has no pods yet
    ]
    assert ("get", "Deployment", NS, "m-triton") in kube.calls, "a Deployment missing from the cache is asked for"
    assert loop.memory["uid-bm-m"] == memory, "a re-apply is not a decision: the votes stay as they were"


def test_a_generation_not_handled_yet_reads_and_writes_nothing(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **HIGH)
    loop = scaling_loop(kube, prom)
    loop.memory["uid-bm-m"] = ScalingMemory(monitored=True)
    stored(kube, "m")["metadata"]["generation"] = 2  # spec edited; the update handler has not run yet
    loop.tick(T0)
    assert kube.calls == [("list_batched_models",), ("cache.check", ("pods", "deployments"))]
    assert loop.memory["uid-bm-m"] == ScalingMemory(monitored=False)


def test_two_loops_re_applying_at_once_roll_the_deployment_once(kube: FakeKube) -> None:
    """The profiling loop's re-plan and the scaling loop's drift re-apply run on threads of their own: the second
    must read the Deployment as the first applied it (one roll, one ConfigChanged), not as both found it."""
    planned_model(kube, "m", SCALING_SPEC)
    stored(kube, "m")["spec"]["sla"]["latencyP99Ms"] = 150  # a new plan, as an adopted profile would give
    both_read = threading.Barrier(2, timeout=1.0)
    read_deployment = kube.get

    def get(api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        found = read_deployment(api_version, kind, name, namespace)
        if kind == "Deployment":
            with contextlib.suppress(threading.BrokenBarrierError):
                both_read.wait()  # without the lock both threads hold the old Deployment here
        return found

    kube.get = get  # type: ignore[method-assign]
    threads = [threading.Thread(target=reapply, args=(kube, "m", NS), kwargs={"now": T0}) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert [r for _, r, _ in kube.events] == [EventReason.CONFIG_CHANGED]
    assert [w for w in writes(kube) if w == ("apply", "Deployment")] == [("apply", "Deployment")] * 2


def test_a_generation_unhandled_past_the_bound_is_reconciled_by_the_loop_with_one_event(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)  # unhandled_generation_s: the default, 60 s
    model = stored(kube, "m")
    model["spec"]["sla"]["latencyP99Ms"] = 150  # edited; kopf's watch never delivers it (stalled)
    model["metadata"]["generation"] = 2
    config_before = kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["template"]["metadata"]["annotations"]

    loop.tick(T0)  # first seen unobserved
    loop.tick(T0 + 45)
    loop.tick(T0 + 60)  # exactly the bound: still the handler's to do
    assert writes(kube) == []
    assert loop.lags["uid-bm-m"].since == T0

    loop.tick(T0 + 61)
    assert writes(kube) == [
        ("event", EventReason.GENERATION_UNHANDLED),
        ("apply", "ConfigMap"),
        ("apply", "Deployment"),
        ("apply", "Service"),
        ("apply", "ConfigMap"),  # the older config, handed to the ReplicaSets that mount it
        ("event", EventReason.CONFIG_CHANGED),
        ("status", ["conditions", "observedGeneration", "plan", "readyReplicas", "replicas"]),
    ]
    assert "generation 2 was not handled for 61 s (observed: 1;" in kube.events[0][2]
    assert stored(kube, "m")["status"]["observedGeneration"] == 2
    template = kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["template"]["metadata"]["annotations"]
    assert template != config_before, "the edited SLA's config is rolled out"

    kube.calls.clear()
    loop.tick(T0 + 76)  # observed now: an ordinary scaling tick, no second event
    assert "uid-bm-m" not in loop.lags
    assert EventReason.GENERATION_UNHANDLED not in [w[1] for w in writes(kube) if w[0] == "event"]
    assert ("get", "Deployment", NS, "m-triton") not in kube.calls


def test_a_lagging_generation_waits_while_its_watch_delivers_others(kube: FakeKube) -> None:
    """A busy handler queue (a fleet applied at once) is not a stalled watch: while other generations of the same
    watch are observed within the bound, the loop leaves the lagging one to kopf, up to STUCK_HANDLER_BOUNDS."""
    prom = FakePrometheus()
    for name in ("a", "b"):
        prom.serve(planned_model(kube, name, SCALING_SPEC), **LOW)
    loop = scaling_loop(kube, prom)  # unhandled_generation_s: the default, 60 s
    for name in ("a", "b"):
        stored(kube, name)["metadata"]["generation"] = 2  # edited; the handlers have not run yet
    loop.tick(T0)
    stored(kube, "b")["status"]["observedGeneration"] = 2  # kopf handled b: its watch delivers
    loop.tick(T0 + 45)
    loop.tick(T0 + 61)
    loop.tick(T0 + 90)
    assert EventReason.GENERATION_UNHANDLED not in [w[1] for w in writes(kube) if w[0] == "event"]
    assert loop.progress == {"": T0 + 45}
    loop.tick(T0 + 106)  # the last progress is 61 s old: a stall after all
    assert [w for w in writes(kube) if w == ("event", EventReason.GENERATION_UNHANDLED)] == [
        ("event", EventReason.GENERATION_UNHANDLED)
    ]
    assert stored(kube, "a")["status"]["observedGeneration"] == 2


def test_an_unhandled_generation_whose_reconcile_fails_is_retried_each_tick_with_one_event(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)
    model = stored(kube, "m")
    model["spec"]["sla"]["latencyP99Ms"] = 150
    model["metadata"]["generation"] = 2
    loop.tick(T0)
    real_get = kube.get_batched_model

    def unavailable(name: str, namespace: str) -> dict[str, Any] | None:
        raise KubeTemporaryError("get BatchedModel: HTTP 503")

    kube.get_batched_model = unavailable  # type: ignore[method-assign]
    loop.tick(T0 + 61)
    loop.tick(T0 + 76)
    assert writes(kube) == [("event", EventReason.GENERATION_UNHANDLED)]
    assert stored(kube, "m")["status"]["observedGeneration"] == 1

    kube.get_batched_model = real_get  # type: ignore[method-assign]
    loop.tick(T0 + 91)
    assert [w for w in writes(kube) if w[0] == "event"] == [
        ("event", EventReason.GENERATION_UNHANDLED),
        ("event", EventReason.CONFIG_CHANGED),
    ]
    assert stored(kube, "m")["status"]["observedGeneration"] == 2

    del kube.models[(NS, "m")]
    model["metadata"]["generation"] = 3
    kube.models[(NS, "m")] = model
    loop.tick(T0 + 106)
    assert loop.lags["uid-bm-m"].since == T0 + 106, "a newer generation has a lag of its own"
    del kube.models[(NS, "m")]
    loop.tick(T0 + 121)
    assert loop.lags == {}, "a deleted model is forgotten"


def test_a_pass_with_stale_caches_is_skipped_and_a_deleted_model_is_forgotten(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    assert set(loop.memory) == {"uid-bm-m"}
    kube.calls.clear()

    loop.view.stale = "pods in all namespaces: watch broken for 31 s"  # type: ignore[attr-defined]
    loop.tick(T0 + 15)
    assert writes(kube) == []
    assert loop.memory["uid-bm-m"].last_tick == T0, "a skipped pass keeps the memory"

    loop.view.stale = ""  # type: ignore[attr-defined]
    del kube.models[(NS, "m")]
    loop.tick(T0 + 30)
    assert loop.memory == {}


def test_prometheus_down_holds_and_warns_once(kube: FakeKube) -> None:
    pods = planned_model(kube, "m", SCALING_SPEC)
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    kube.calls.clear()
    kube.events.clear()

    prom.failure = QueryFailure(SignalsReason.PROMETHEUS_UNAVAILABLE, "connection refused")
    loop.tick(T0 + 15)
    assert writes(kube) == [
        ("status", ["conditions", "lastScaleReason", "observed"]),
        ("event", ScalingReason.HOLD_METRICS_UNKNOWN),
    ]
    assert kube.events[0][0] == "Warning"
    metrics = find(stored(kube, "m")["status"]["conditions"], ConditionType.METRICS_AVAILABLE)
    assert metrics is not None
    assert (metrics["status"], metrics["reason"]) == ("False", SignalsReason.PROMETHEUS_UNAVAILABLE)
    kube.calls.clear()
    loop.tick(T0 + 30)
    assert writes(kube) == [], "once per outage"


# -- profiling -----------------------------------------------------------------------------------------------


def triton_stats(batches: Mapping[int, int], alpha_ms: float = 40.0, beta_ms: float = 6.0) -> dict[str, Any]:
    """Triton's ``/v2/models/sleep/stats`` JSON (HTTP: numbers as numbers) with ``batches[b]`` executions of
    batch size b, each taking ``alpha_ms + beta_ms * b`` (input 0.1 ms, output 0.2 ms, the rest infer)."""

    def duration(count: int, ns: float) -> dict[str, int]:
        return {"count": count, "ns": round(ns)}

    batch_stats = [
        {
            "batch_size": b,
            "compute_input": duration(n, n * 0.1e6),
            "compute_infer": duration(n, n * (alpha_ms + beta_ms * b - 0.3) * 1e6),
            "compute_output": duration(n, n * 0.2e6),
        }
        for b, n in sorted(batches.items())
    ]
    inferences = sum(b * n for b, n in batches.items())
    return {
        "model_stats": [
            {
                "name": "sleep",
                "version": "1",
                "last_inference": 1_764_000_000_000,
                "inference_count": inferences,
                "execution_count": sum(batches.values()),
                "inference_stats": {"success": duration(inferences, inferences * 60e6)},
                "batch_stats": batch_stats,
            }
        ]
    }


@pytest.fixture
def tritons(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """address -> the statistics JSON its Triton answers (an address not in it refuses the connection)."""
    import tritonclient.http

    servers: dict[str, dict[str, Any]] = {}

    class Client:
        def __init__(self, url: str, **_: Any) -> None:
            self.url = url

        def get_inference_statistics(self, model_name: str = "", **_: Any) -> dict[str, Any]:
            if self.url not in servers:
                raise ConnectionRefusedError(111, "Connection refused")
            return copy.deepcopy(servers[self.url])

        def close(self) -> None:
            pass

    monkeypatch.setattr(tritonclient.http, "InferenceServerClient", Client)
    return servers


def profiling_loop(kube: FakeKube) -> ProfilingLoop:
    return ProfilingLoop(kube, FakeView(kube), OperatorSettings(profile_interval_s=60.0))  # type: ignore[arg-type]


def test_profiling_ticks_baseline_then_adopt_then_a_restarted_triton(
    kube: FakeKube, tritons: dict[str, dict[str, Any]]
) -> None:
    planned_model(kube, "p", PROFILING_SPEC)
    assert stored(kube, "p")["status"]["plannedProfile"]["source"] == PlannedProfileSource.FIRST_PLAN
    tritons["10.244.0.10:8000"] = triton_stats({1: 5})  # warm-up
    loop = profiling_loop(kube)

    loop.tick(T0)  # first read: the pod's baseline; nothing measured, nothing written
    assert kube.calls == [("list_batched_models",), ("cache.check", ("pods",)), ("cache.list_pods", NS)]
    memory = loop.memory["uid-bm-p"]
    assert memory.baselines["uid-pod-0"].batches == {1: (5, 5 * 46_000_000)}

    kube.calls.clear()
    tritons["10.244.0.10:8000"] = triton_stats({1: 55, 2: 50, 3: 50})
    loop.tick(T0 + 60)  # deltas since the baseline: measured, adopted, the children applied with the new plan
    assert [c for c in kube.calls if c[0] == "get_batched_model"] == [("get_batched_model", NS, "p")] * 2
    assert writes(kube) == [
        ("status", ["measuredProfile", "plannedProfile"]),
        ("event", ReplanReason.PROFILE_MEASURED),
        ("apply", "ConfigMap"),
        ("apply", "Deployment"),
        ("apply", "Service"),
        ("apply", "ConfigMap"),  # the first plan's config, handed to the Deployment (no ReplicaSet mounts it here)
        ("event", EventReason.CONFIG_CHANGED),
        ("status", ["conditions", "plan", "readyReplicas", "replicas"]),  # the pod Ready since the handler ran
    ]
    status = stored(kube, "p")["status"]
    points = {p["batchSize"]: p["latencyMs"] for p in status["measuredProfile"]["points"]}
    assert (points[1], points[3]) == (pytest.approx(46.0), pytest.approx(58.0))
    assert (status["measuredProfile"]["pods"], status["plannedProfile"]["source"]) == (1, PlannedProfileSource.MEASURED)
    assert loop.memory["uid-bm-p"].baselines == memory.baselines, "the baseline stays the first read"

    kube.calls.clear()
    tritons["10.244.0.10:8000"] = triton_stats({1: 3})  # Triton restarted in the pod: counters from zero
    loop.tick(T0 + 120)
    assert writes(kube) == []
    assert loop.memory["uid-bm-p"].baselines["uid-pod-0"].batches == {1: (3, 3 * 46_000_000)}


def test_a_pod_that_goes_and_a_new_pod_start_from_their_own_baselines(
    kube: FakeKube, tritons: dict[str, dict[str, Any]]
) -> None:
    planned_model(kube, "p", PROFILING_SPEC)
    tritons["10.244.0.10:8000"] = triton_stats({1: 5})
    loop = profiling_loop(kube)
    loop.tick(T0)
    kube.calls.clear()

    kube.run_pods("p", ready=1, first=1)  # pod 0 replaced by pod 1 (a roll, or a node drained)
    tritons["10.244.0.11:8000"] = triton_stats({1: 500, 2: 500, 3: 500})  # counts since its own start
    loop.tick(T0 + 60)
    assert writes(kube) == [], "a new pod's first read is its baseline, not a measurement"
    assert set(loop.memory["uid-bm-p"].baselines) == {"uid-pod-1"}, "the gone pod's baseline is dropped"


def test_unreadable_statistics_warn_once_after_two_minutes(kube: FakeKube, tritons: dict[str, dict[str, Any]]) -> None:
    planned_model(kube, "p", PROFILING_SPEC)  # its pod's Triton answers nothing
    loop = profiling_loop(kube)
    for t in (0.0, 60.0, UNREAD_WARNING_S, 150.0):
        loop.tick(T0 + t)
        if t < UNREAD_WARNING_S or t == 150.0:
            assert writes(kube) == [], t
        else:
            assert writes(kube) == [("event", EventReason.STATISTICS_UNAVAILABLE)]
            [(type_, _, message)] = kube.events
            assert type_ == "Warning"
            assert message.startswith(
                "for 120 s Triton statistics of none of the 1 Ready pod(s) could be read on port 8000 "
                "(e.g. 10.244.0.10: 10.244.0.10:8000: ConnectionRefusedError"
            )
        kube.calls.clear()
    memory = loop.memory["uid-bm-p"]
    assert (memory.unread, memory.unread_since, memory.warned_at) == (
        frozenset({"10.244.0.10"}), T0, T0 + UNREAD_WARNING_S)  # fmt: skip

    tritons["10.244.0.10:8000"] = triton_stats({1: 5})
    loop.tick(T0 + 180)
    memory = loop.memory["uid-bm-p"]
    assert (memory.unread, memory.unread_since, set(memory.baselines)) == (frozenset(), None, {"uid-pod-0"})
