"""A pool pod's model control on the real tritonserver: the pure decisions (controller.pool_models) acted out through
the repository adapter (adapters.triton_repository) on one server started with the pool's own arguments
(render.pool.pool_triton_args: explicit model control, --strict-readiness=false).

Two sleep models are loaded with configs derived from two different plans; Triton reports those configs back
(``GET v2/models/<m>/config``). Then, while one model is under steady load, its neighbour is taken off the pod the
way a move ends (label off, drained, unloaded) and the loaded model's own config changes (a reload in place): every
request of the loaded model succeeds, and requests in flight at the neighbour's unload are answered too. The pod's
labels live in a dict here (there is no API server in a component test); the Kubernetes side is the cluster tests'.

Measured (2-core machine, other jobs running): see the printed figures (``pytest -s``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from batchfill.adapters import triton_repository as repo
from batchfill.adapters.triton_repository import ModelState, TritonCallError
from batchfill.api.pool import GPUPoolSpec
from batchfill.api.reasons import PoolModelReason as Why
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.status import PlanStatus
from batchfill.controller.pool_models import (
    Outcome,
    PoolModelsMemory,
    PoolModelsPlan,
    PoolPod,
    WantedModel,
    decide_pool_models,
    remember,
    wanted_model,
)
from batchfill.policy.plan import plan_batching
from batchfill.render.pool import LOADED, TritonRequest, load_request, pool_triton_args
from batchfill.render.warmup import warmup_batch_sizes
from batchfill.testbed.loadgen import LoadResult, grpc_fp32_input, run_poisson
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.process import process_group_alive
from batchfill.testbed.triton_local import LocalTriton

from .conftest import SLEEP_DIMS, SLEEP_INPUT, SLEEP_OUTPUT, sleep_config_pb

pytestmark = pytest.mark.component

POD = "small-models-pool-0"
POOL = GPUPoolSpec.model_validate({"gpuMemoryMiB": 10240, "repository": {"pvc": {"claimName": "models"}}})
#: tritonserver arguments of the pool the local server sets itself (loopback addresses and free ports, the
#: repository in a temporary directory, no GPU metrics without a GPU); every other pool argument is passed on.
LOCAL = ("--model-repository=", "--http-port=", "--grpc-port=", "--metrics-port=", "--allow-gpu-metrics=")
#: (model, alpha ms, beta ms, SLA p99 ms, batching cap): a slow one whose requests are still in flight when it is
#: unloaded, and a fast one carrying the steady load.
MODELS = {"pool_a": (150.0, 5.0, 1000.0, 8), "pool_b": (2.0, 0.5, 50.0, 4)}
DRAIN_TEST_S = 2.0  # the drain shortened: nothing routes to this server but the test
LOAD_RPS, LOAD_SECONDS = 40.0, 25.0
IN_FLIGHT = 6


def _spec(model: str) -> BatchedModelSpec:
    alpha, beta, sla, cap = MODELS[model]
    return BatchedModelSpec.model_validate(
        {
            "model": {
                "name": model,
                "backend": "python",
                "inputs": [{"name": SLEEP_INPUT, "dataType": "TYPE_FP32", "dims": SLEEP_DIMS}],
                "outputs": [{"name": SLEEP_OUTPUT, "dataType": "TYPE_FP32", "dims": SLEEP_DIMS}],
            },
            "sla": {"latencyP99Ms": sla},
            "profile": [{"batchSize": b, "latencyMs": alpha + beta * b} for b in (1, 2, 4, 8)],
            "batching": {"maxBatchSize": cap},
        }
    )


def _with_sleep(want: WantedModel, knobs: tuple[float, float] | None = None) -> WantedModel:
    """``want`` with the sleep model's own knobs (``alpha_ms``/``beta_ms``: ``knobs``, by default its entry of
    ``MODELS``) added to the load's config.

    The renderer writes no ``parameters`` (conftest.with_parameters says why), and a load's ``config`` replaces the
    repository's config.pbtxt; only ``parameters`` is added, the rest is exactly what load_request rendered.
    """
    alpha, beta = knobs if knobs is not None else MODELS[want.model][:2]
    config = json.loads(want.request.body["parameters"]["config"])
    assert "parameters" not in config
    config["parameters"] = {"alpha_ms": {"string_value": str(alpha)}, "beta_ms": {"string_value": str(beta)}}
    request = TritonRequest(want.request.method, want.request.path, {"parameters": {"config": json.dumps(config)}})
    return replace(want, request=request)


@dataclass
class Pod:
    """The one pool pod: the server, its labels and annotations (the API server's part), the operator's memory."""

    triton: LocalTriton
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    memory: PoolModelsMemory = field(default_factory=PoolModelsMemory)
    plans: dict[str, PlanStatus] = field(default_factory=dict)

    def gather(self) -> PoolPod:
        index = repo.repository_index(self.triton.http_url, POD)
        assert not isinstance(index, TritonCallError), str(index)
        return PoolPod(POD, self.triton.http_url, True, dict(self.labels), dict(self.annotations), index)

    def tick(self, wanted: list[WantedModel], drain_s: float = DRAIN_TEST_S) -> PoolModelsPlan:
        """gather -> decide -> act, as the operator's tick will (the loads one after another)."""
        plan = decide_pool_models([self.gather()], wanted, self.memory, time.time(), drain_s=drain_s)
        outcomes = []
        for w in plan.loads:
            error = repo.load(w.address, w.pod, w.request)
            outcomes.append(Outcome(w, None if error is None else str(error), time.time()))
        for p in plan.patches:
            for r in p.routes:
                for target, value in ((self.labels, LOADED), (self.annotations, r.config_hash)):
                    if r.config_hash:
                        target[r.key] = str(value)
                    else:
                        target.pop(r.key, None)
            outcomes.append(Outcome(p, None, time.time()))
        for u in plan.unloads:
            error = repo.unload(u.address, u.pod, u.model)
            outcomes.append(Outcome(u, None if error is None else str(error), time.time()))
        self.memory, events = remember(plan.memory, outcomes)
        for e in events:
            print(f"event {e.type} {e.reason}: {e.message}")
        return plan

    def want(self, model: str, queue_delay_us: int | None = None) -> WantedModel:
        plan = self.plans[model]
        if queue_delay_us is not None:
            plan = plan.model_copy(update={"maxQueueDelayMicroseconds": queue_delay_us})
        # the BatchedModel (its label) is pool-a, the Triton model pool_a: the two names differ, as they may
        name = model.replace("_", "-")
        return _with_sleep(wanted_model(name, _spec(model), plan, POOL, frozenset({POD}), instance_kind="KIND_CPU"))


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """One server with the pool's arguments on a repository holding both sleep models (each with a config.pbtxt of
    its own that the loads replace)."""
    args = pool_triton_args(POOL)
    assert args[0] == "tritonserver"
    kept = [a for a in args[1:] if not a.startswith(LOCAL)]
    assert {"--model-control-mode=explicit", "--strict-readiness=false"} <= set(kept)
    repository = tmp_path_factory.mktemp("pool_repository")
    for name in MODELS:
        write_model(repository, name, sleep_config_pb(name, 1), "sleep_model")
    server = LocalTriton(
        repository,
        model_control_mode="explicit",
        strict_readiness=False,
        extra_args=kept,
        log_path=repository.parent / "tritonserver.log",
    )
    server.start()
    pgid = server.pid
    assert pgid is not None
    try:
        yield Pod(server, plans={m: plan_batching(_spec(m), seed=0).to_status() for m in MODELS})
    finally:
        server.stop()
    assert not process_group_alive(pgid), f"tritonserver {pgid} or one of its stubs survived stop()"


def _config(pod: Pod, model: str) -> dict[str, Any]:
    client = pod.triton.http_client()
    try:
        return dict(client.get_model_config(model))
    finally:
        client.close()


def _infer(pod: Pod, model: str) -> str:
    """One request of one sample over HTTP: "ok" or the error's text."""
    client = pod.triton.http_client(network_timeout=30.0)
    data = np.ones((1, *SLEEP_DIMS), dtype=np.float32)
    inp = httpclient.InferInput(SLEEP_INPUT, list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    try:
        out = client.infer(model, [inp]).as_numpy(SLEEP_OUTPUT)
        return "ok" if out is not None and out.shape == data.shape else f"bad output {out!r}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        client.close()


def _state(pod: Pod, model: str) -> ModelState:
    entry = pod.gather().index
    assert entry is not None
    return entry[model].state if model in entry else ModelState.UNAVAILABLE


def test_a_gpu_config_on_a_server_without_gpus_is_a_typed_error(pod: Pod) -> None:
    request = load_request(_spec("pool_a"), pod.plans["pool_a"], POOL)  # KIND_GPU: production's default
    error = repo.load(pod.triton.http_url, POD, request)
    assert isinstance(error, TritonCallError)
    assert (error.pod, error.model, error.call, error.status) == (POD, "pool_a", "load", 400)
    assert "KIND_GPU but no GPUs are available" in error.message
    assert "\n" not in str(error)
    assert len(error.message) <= repo.SERVER_TEXT_LIMIT
    index = pod.gather().index
    assert index is not None
    assert index["pool_a"].state == ModelState.UNAVAILABLE
    assert "no GPUs" in index["pool_a"].reason
    silent = repo.repository_index("127.0.0.1:9", POD)  # the discard port: nothing listens
    assert isinstance(silent, TritonCallError)
    assert (silent.call, silent.status) == ("index", None)


def test_each_model_is_loaded_with_its_plans_config_then_routed(pod: Pod) -> None:
    a, b = pod.plans["pool_a"], pod.plans["pool_b"]
    print(
        "plans:",
        {m: (p.maxBatchSize, p.preferredBatchSizes, p.maxQueueDelayMicroseconds) for m, p in pod.plans.items()},
    )
    assert (a.maxBatchSize, a.maxQueueDelayMicroseconds) != (b.maxBatchSize, b.maxQueueDelayMicroseconds)
    wanted = [pod.want("pool_a"), pod.want("pool_b")]
    first = pod.tick(wanted)
    assert [w.model for w in first.loads] == ["pool_a", "pool_b"]
    second = pod.tick(wanted)
    assert [(r.model, r.config_hash) for p in second.patches for r in p.routes] == [
        ("pool_a", wanted[0].config_hash),
        ("pool_b", wanted[1].config_hash),
    ]
    assert pod.tick(wanted).loads == ()  # steady: nothing to do
    for model, plan in pod.plans.items():
        cfg = _config(pod, model)
        batching = cfg["dynamic_batching"]
        assert cfg["max_batch_size"] == plan.maxBatchSize
        assert batching["max_queue_delay_microseconds"] == plan.maxQueueDelayMicroseconds
        assert batching.get("preferred_batch_size", []) == plan.preferredBatchSizes
        assert [(g["kind"], g["count"]) for g in cfg["instance_group"]] == [("KIND_CPU", plan.instanceCount)]
        assert cfg["parameters"]["alpha_ms"]["string_value"] == str(MODELS[model][0])
        assert repo.model_ready(pod.triton.http_url, POD, model) is True
        assert _infer(pod, model) == "ok"


def _load_b(pod: Pod, out: dict[str, Any]) -> None:
    start = time.time()
    out["result"] = run_poisson(
        pod.triton.grpc_url, "pool_b", grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS), LOAD_RPS, duration_s=LOAD_SECONDS
    )
    out["window"] = (start, time.time())


def _wait_unloaded(pod: Pod, model: str, timeout_s: float = 60.0) -> list[ModelState]:
    seen: list[ModelState] = []
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state = _state(pod, model)
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == ModelState.UNAVAILABLE:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"{model} still {seen[-1]} {timeout_s} s after its unload: {pod.triton.diagnostics()}")


def test_the_neighbour_unloads_and_a_reload_lose_no_request(pod: Pod) -> None:
    if not pod.labels:
        pytest.skip("the models were not loaded (the test above failed)")
    load: dict[str, Any] = {}
    thread = threading.Thread(target=_load_b, args=(pod, load), daemon=True)
    thread.start()
    time.sleep(2.0)  # the load is on
    b = pod.want("pool_b")
    # pool_a is no longer wanted: its label goes, it drains, then it is unloaded
    off = pod.tick([b])
    assert [r.model for p in off.patches for r in p.routes] == [""]  # its label, as a stale one
    assert [h.reason for h in pod.tick([b]).holds] == [Why.HOLD_DRAINING]
    time.sleep(DRAIN_TEST_S)
    with ThreadPoolExecutor(IN_FLIGHT) as pool:  # requests that reached the pod before the label went
        in_flight = [pool.submit(_infer, pod, "pool_a") for _ in range(IN_FLIGHT)]
        time.sleep(0.05)
        unloaded_at = time.time()
        assert [u.model for u in pod.tick([b]).unloads] == ["pool_a"]
        answered = [f.result() for f in in_flight]
    states = _wait_unloaded(pod, "pool_a")
    after = _infer(pod, "pool_a")
    # pool_b's config changes while it serves: reloaded in place, then the annotation follows
    changed = pod.want("pool_b", queue_delay_us=pod.plans["pool_b"].maxQueueDelayMicroseconds + 100)
    reload = pod.tick([changed])
    reloaded_at = time.time()
    assert [w.model for w in reload.loads] == ["pool_b"]
    assert [(r.model, r.config_hash) for p in pod.tick([changed]).patches for r in p.routes] == [
        ("pool_b", changed.config_hash)
    ]
    thread.join(LOAD_SECONDS + 30)
    result: LoadResult = load["result"]
    start, end = load["window"]
    print(
        f"pool_b under load: {result.sent} sent, {result.ok} ok, {result.failed} failed; pool_a unloaded at "
        f"+{unloaded_at - start:.1f} s (states {[str(s) for s in states]}), pool_b reloaded by "
        f"+{reloaded_at - start:.1f} s "
        f"of {end - start:.1f} s; in flight at the unload: {answered}; after it: {after[:120]}"
    )
    assert result.failed == 0, result.errors
    assert result.ok == result.sent
    assert result.sent >= 0.8 * LOAD_RPS * LOAD_SECONDS
    assert start < unloaded_at < reloaded_at < end, "the unload and the reload happened outside the load"
    assert answered == ["ok"] * IN_FLIGHT
    assert after != "ok", "a request sent after the unload is refused: what the drain time is for"
    delay = _config(pod, "pool_b")["dynamic_batching"]["max_queue_delay_microseconds"]
    assert delay == pod.plans["pool_b"].maxQueueDelayMicroseconds + 100
    assert pod.labels == {k: v for k, v in pod.labels.items() if k.endswith("/pool-b")}
    assert pod.annotations[next(iter(pod.labels))] == changed.config_hash


def test_a_model_with_warmup_is_ready_only_after_triton_ran_its_warmup(pod: Pod) -> None:
    """spec.model.warmup: the rendered ``model_warmup`` is taken by the real Triton through the repository API (the
    way a pool loads a model), which runs every warm-up request before the load returns and the model is READY: the
    load lasts at least the sleep model's time for them, and the config Triton serves lists them."""
    alpha, beta, _, _ = MODELS["pool_a"]
    doc = _spec("pool_a").model_dump(mode="json", exclude_none=True)
    doc["model"]["name"] = "pool_w"
    doc["model"]["warmup"] = {"count": 2}
    spec = BatchedModelSpec.model_validate(doc)
    plan = plan_batching(spec, seed=0).to_status()
    write_model(pod.triton.model_repository, "pool_w", sleep_config_pb("pool_w", 1), "sleep_model")
    want = _with_sleep(
        wanted_model("pool-w", spec, plan, POOL, frozenset({POD}), instance_kind="KIND_CPU"), (alpha, beta)
    )
    sizes = warmup_batch_sizes([], plan.maxBatchSize)
    asleep_s = 2 * sum(alpha + beta * b for b in sizes) / 1000
    t = time.monotonic()
    error = repo.load(pod.triton.http_url, POD, want.request)
    took = time.monotonic() - t
    print(f"\nload with warm-up at batch sizes {sizes} x 2: {took:.2f} s (the sleeps alone {asleep_s:.2f} s)")
    try:
        assert error is None, str(error)
        assert took >= asleep_s
        served = _config(pod, "pool_w")["model_warmup"]
        assert [(w["batch_size"], w["count"]) for w in served] == [(b, 2) for b in sizes]
        assert all(w["inputs"][SLEEP_INPUT]["zero_data"] for w in served)
        assert _state(pod, "pool_w") == ModelState.READY
        assert _infer(pod, "pool_w") == "ok"
    finally:
        repo.unload(pod.triton.http_url, POD, "pool_w")
