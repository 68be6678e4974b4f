"""Failed requests and a sudden backlog, read through a real Prometheus scraping a real tritonserver, decided on.

Setup: one tritonserver (nvidia-pytriton's 2.51) serves two models: ``sleep``, configured from the plan of the
scaling lab's sleep model (50 + 10·b ms per batch, T = 340 ms: B = 16, C ≈ 51 requests/s per replica), and
``broken``, whose ``execute`` raises (a model whose every request fails, as with corrupt weights). A real
Prometheus (Debian 2.42) scrapes it every 0.5 s with the labels ``namespace=ns1``, ``pod=triton-0``, as a
ServiceMonitor would; the signals are read through the operator's adapter (20 s window) and go into
:func:`batchfill.policy.scaling.decide`. One scenario per module (about a minute):

1. ``broken`` gets 8 requests/s for 12 s, all failing, plus requests of the wrong shape (which Triton refuses
   before they reach the model, so neither of its counters moves: pinned here, documented in
   docs/operations.md). The signals are read once.
2. ``sleep`` gets a light Poisson load (10 requests/s, a fifth of C) for 25 s, so the window holds only short
   queue times; then 400 requests arrive at once while the light load goes on. The signals are read every 0.1 s
   until the pending-request gauge shows the backlog (``BACKLOG_SEEN`` requests, 1 s of C).

What is checked: the failing model is Ok with a failure rate (not Idle) and is not scaled in, where the same
Prometheus answers without the failure query are Idle and scale in; at the first tick that shows the backlog,
the decision scales out while the window's completed-request queue time is still below the queue rule's
threshold, and the same signals without the pending gauge would not scale out.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from batchfill.adapters.metrics import PrometheusSignals, QueryResults, SignalTarget, aggregate
from batchfill.api.reasons import ScalingReason
from batchfill.api.spec import ScalingSpec
from batchfill.policy.plan import plan_batching
from batchfill.policy.scaling import (
    QUEUE_RISK_FRACTION,
    Decision,
    PlanNumbers,
    Recommendation,
    Replicas,
    ScalingInput,
    decide,
)
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.testbed.loadgen import LoadResult, grpc_fp32_input, run_poisson
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.prometheus_local import DEFAULT_BINARY, LocalPrometheus, ScrapeTarget
from batchfill.testbed.scaling_lab.config import LabConfig, sleep_model_config, sleep_spec
from batchfill.testbed.triton_local import LocalTriton

from .conftest import SLEEP_DIMS, SLEEP_INPUT, sleep_config_pb, with_parameters

pytestmark = [
    pytest.mark.component,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(DEFAULT_BINARY) is None, reason=f"{DEFAULT_BINARY} is not installed"),
]

NS, POD = "ns1", "triton-0"
WINDOW_S = 20.0
SCRAPE_S = 0.5
LAB = LabConfig()
SPEC = sleep_spec(LAB)
PLAN = plan_batching(SPEC, seed=0).to_status()
NUMBERS = PlanNumbers.from_status(PLAN)
SCALING = ScalingSpec(minReplicas=1, maxReplicas=4, targetUtilization=0.8, scaleDownStabilizationSeconds=60)
SLEEP = SignalTarget(NS, "bm-sleep", "sleep", PLAN.maxBatchSize, frozenset({POD}))
BROKEN = SignalTarget(NS, "bm-broken", "broken", 8, frozenset({POD}))

FAILING_RPS, FAILING_S, WRONG_SHAPE = 8.0, 12.0, 20
LIGHT_RPS, LIGHT_S, BURST = 10.0, 35.0, 400
BURST_AT_S = 25.0  # after the light load starts: the window holds light load only
BACKLOG_SEEN = 50  # pending requests that count as the backlog showing (the light load alone queues a few)

BROKEN_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("weights corrupt")
"""


@dataclass
class Observed:
    failing: ModelSignals
    failing_results: QueryResults
    failing_sent: int
    failures_counted: float  # Σ nv_inference_request_failure of ``broken``, from Triton's own /metrics
    successes_counted: float
    light: LoadResult
    burst: LoadResult
    ticks: list[tuple[float, ModelSignals]] = field(default_factory=list)  # (s since the burst, signals)


def _failing_load(triton: LocalTriton) -> int:
    """FAILING_RPS requests/s to ``broken`` for FAILING_S, then WRONG_SHAPE requests of shape [1, 5]; each fails."""
    import tritonclient.grpc as grpcclient

    client = triton.grpc_client()
    good = grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS)()
    bad = grpcclient.InferInput(SLEEP_INPUT, [1, 5], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 5), np.float32))
    sent, start = 0, time.monotonic()
    try:
        for i in range(int(FAILING_RPS * FAILING_S)):
            time.sleep(max(0.0, start + i / FAILING_RPS - time.monotonic()))
            with pytest.raises(Exception, match="weights corrupt"):
                client.infer("broken", good)
            sent += 1
        for _ in range(WRONG_SHAPE):
            with pytest.raises(Exception, match="unexpected shape"):
                client.infer("broken", [bad])
    finally:
        client.close()
    return sent


def _counter(text: str, metric: str, model: str) -> float:
    """Σ of ``metric``'s samples for ``model`` in Triton's /metrics text (all ``reason`` labels)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(metric + "{") and f'model="{model}"' in line
    )


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    root = tmp_path_factory.mktemp("failure_backlog")
    repo = root / "models"
    write_model(repo, "sleep", sleep_model_config(SPEC, PLAN, LAB.model), "sleep_model")
    broken = write_model(repo, "broken", with_parameters(sleep_config_pb("broken", 8, queue_delay_us=1000)),
                         "sleep_model")  # fmt: skip
    (broken / "1" / "model.py").write_text(BROKEN_MODEL)
    triton = LocalTriton(repo, log_path=root / "triton.log")
    prom = LocalPrometheus(scrape_interval_s=SCRAPE_S, work_dir=root / "prometheus")
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        triton.start()
        prom.set_targets([ScrapeTarget.from_url(triton.metrics_url, NS, POD)])
        prom.start()
        prom.wait_for_targets()
        time.sleep(2 * SCRAPE_S)  # two scrapes before any load: increase() sees every request
        signals = PrometheusSignals(prom.url, window_s=WINDOW_S, timeout_s=5.0)

        # 1. every request to ``broken`` fails
        sent = _failing_load(triton)
        time.sleep(3 * SCRAPE_S)
        raw = signals.query_all([BROKEN])
        assert isinstance(raw, QueryResults), raw
        failing = aggregate([BROKEN], raw, WINDOW_S)[BROKEN.key]
        text = triton.metrics_text()
        failures = _counter(text, "nv_inference_request_failure", "broken")
        successes = _counter(text, "nv_inference_request_success", "broken")

        # 2. light load on ``sleep``, then a burst on top of it
        make = grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS)
        start = time.monotonic()
        light: Future[LoadResult] = pool.submit(
            run_poisson, triton.grpc_url, "sleep", make, LIGHT_RPS, duration_s=LIGHT_S, seed=1
        )
        time.sleep(max(0.0, start + BURST_AT_S - time.monotonic()))
        t_burst = time.monotonic()
        burst: Future[LoadResult] = pool.submit(
            run_poisson, triton.grpc_url, "sleep", make, 4000.0, count=BURST, seed=2, priming_requests=0
        )
        ticks: list[tuple[float, ModelSignals]] = []
        while time.monotonic() - t_burst < 10.0:
            s = signals.fetch([SLEEP])[SLEEP.key]
            ticks.append((time.monotonic() - t_burst, s))
            if (s.pending_requests or 0) >= BACKLOG_SEEN:
                break
            time.sleep(0.1)
        signals.close()
        yield Observed(failing, raw, sent, failures, successes, light.result(), burst.result(), ticks)
    finally:
        pool.shutdown(wait=True)
        prom.close()
        triton.stop()


def _decide(signals: ModelSignals, current: int, votes: tuple[Recommendation, ...] = ()) -> Decision:
    now = 10_000.0
    history = votes or (Recommendation(now - 90, current, current), Recommendation(now - 15, 1, current))
    return decide(ScalingInput(now, signals, NUMBERS, SCALING, Replicas(current, current), history))


def test_triton_counts_failed_executions_but_not_requests_of_the_wrong_shape(observed: Observed) -> None:
    print(f"sent {observed.failing_sent} failing requests, Triton counted {observed.failures_counted} failures")
    assert observed.successes_counted == 0
    # every request that reached the model counts (the priming-free sender sent exactly these); the wrong-shape
    # ones were refused before the model and are in neither counter
    assert observed.failures_counted == observed.failing_sent


def test_every_request_failing_is_traffic_with_a_failure_rate_not_idle(observed: Observed) -> None:
    s = observed.failing
    print(s.message)
    assert s.state is SignalState.OK, s.message
    assert (s.request_rate_rps, s.pods) == (0.0, 1)
    assert s.failure_rate_rps is not None
    # the window covers the whole failing load (12 s) and Prometheus extrapolates its edges
    assert s.failure_rate_rps == pytest.approx(observed.failing_sent / WINDOW_S, rel=0.25)
    assert s.failure_fraction == 1.0


def test_a_failing_model_is_not_scaled_in_where_the_success_counter_alone_would_scale_in(observed: Observed) -> None:
    d = _decide(observed.failing, 3)
    print(d.reason, d.message)
    assert (d.desired_replicas, d.reason, d.requests_failing) == (3, ScalingReason.HOLD_REQUESTS_FAILING, True)
    # the same Prometheus answers without the failure query: what the operator saw before it read failures
    blind = replace(observed.failing_results, failures={})
    before = aggregate([BROKEN], blind, WINDOW_S)[BROKEN.key]
    assert before.state is SignalState.IDLE
    assert (_decide(before, 3).desired_replicas, _decide(before, 3).reason) == (1, ScalingReason.SCALE_IN_IDLE)


def test_a_backlog_scales_out_on_the_first_tick_the_pending_gauge_shows_it(observed: Observed) -> None:
    for t, s in observed.ticks[-5:]:
        print(f"+{t:.2f}s pending {s.pending_requests} queue {s.queue_time_ms} ms p99 {s.p99_ms} ms: {s.message}")
    print(observed.light.summary())
    print(observed.burst.summary())
    t, s = observed.ticks[-1]
    assert (s.pending_requests or 0) >= BACKLOG_SEEN, "the gauge never showed the burst"
    assert t < 3.0, "Prometheus scrapes every 0.5 s: the gauge shows a burst within a few scrapes"
    assert s.state is SignalState.OK, s.message
    assert s.queue_time_ms is not None
    d = _decide(s, 1)
    print(d.reason, d.message)
    assert (d.desired_replicas, d.reason, d.sla_at_risk) == (2, ScalingReason.SCALE_OUT_SLA_AT_RISK, True)
    assert "backlog" in d.message
    # the completed requests' queue time still looks fine: the queue rule alone would not have fired
    delay_ms = NUMBERS.max_queue_delay_us / 1000.0
    assert s.queue_time_ms - delay_ms < QUEUE_RISK_FRACTION * NUMBERS.server_budget_ms
    # and without the pending gauge these signals do not scale out
    assert not _decide(replace(s, pending_requests=0.0), 1).changes_replicas
    assert observed.burst.failed == 0, observed.burst.errors
    assert observed.light.failed == 0, observed.light.errors
