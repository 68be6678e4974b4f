"""The Triton pods batchfill renders, run by a real kubelet and containerd: rollouts, termination, failures, gRPC.

One real node (kubelet + containerd in a network namespace of the test bed's own, :mod:`batchfill.testbed.node`)
whose kubelet advertises 3 ``nvidia.com/gpu`` from the fake-GPU device plugin (the only emulated part: no
container sees a GPU, Triton runs ``KIND_CPU`` through ``BATCHFILL_TRITON_CPU_IMAGE``). The operator runs as its
ServiceAccount; a real Prometheus discovers the pods from the EndpointSlices of the rendered Service as a
ServiceMonitor would. The model is the Python-backend sleep model on a hostPath PersistentVolume, assembled into
each pod's repository by the rendered init container with the config from the pod's own ConfigMap.

Load goes to the Service's ready EndpointSlice endpoints (:class:`~batchfill.testbed.balancer.ServiceEndpoints`,
per request), and for the gRPC test through :class:`~batchfill.testbed.service_proxy.ServiceProxy` (per
connection, as kube-proxy balances a ClusterIP Service). Every request's outcome is counted and printed.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.adapters.triton_stats import parse_model_stats
from batchfill.api.reasons import (
    ConditionReason,
    ConditionType,
    EventReason,
    ReplanReason,
    ScalingReason,
)
from batchfill.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from batchfill.render.kube import HTTP_PORT, MODEL_LABEL, Owner, build_service_monitor, names, template_config_name
from batchfill.testbed.balancer import BalancedLoad, ServiceEndpoints
from batchfill.testbed.install import CLAIM
from batchfill.testbed.loadgen import grpc_fp32_input
from batchfill.testbed.service_proxy import ServiceProxy

from .support import SCALE_OUT_ON_EVIDENCE, Kube, Operator, Sampler, real_node_lab, wait_for, write_sleep_model

pytestmark = pytest.mark.cluster
#: conftest.py builds the kubelet at collection time (outside the test's timeout) when this is selected.
NEEDS_KUBELET = True

#: Fake GPUs on the node: two replicas and one surge pod.
NODE_GPUS = 3
NS = "real-pods"
#: The sleep model's batch latency here, ``ALPHA_MS + BETA_MS * b`` (its defaults, set in the file: the rendered
#: config carries no model parameters).
ALPHA_MS, BETA_MS = 40.0, 6.0
#: What the profile declares: a little above the sleep (Python-backend overhead). Profiling is held off
#: (``minExecutions``) so that no measured re-plan rolls the pods in the middle of a test.
PROFILE = [{"batchSize": b, "latencyMs": round(ALPHA_MS + 1 + (BETA_MS + 0.2) * b, 1)} for b in (1, 2, 4, 8, 16)]
MODELS = ("roll", "shrink", "undo", "broken", "tight", "grpc", "scale", "measured", "declared")
OPERATOR_ENV = {
    "BATCHFILL_RECONCILE_INTERVAL_SECONDS": "3",
    "BATCHFILL_SIGNAL_WINDOW_SECONDS": "10",
    "BATCHFILL_PROMETHEUS_TIMEOUT_SECONDS": "2",
    "BATCHFILL_PROFILE_INTERVAL_SECONDS": "3",
    "BATCHFILL_NAMESPACES": NS,
}
#: Pods take: the sandbox, the init container's copy, tritonserver's start and the model's load.
READY_S = 240.0


def model_doc(name: str, replicas: tuple[int, int], mode: str = "Auto", model: str = "sleep", **extra: Any) -> Any:
    spec: dict[str, Any] = {
        "model": {
            "name": model,
            "backend": "python",
            "repository": {"pvc": {"claimName": CLAIM}},
            "inputs": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
        },
        "sla": {"latencyP99Ms": 200, "networkOverheadMs": 20},
        "profile": PROFILE,
        "profiling": {"minExecutions": 1_000_000},
        "scaling": {
            "minReplicas": replicas[0],
            "maxReplicas": replicas[1],
            "mode": mode,
            "scaleDownStabilizationSeconds": 10,
        },
        "triton": {"gpusPerReplica": 1},
    }
    for key, value in extra.items():
        spec[key] = {**spec.get(key, {}), **value}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": NS}, "spec": spec}


BROKEN_MODEL_PY = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights file is corrupt (test model that never loads)")

    def execute(self, requests):
        return []
"""


@dataclass
class Lab:
    kube: Kube
    node: str
    busybox: str
    operator: Operator
    custom: Any = field(init=False)

    def __post_init__(self) -> None:
        self.custom = client.CustomObjectsApi(self.kube.api)

    def create(self, doc: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, doc)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, {"spec": spec})

    def bm(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        return obj

    def pods(self, name: str) -> list[Any]:
        return list(self.kube.core.list_namespaced_pod(NS, label_selector=f"{MODEL_LABEL}={name}").items)

    def ready(self, name: str) -> dict[str, Any]:
        """Ready, not terminating pods of ``name`` by pod name."""
        return {p.metadata.name: p for p in self.pods(name) if p.metadata.deletion_timestamp is None and _ready(p)}

    def wait_ready(self, name: str, count: int, timeout_s: float = READY_S) -> dict[str, Any]:
        return wait_for(
            f"{count} Ready pod(s) of {name} and no other",
            lambda: r if len(r := self.ready(name)) == count and len(self.pods(name)) == count else None,
            timeout_s=timeout_s,
            interval_s=1.0,
        )

    def config_of(self, pod: Any) -> str:
        """The config.pbtxt of the ConfigMap ``pod`` mounts."""
        cm = template_config_name(self.kube.api.sanitize_for_serialization(pod.spec)) or ""
        return str((self.kube.core.read_namespaced_config_map(cm, NS).data or {})["config.pbtxt"])

    def delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        except ApiException as e:
            if e.status != 404:
                raise
        wait_for(f"the pods of {name} gone", lambda: not self.pods(name), timeout_s=150, interval_s=1.0)

    def events(self, name: str) -> list[Any]:
        listed = self.kube.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
        return [e for e in listed if e.involved_object.kind == KIND]

    def kubectl(self, *args: str) -> str:
        return str(self.kube.kubectl(*args, "-n", NS).stdout)


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def condition(bm: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (bm.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def max_batch_size(config_pbtxt: str) -> int:
    found = re.search(r"^max_batch_size:\s*(\d+)", config_pbtxt, re.M)
    assert found, config_pbtxt
    return int(found.group(1))


def served_config(pod_ip: str, model: str = "sleep") -> dict[str, Any] | None:
    """The model config the pod's Triton loaded (its HTTP API); None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{pod_ip}:{HTTP_PORT}/v2/models/{model}/config", timeout=3) as r:
            loaded: dict[str, Any] = json.loads(r.read())
            return loaded
    except (OSError, ValueError):
        return None


def success_count(pod_ip: str, model: str = "sleep") -> int:
    """Triton's count of successful inference requests of ``model`` on the pod (statistics extension)."""
    with urllib.request.urlopen(f"http://{pod_ip}:{HTTP_PORT}/v2/models/{model}/stats", timeout=3) as r:
        return parse_model_stats(json.loads(r.read()), model).success.count


def _write_models(files: Path) -> None:
    write_sleep_model(files, "sleep", ALPHA_MS, BETA_MS)
    (files / "broken" / "1").mkdir(parents=True)
    (files / "broken" / "1" / "model.py").write_text(BROKEN_MODEL_PY)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """The cluster with one real node, the Triton image on it, Prometheus and the operator (see the docstring)."""
    from batchfill.testbed.node.images import busybox_image

    monitors = [build_service_monitor(Owner(m, NS, ""), interval_s=2) for m in MODELS]
    with real_node_lab(NS, NODE_GPUS, _write_models, monitors, OPERATOR_ENV, prefix="bf-rp-") as rl:
        yield Lab(rl.kube, rl.node, busybox_image()[0], rl.operator)


@dataclass
class Watch(Sampler):
    """Samples a model's pods every 0.5 s in a thread: the most pods at once, the fewest Ready, and every Ready
    pod's loaded config checked against the ConfigMap it mounts."""

    lab: Lab
    name: str
    most_pods: int = 0
    fewest_ready: int = 10**6
    checked: dict[str, int] = field(default_factory=dict)  # pod -> max_batch_size it serves (= its own config's)
    wrong: list[str] = field(default_factory=list)
    period_s = 0.5

    def sample(self) -> None:
        pods = [p for p in self.lab.pods(self.name) if p.metadata.deletion_timestamp is None]
        self.most_pods = max(self.most_pods, len(pods))
        ready = [p for p in pods if _ready(p)]
        self.fewest_ready = min(self.fewest_ready, len(ready))
        for p in ready:
            loaded = served_config(p.status.pod_ip)
            if loaded is None:
                continue
            own = max_batch_size(self.lab.config_of(p))
            self.checked[p.metadata.name] = int(loaded["max_batch_size"])
            if int(loaded["max_batch_size"]) != own:
                served = loaded["max_batch_size"]
                self.wrong.append(f"{p.metadata.name} serves max_batch_size {served}, its own {own}")


def _load(lab: Lab, name: str, rate: float, seed: int) -> tuple[ServiceEndpoints, BalancedLoad]:
    endpoints = ServiceEndpoints(lab.kube.api, NS, names(Owner(name, NS, ""))["service"], "grpc", poll_s=0.25)
    load = BalancedLoad("sleep", grpc_fp32_input("INPUT0", [4], seed=seed), endpoints.endpoints, seed=seed)
    return endpoints, load


def _counts(load: BalancedLoad) -> tuple[int, int, dict[str, int]]:
    samples = list(load.samples)
    by_endpoint: dict[str, int] = {}
    for s in samples:
        if s.latency_ms is not None:
            by_endpoint[s.endpoint] = by_endpoint.get(s.endpoint, 0) + 1
    return len(samples), sum(1 for s in samples if s.latency_ms is None), by_endpoint


def _rolled(lab: Lab, name: str, replicas: int, mbs: int) -> bool:
    """Every pod of ``name`` is Ready and mounts a config with ``max_batch_size`` ``mbs``, and no other exists."""
    pods = lab.pods(name)
    return len(pods) == replicas and all(_ready(p) and max_batch_size(lab.config_of(p)) == mbs for p in pods)


def test_a_config_change_under_load_rolls_pod_by_pod_and_loses_no_request(lab: Lab) -> None:
    lab.create(model_doc("roll", (2, 2)))
    before = lab.wait_ready("roll", 2)
    assert {p.spec.node_name for p in before.values()} == {lab.node}
    first = max_batch_size(lab.config_of(next(iter(before.values()))))
    endpoints, load = _load(lab, "roll", 40.0, seed=11)
    with endpoints, Watch(lab, "roll") as watch:
        load.start(40.0)
        time.sleep(5)
        lab.patch_spec("roll", {"batching": {"maxBatchSize": 8}})
        wait_for("the rollout to max_batch_size 8", lambda: _rolled(lab, "roll", 2, 8), timeout_s=READY_S)
        time.sleep(15)  # the old pods' preStop and drain are over; requests sent meanwhile are counted too
        load.stop()
    sent, failed, by_endpoint = _counts(load)
    print(
        f"config change under load: {sent} sent, {failed} failed, per endpoint {by_endpoint}; pods checked "
        f"{watch.checked}; at most {watch.most_pods} pods, at least {watch.fewest_ready} Ready"
    )
    assert first == 16
    assert failed == 0, (sent, failed)
    assert sent > 600
    assert not watch.wrong, watch.wrong
    assert set(watch.checked.values()) == {16, 8}, watch.checked
    assert len(watch.checked) >= 4  # two old pods and two new ones, each checked while Ready
    assert watch.most_pods <= 3  # one at a time: maxSurge 1, maxUnavailable 0
    assert watch.fewest_ready >= 2
    lab.delete("roll")


def test_scale_in_and_pod_deletion_under_load_lose_no_request(lab: Lab) -> None:
    lab.create(model_doc("shrink", (2, 3)))
    first = lab.wait_ready("shrink", 2)
    # 15 req/s: a quarter of one replica's planned capacity, so that one replica keeps it (a count the scale-out
    # rules accept: nothing scales out again)
    endpoints, load = _load(lab, "shrink", 15.0, seed=12)
    with endpoints:
        load.start(15.0)
        time.sleep(5)
        victim = sorted(first)[0]
        lab.kube.core.delete_namespaced_pod(victim, NS)  # as a node drain or a person would
        wait_for(
            f"{victim} replaced",
            lambda: victim not in (r := lab.ready("shrink")) and len(r) == 2 and len(lab.pods("shrink")) == 2,
            timeout_s=READY_S,
        )
        after_delete = _counts(load)
        lab.patch_spec("shrink", {"scaling": {"minReplicas": 1}})  # the low load now fits on one: scale-in
        wait_for("the scale-in to 1 pod", lambda: len(lab.pods("shrink")) == 1, timeout_s=180, interval_s=1.0)
        time.sleep(10)
        load.stop()
    sent, failed, by_endpoint = _counts(load)
    bm = lab.bm("shrink")
    print(
        f"pod deletion under load: {after_delete[0]} sent, {after_delete[1]} failed; then scale-in 2 -> 1: "
        f"{sent} sent in all, {failed} failed, per endpoint {by_endpoint}; "
        f"lastScaleReason {bm['status'].get('lastScaleReason')}"
    )
    assert failed == 0, (sent, failed)
    assert sent > 600
    assert len(by_endpoint) >= 3  # the deleted pod, its replacement and the other all served
    assert lab.kube.apps.read_namespaced_deployment("shrink-triton", NS).spec.replicas == 1
    lab.delete("shrink")


def test_rollout_undo_brings_back_pods_that_serve_the_previous_config(lab: Lab) -> None:
    lab.create(model_doc("undo", (1, 1)))
    pod = next(iter(lab.wait_ready("undo", 1).values()))
    assert (served_config(pod.status.pod_ip) or {}).get("max_batch_size") == 16
    lab.patch_spec("undo", {"batching": {"maxBatchSize": 4}})
    wait_for("the rollout to max_batch_size 4", lambda: _rolled(lab, "undo", 1, 4), timeout_s=READY_S)
    lab.kubectl("rollout", "undo", "deployment/undo-triton")
    wait_for("the undo to max_batch_size 16", lambda: _rolled(lab, "undo", 1, 16), timeout_s=READY_S)
    pod = next(iter(lab.ready("undo").values()))
    loaded = wait_for("the undone pod's config", lambda: served_config(pod.status.pod_ip))
    assert loaded["max_batch_size"] == 16  # the old ConfigMap still existed and the pod loaded it
    before = success_count(pod.status.pod_ip)
    endpoints, load = _load(lab, "undo", 20.0, seed=13)
    with endpoints:
        load.start(20.0)
        time.sleep(5)
        load.stop()
    sent, failed, _ = _counts(load)
    print(f"after rollout undo: {sent} sent, {failed} failed; pod {pod.metadata.name} serves max_batch_size 16")
    assert failed == 0
    assert sent > 50
    assert success_count(pod.status.pod_ip) - before == sent
    bm = wait_for(
        "ConfigApplied=False RolledBackByHand",
        lambda: (
            b
            if condition(b := lab.bm("undo"), ConditionType.CONFIG_APPLIED).get("reason")
            == ConditionReason.ROLLED_BACK_BY_HAND
            else None
        ),
        timeout_s=60,
    )
    assert condition(bm, ConditionType.CONFIG_APPLIED)["status"] == "False"
    time.sleep(8)  # two ticks: the operator leaves the person's rollback in place
    assert _rolled(lab, "undo", 1, 16)
    lab.delete("undo")


def test_a_model_that_fails_to_load_is_named_in_ready_within_a_minute(lab: Lab) -> None:
    lab.create(model_doc("broken", (1, 1), model="broken"))

    def failed_once() -> Any:
        for p in lab.pods("broken"):
            for s in p.status.container_statuses or []:
                if s.name == "triton" and (s.restart_count or s.last_state.terminated or s.state.terminated):
                    return p
        return None

    pod = wait_for("the broken model's Triton to exit", failed_once, timeout_s=READY_S, interval_s=1.0)
    t0 = time.monotonic()
    bm = wait_for(
        "Ready=False ReplicasFailing naming the pod",
        lambda: (
            b
            if (c := condition(b := lab.bm("broken"), ConditionType.READY)).get("reason")
            == ConditionReason.REPLICAS_FAILING
            and pod.metadata.name in c.get("message", "")
            else None
        ),
        timeout_s=60,
        interval_s=1.0,
    )
    ready = condition(bm, ConditionType.READY)
    print(
        f"{time.monotonic() - t0:.1f} s after the first exit: Ready={ready['status']} {ready['reason']}: "
        f"{ready['message']}"
    )
    assert ready["status"] == "False"
    assert not lab.ready("broken")
    lab.delete("broken")


def _filler(name: str, image: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "hold",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def test_a_rollout_with_no_free_gpu_goes_in_place_and_completes(lab: Lab) -> None:
    lab.create(model_doc("tight", (2, 2)))
    lab.wait_ready("tight", 2)
    lab.kube.core.create_namespaced_pod(NS, _filler("gpu-filler", lab.busybox, NODE_GPUS - 2))
    wait_for(
        "the filler Running",
        lambda: lab.kube.core.read_namespaced_pod("gpu-filler", NS).status.phase == "Running",
        timeout_s=120,
    )
    t0 = time.monotonic()
    lab.patch_spec("tight", {"batching": {"maxBatchSize": 8}})
    wait_for(
        "the GPU-tight rollout to max_batch_size 8", lambda: _rolled(lab, "tight", 2, 8), timeout_s=420, interval_s=2.0
    )
    reasons = [e.reason for e in lab.events("tight")]
    print(f"GPU-tight rollout complete in {time.monotonic() - t0:.0f} s; events {reasons}")
    assert reasons.count(EventReason.ROLLING_IN_PLACE) == 1
    lab.kube.core.delete_namespaced_pod("gpu-filler", NS)
    lab.delete("tight")


def _grpc_phase(lab: Lab, age_ms: int, seconds: float) -> tuple[dict[str, int], int, int]:
    """One tritonclient gRPC client through the Service proxy, connected while the model has 1 pod; the model
    scaled to 2; requests per pod (Triton's own counts) over ``seconds`` once the second pod is Ready."""
    import tritonclient.grpc as grpcclient

    lab.patch_spec("grpc", {"triton": {"args": [f"--grpc-max-connection-age={age_ms}"]}})
    wait_for(
        "1 pod with the new age",
        lambda: (
            len(lab.pods("grpc")) == 1
            and all(f"--grpc-max-connection-age={age_ms}" in p.spec.containers[0].args for p in lab.pods("grpc"))
            and lab.ready("grpc")
        ),
        timeout_s=READY_S,
        interval_s=1.0,
    )
    first = next(iter(lab.ready("grpc").values()))
    inputs = grpc_fp32_input("INPUT0", [4], seed=14)()
    endpoints = ServiceEndpoints(lab.kube.api, NS, names(Owner("grpc", NS, ""))["service"], "grpc", poll_s=0.25)
    sent, failed, stop = [0], [0], threading.Event()
    with endpoints, ServiceProxy(endpoints.endpoints) as proxy:
        user = grpcclient.InferenceServerClient(proxy.url)

        def send() -> None:
            while not stop.is_set():
                try:
                    user.infer("sleep", inputs, client_timeout=10)
                except Exception:
                    failed[0] += 1
                sent[0] += 1
                time.sleep(0.02)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            time.sleep(2)
            lab.kube.apps.patch_namespaced_deployment_scale("grpc-triton", NS, {"spec": {"replicas": 2}})
            pods = lab.wait_ready("grpc", 2)
            start = {n: success_count(p.status.pod_ip) for n, p in pods.items()}
            time.sleep(seconds)
            counts = {n: success_count(p.status.pod_ip) - start[n] for n, p in pods.items()}
        finally:
            stop.set()
            sender.join(timeout=30)
            user.close()
    lab.kube.apps.patch_namespaced_deployment_scale("grpc-triton", NS, {"spec": {"replicas": 1}})
    wait_for("back to 1 pod", lambda: len(lab.pods("grpc")) == 1, timeout_s=150, interval_s=1.0)
    print(
        f"gRPC client through the Service, --grpc-max-connection-age={age_ms}: requests per pod over {seconds:g} s "
        f"after the 2nd was Ready {counts} (first {first.metadata.name}); {sent[0]} sent, {failed[0]} failed; "
        f"connections {dict(proxy.connections)}"
    )
    added = next(n for n in counts if n != first.metadata.name)
    return {"first": counts[first.metadata.name], "added": counts[added]}, sent[0], failed[0]


def test_a_grpc_client_reaches_a_replica_added_after_it_connected(lab: Lab) -> None:
    lab.create(model_doc("grpc", (1, 2), mode="Off"))
    lab.wait_ready("grpc", 1)
    # what the issue measured: with a connection that is never closed, the client stays on the first pod
    sticky, _, failed = _grpc_phase(lab, 3_600_000, 15)
    assert failed == 0
    assert sticky["added"] == 0, sticky
    assert sticky["first"] > 60, sticky
    # the fix the operator renders (30 s by default; 3 s here to keep the test short): Triton ages connections
    aged, _, failed = _grpc_phase(lab, 3_000, 15)
    assert failed == 0
    assert aged["added"] > 20, aged
    assert aged["first"] > 20, aged
    lab.delete("grpc")


def _replicas(lab: Lab, name: str) -> int:
    return int(lab.kube.apps.read_namespaced_deployment(f"{name}-triton", NS).spec.replicas)


def test_auto_scales_out_on_saturation_and_in_when_the_load_drops(lab: Lab) -> None:
    lab.create(model_doc("scale", (1, 3)))
    lab.wait_ready("scale", 1)
    capacity = float(lab.bm("scale")["status"]["plan"]["capacityPerReplicaRps"])
    endpoints, load = _load(lab, "scale", 0.0, seed=15)
    with endpoints:
        load.start(1.5 * capacity)
        out = wait_for(
            "a scale-out on the real pods' signals",
            lambda: b if _replicas(lab, "scale") > 1 and (b := lab.bm("scale")) else None,
            timeout_s=180,
            interval_s=1.0,
        )
        lab.wait_ready("scale", _replicas(lab, "scale"))
        load.set_rate(0.25 * capacity)
        wait_for(
            "the scale-in to 1",
            lambda: _replicas(lab, "scale") == 1 and len(lab.pods("scale")) == 1,
            timeout_s=240,
            interval_s=1.0,
        )
        final = lab.bm("scale")
        load.stop()
    sent, failed, by_endpoint = _counts(load)
    status = out["status"]
    print(
        f"capacity {capacity:.1f} req/s per replica; at 1.5x: {status['lastScaleReason']} to "
        f"{status['desiredReplicas']} on batchFill {status['observed'].get('batchFill')}, queue "
        f"{status['observed'].get('queueTimeMs')} ms; then {final['status']['lastScaleReason']}; "
        f"{sent} sent, {failed} failed, per endpoint {by_endpoint}"
    )
    assert status["lastScaleReason"] in SCALE_OUT_ON_EVIDENCE
    assert status["observed"].get("batchFill") is not None  # Prometheus scraped the pods' own metrics
    scale_events = [e.reason for e in lab.events("scale") if e.reason.startswith("Scale")]
    assert SCALE_OUT_ON_EVIDENCE & set(scale_events), scale_events
    assert {ScalingReason.SCALE_IN_LOAD_FITS, ScalingReason.SCALE_IN_IDLE} & set(scale_events), scale_events
    assert failed == 0, (sent, failed)
    lab.delete("scale")


def test_a_model_without_a_profile_reaches_a_measured_plan_from_its_pods(lab: Lab) -> None:
    """No spec.profile: a first plan is served, the operator reads Triton's statistics from the pod's own IP, fits
    the profile, adopts it with one event, and the Deployment rolls exactly once."""
    body = model_doc("measured", (1, 1), batching={"maxBatchSize": 16})
    del body["spec"]["profile"]
    body["spec"]["profiling"] = {"minExecutions": 20, "replanIntervalSeconds": 60}
    # T = 100 ms: the measured l(16) = 136 ms does not fit, so the measured plan batches less than the first
    # plan's 16 and the config changes (an unchanged config would correctly not roll at all)
    body["spec"]["sla"] = {"latencyP99Ms": 120, "networkOverheadMs": 20}
    lab.create(body)
    pod = next(iter(lab.wait_ready("measured", 1).values()))
    bm = lab.bm("measured")
    assert condition(bm, ConditionType.PLANNED)["reason"] == ConditionReason.FIRST_PLAN
    assert condition(bm, ConditionType.SLA_FEASIBLE)["status"] == "Unknown"
    assert bm["status"]["plan"]["capacityPerReplicaRps"] == 0
    endpoints, load = _load(lab, "measured", 20.0, seed=16)  # l(1) = 46 ms: batches of 1 to 3
    with endpoints:
        load.start(20.0)
        t0 = time.monotonic()
        bm = wait_for(
            "Planned from the measured profile",
            lambda: (
                b
                if condition(b := lab.bm("measured"), ConditionType.PLANNED).get("reason")
                == ConditionReason.PLANNED_FROM_MEASURED_PROFILE
                else None
            ),
            timeout_s=240,
            interval_s=1.0,
        )
        adopted_s = time.monotonic() - t0
        wait_for(
            "the roll to the measured plan",
            lambda: _rolled(lab, "measured", 1, bm["status"]["plan"]["maxBatchSize"]),
            timeout_s=READY_S,
            interval_s=1.0,
        )
        time.sleep(12)  # several profiling passes: the adoption must not repeat, nor the roll
        load.stop()
    status = bm["status"]
    measured = [p for p in status["plannedProfile"]["points"] if p["executions"] > 0]
    print(
        f"measured profile adopted {adopted_s:.0f} s after the load started, from pod {pod.metadata.name}: "
        f"{[(p['batchSize'], p['latencyMs']) for p in measured]}; plan {status['plan']['maxBatchSize']}"
    )
    assert measured
    for p in measured:  # never below the sleep; above it, within the operator's own 15 % tolerance
        nominal = ALPHA_MS + BETA_MS * p["batchSize"]
        assert nominal <= p["latencyMs"] <= nominal * 1.15, f"batch {p['batchSize']}: {p} vs {nominal} ms"
    assert status["plannedProfile"]["reason"] == ReplanReason.PROFILE_MEASURED
    assert 0 < status["plan"]["maxBatchSize"] < 16
    assert status["plan"]["capacityPerReplicaRps"] > 0
    reasons = [e.reason for e in lab.events("measured")]
    assert reasons.count(ReplanReason.PROFILE_MEASURED) == 1, reasons
    assert reasons.count(EventReason.CONFIG_CHANGED) == 1, f"the Deployment must roll exactly once: {reasons}"
    lab.delete("measured")


def test_a_declared_profile_the_pods_contradict_is_replanned_once(lab: Lab) -> None:
    """spec.profile says the model is twice as slow as its pods run it: one ProfileDisagrees re-plan giving both
    values, a larger batch within T, and one roll."""
    body = model_doc("declared", (1, 1))
    body["spec"]["profile"] = [{"batchSize": b, "latencyMs": 2 * (ALPHA_MS + BETA_MS * b)} for b in (1, 2, 4, 8, 16)]
    body["spec"]["profiling"] = {"minExecutions": 20, "replanIntervalSeconds": 600, "tolerancePercent": 15}
    lab.create(body)
    lab.wait_ready("declared", 1)
    declared_b = lab.bm("declared")["status"]["plan"]["maxBatchSize"]
    endpoints, load = _load(lab, "declared", 20.0, seed=17)
    with endpoints:
        load.start(20.0)
        bm = wait_for(
            "a re-plan from the measurement",
            lambda: (
                b
                if condition(b := lab.bm("declared"), ConditionType.PLANNED).get("reason")
                == ConditionReason.PLANNED_FROM_MEASURED_PROFILE
                else None
            ),
            timeout_s=240,
            interval_s=1.0,
        )
        time.sleep(12)  # several profiling passes: the adopted measurement agrees, nothing more happens
        load.stop()
    planned = bm["status"]["plannedProfile"]
    print(f"declared plan B={declared_b}, re-planned B={bm['status']['plan']['maxBatchSize']}: {planned['message']}")
    assert planned["reason"] == ReplanReason.PROFILE_DISAGREES
    assert re.search(r"declared \d+(\.\d+)? ms, measured \d+(\.\d+)? ms", planned["message"]), planned["message"]
    assert bm["status"]["plan"]["maxBatchSize"] > declared_b, "the faster measured model batches more within T"
    reasons = [e.reason for e in lab.events("declared")]
    assert reasons.count(ReplanReason.PROFILE_DISAGREES) == 1, reasons
    assert reasons.count(EventReason.CONFIG_CHANGED) == 1, f"the Deployment must roll exactly once: {reasons}"
    lab.delete("declared")
