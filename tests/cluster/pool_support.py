"""Helpers of the GPUPool tests on a real node (test_shared_pool.py, test_shared_moves.py): the sleep models as
BatchedModels, the GPUPool, reads of the pool's pods, Services and Triton repositories, and Poisson load through a
model's Service with each request's outcome counted."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.api.pool import POOL_PLURAL
from batchfill.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from batchfill.render.kube import HTTP_PORT, Owner, names
from batchfill.render.pool import LOADED, POOL_LABEL
from batchfill.testbed.balancer import BalancedLoad, ServiceEndpoints
from batchfill.testbed.install import CLAIM
from batchfill.testbed.loadgen import grpc_fp32_input

from .support import RealNodeLab

NETWORK_OVERHEAD_MS = 20


@dataclass(frozen=True)
class Sleep:
    """A BatchedModel, the Triton model name it serves, the sleep ``alpha_ms + beta_ms * b`` and its SLA p99."""

    name: str
    triton: str
    alpha_ms: float
    beta_ms: float
    p99_ms: int

    def profile(self) -> list[dict[str, float]]:
        """What the profile declares: a little above the sleep (Python-backend overhead)."""
        return [
            {"batchSize": b, "latencyMs": round(self.alpha_ms + 1 + (self.beta_ms + 0.2) * b, 1)} for b in (1, 2, 4, 8)
        ]


def model_doc(
    m: Sleep, namespace: str, placement: dict[str, Any], *, warmup: bool = False, **extra: Any
) -> dict[str, Any]:
    """The BatchedModel of ``m`` with ``spec.placement`` and further spec fields; profiling held off
    (``minExecutions``) so no measured re-plan reloads it mid-test. ``warmup``: ``spec.model.warmup: {}``."""
    spec: dict[str, Any] = {
        "model": {
            "name": m.triton,
            "backend": "python",
            "repository": {"pvc": {"claimName": CLAIM}},
            "inputs": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
        },
        "sla": {"latencyP99Ms": m.p99_ms, "networkOverheadMs": NETWORK_OVERHEAD_MS},
        "profile": m.profile(),
        "profiling": {"minExecutions": 1_000_000},
        "placement": placement,
        **extra,
    }
    if warmup:
        spec["model"]["warmup"] = {}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": m.name, "namespace": namespace}, "spec": spec}


def pool_doc(name: str, namespace: str, min_pods: int, max_pods: int) -> dict[str, Any]:
    """A GPUPool of one ``nvidia.com/gpu`` of 16 GiB per pod."""
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "gpuResource": "nvidia.com/gpu",
            "gpusPerPod": 1,
            "gpuMemoryMiB": 16384,
            "repository": {"pvc": {"claimName": CLAIM}},
            # the CPU image replaces it (BATCHFILL_TRITON_CPU_IMAGE)
            "triton": {"image": "nvcr.io/nvidia/tritonserver:24.10-py3"},
            "minPods": min_pods,
            "maxPods": max_pods,
            "maxModelsPerPod": 16,
        },
    }


@dataclass
class Pool:
    """The GPUPool ``name`` in ``namespace`` of a :class:`RealNodeLab`, and its models."""

    lab: RealNodeLab
    namespace: str
    name: str

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.lab.kube.api)

    def create_gpupool(self, min_pods: int, max_pods: int) -> None:
        """The GPUPool (:func:`pool_doc`), once its CRD is served."""
        self.lab.kube.kubectl("wait", "--for=condition=Established", f"crd/{POOL_PLURAL}.{GROUP}", "--timeout=60s")
        doc = pool_doc(self.name, self.namespace, min_pods, max_pods)
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, POOL_PLURAL, doc)

    def create(self, doc: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, doc)

    def bm(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        return obj

    def gpupool(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, POOL_PLURAL, self.name
        )
        return obj

    def delete(self, m: Sleep) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, m.name)
        except ApiException as e:
            if e.status != 404:
                raise

    def pods(self) -> list[Any]:
        """The pool's pods that are not terminating."""
        return [p for p in self.all_pods() if p.metadata.deletion_timestamp is None]

    def all_pods(self) -> list[Any]:
        core = self.lab.kube.core
        return list(core.list_namespaced_pod(self.namespace, label_selector=f"{POOL_LABEL}={self.name}").items)

    def ready_endpoints(self, m: Sleep) -> list[str]:
        """Ready addresses of the model's Service (its EndpointSlices)."""
        discovery = client.DiscoveryV1Api(self.lab.kube.api)
        service = names(Owner(m.name, self.namespace, ""))["service"]
        slices = discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={service}"
        )
        return sorted(
            a
            for s in slices.items
            for e in s.endpoints or []
            if e.conditions is None or e.conditions.ready is not False
            for a in e.addresses
        )

    def prometheus_query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.lab.prometheus.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=5) as r:
            result: list[dict[str, Any]] = json.loads(r.read())["data"]["result"]
            return result

    def loads(self, models: tuple[Sleep, ...], seed: int) -> list[tuple[Sleep, ServiceEndpoints, BalancedLoad]]:
        """Per model: its Service's ready endpoints (to enter as a context) and a Poisson load over them (to start)."""
        out = []
        for i, m in enumerate(models):
            service = names(Owner(m.name, self.namespace, ""))["service"]
            endpoints = ServiceEndpoints(self.lab.kube.api, self.namespace, service, "grpc", poll_s=0.25)
            inputs = grpc_fp32_input("INPUT0", [4], seed=seed + i)
            out.append((m, endpoints, BalancedLoad(m.triton, inputs, endpoints.endpoints, seed=seed + i)))
        return out


def repository_index(pod_ip: str) -> dict[str, str]:
    """``{model: state}`` of ``POST /v2/repository/index`` on the pod's Triton (a versionless model's row wins)."""
    req = urllib.request.Request(f"http://{pod_ip}:{HTTP_PORT}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        rows = json.loads(r.read())
    states: dict[str, str] = {}
    for row in rows:
        state = row.get("state") or "UNAVAILABLE"
        if states.get(row["name"]) != "READY":
            states[row["name"]] = state
    return states


#: The state :func:`states_of` gives a model on a pod whose Triton does not answer and that is not Ready.
NOT_SERVING = "not serving"


def states_of(pods: list[Any], triton: str) -> list[str] | None:
    """The model's repository state on each pod with an IP (``absent`` if not in its index); a pod whose Triton
    does not answer is :data:`NOT_SERVING` if it is terminating or not Ready (it serves nothing), and makes the
    answer None (ask again) if it is Ready and not terminating."""
    states = []
    for p in pods:
        if not p.status.pod_ip:
            continue
        try:
            states.append(repository_index(p.status.pod_ip).get(triton, "absent"))
        except OSError:
            if p.metadata.deletion_timestamp is None and pod_ready(p):
                return None
            states.append(NOT_SERVING)
    return states


def pod_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def figures(load: BalancedLoad, window: tuple[float, float] | None = None) -> tuple[int, int, float]:
    """(sent, failed, client p99 ms of the answered), of the requests due in ``window`` (monotonic s) if given."""
    samples = [s for s in load.samples if window is None or window[0] <= s.due_s < window[1]]
    answered = [s.latency_ms for s in samples if s.latency_ms is not None]
    p99 = float(np.percentile(answered, 99)) if answered else float("nan")
    return len(samples), len(samples) - len(answered), p99


def slowest(
    load: BalancedLoad, t0: float, window: tuple[float, float] | None = None, n: int = 6
) -> list[tuple[float, str, float, float]]:
    """The ``n`` slowest answered requests (of those due in ``window``, monotonic s, if given): when each was due
    (s after ``t0``), where it went, its latency and how late the load generator sent it (ms)."""
    due = [s for s in list(load.samples) if window is None or window[0] <= s.due_s < window[1]]
    answered = sorted((s for s in due if s.latency_ms is not None), key=lambda s: -(s.latency_ms or 0))
    return [
        (round(s.due_s - t0, 1), s.endpoint, round(s.latency_ms or 0, 1), round(s.late_ms or 0, 1))
        for s in answered[:n]
    ]


def models_on(pod: Any) -> list[str]:
    """The ``models.batchfill.io/`` labels the pod carries as loaded."""
    return sorted(k for k, v in (pod.metadata.labels or {}).items() if k.startswith("models.") and v == LOADED)
