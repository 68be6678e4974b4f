"""Signals read through a real Prometheus scraping two real tritonservers, checked against Triton's own statistics.

Setup: two tritonserver processes serve the sleep model (5 + 1·b ms per batch, dynamic batching with a 40 ms
queue delay, max batch 8); a real Prometheus (Debian 2.42) scrapes them every second with the labels
``namespace=ns1`` and ``pod=triton-a`` / ``triton-b``, as a ServiceMonitor would. One scenario runs once per
module (about a minute) and the tests check what it observed:

1. A Poisson load of 40 req/s goes to triton-a for 24 s, none to triton-b. At load start + 22 s the signals of
   several BatchedModels (targets) are read over the window [start + 2 s, start + 22 s]; Triton's statistics
   API is read at both window edges for the same window.
2. triton-a restarts on the same ports (its counters reset to 0, as a restarted container's do) and gets 14 s
   more load; the signals are read every second across the restart.
3. Prometheus stops; the signals are read once more.

Tolerances (printed with the numbers): request rate within 15 % of the load's achieved rate and within 10 % of
the rate Triton's statistics give for the window (Prometheus extrapolates to the window edges from 1 s scrapes);
average batch size within 10 % and queue time per request within 20 % of the statistics (the window edges are
scrape times, up to 1 s away from the statistics reads; queue time is a mean of a skewed quantity); across the
restart every rate lies in [0, 1.3 × offered], and the last one (14 s of load in a 20 s window) is at least
60 % of offered × 14/20.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from batchfill.adapters.metrics import (
    PrometheusSignals,
    SignalTarget,
    TargetKey,
)
from batchfill.adapters.triton_stats import ModelStats, delta, read_model_stats
from batchfill.api.reasons import SignalsReason
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.testbed.loadgen import LoadResult, grpc_fp32_input, run_poisson
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.process import free_ports
from batchfill.testbed.prometheus_local import DEFAULT_BINARY, LocalPrometheus, ScrapeTarget
from batchfill.testbed.triton_local import LocalTriton

from .conftest import SLEEP_DIMS, SLEEP_INPUT, sleep_config_pb, with_parameters

pytestmark = [
    pytest.mark.component,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(DEFAULT_BINARY) is None, reason=f"{DEFAULT_BINARY} is not installed"),
]

MODEL = "sleep"
NS = "ns1"
MAX_BATCH = 8
ALPHA_MS, BETA_MS = 5.0, 1.0
QUEUE_DELAY_US = 40_000
RATE_RPS = 40.0
WINDOW_S = 20.0
SCRAPE_S = 1.0
LOAD_S = 24.0
WINDOW_START_S = 2.0  # after load start
RESTART_LOAD_S = 14.0

A = SignalTarget(NS, "bm-a", MODEL, MAX_BATCH, frozenset({"triton-a"}))
B = SignalTarget(NS, "bm-b", MODEL, MAX_BATCH, frozenset({"triton-b"}))
AB = SignalTarget(NS, "bm-ab", MODEL, MAX_BATCH, frozenset({"triton-a", "triton-b"}))
AB_A_TERMINATING = SignalTarget(NS, "bm-ab-a-terminating", MODEL, MAX_BATCH, frozenset({"triton-b"}))
OTHER_NS = SignalTarget("ns2", "bm-a", MODEL, MAX_BATCH, frozenset({"triton-a"}))  # same pod and model names
UNSCRAPED = SignalTarget(NS, "bm-new", MODEL, MAX_BATCH, frozenset({"triton-z"}))
NO_PODS = SignalTarget(NS, "bm-empty", MODEL, MAX_BATCH, frozenset())
TARGETS = [A, B, AB, AB_A_TERMINATING, OTHER_NS, UNSCRAPED, NO_PODS]


@dataclass
class Observed:
    load: LoadResult
    stats: ModelStats  # triton-a's statistics delta over the window
    stats_window_s: float
    signals: dict[TargetKey, ModelSignals]
    restart_load: LoadResult
    across_restart: list[tuple[float, ModelSignals]] = field(default_factory=list)  # (s since restart, signals of A)
    raw_success_counter: list[float] = field(default_factory=list)  # triton-a's scraped counter, oldest first
    after_stop: dict[TargetKey, ModelSignals] = field(default_factory=dict)
    after_stop_fetch_s: float = math.nan


def _load(triton: LocalTriton, duration_s: float, seed: int) -> LoadResult:
    make = grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS)
    return run_poisson(triton.grpc_url, MODEL, make, RATE_RPS, duration_s=duration_s, seed=seed)


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    root = tmp_path_factory.mktemp("metrics_real")
    repo = root / "models"
    config = sleep_config_pb(MODEL, MAX_BATCH, preferred=[], queue_delay_us=QUEUE_DELAY_US)
    write_model(repo, MODEL, with_parameters(config, alpha_ms=ALPHA_MS, beta_ms=BETA_MS), "sleep_model")
    # Fixed ports for triton-a, so its restart keeps the scrape address (a restarted container keeps its pod IP).
    ports = free_ports(3)
    a = LocalTriton(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2], log_path=root / "a.log")
    b = LocalTriton(repo, log_path=root / "b.log")
    prom = LocalPrometheus(scrape_interval_s=SCRAPE_S, work_dir=root / "prometheus")
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        a.start()
        b.start()
        scrape_a = ScrapeTarget.from_url(a.metrics_url, NS, "triton-a")
        scrape_b = ScrapeTarget.from_url(b.metrics_url, NS, "triton-b")
        prom.set_targets([scrape_a])
        prom.start()
        prom.wait_for_targets()
        signals = PrometheusSignals(prom.url, window_s=WINDOW_S, timeout_s=5.0)
        client = a.http_client()

        # 1. steady load on triton-a; triton-b joins the scrape targets while Prometheus runs (it is scraped
        #    within about 5 s, so it has series in the window)
        start = time.monotonic()
        load: Future[LoadResult] = pool.submit(_load, a, LOAD_S, 1)
        prom.set_targets([scrape_a, scrape_b])
        _sleep_until(start + WINDOW_START_S)
        before = read_model_stats(client, MODEL)
        t0 = time.time()
        _sleep_until(start + WINDOW_START_S + WINDOW_S)
        after = read_model_stats(client, MODEL)
        t1 = time.time()
        time.sleep(1.5 * SCRAPE_S)  # let the scrapes up to t1 land; the query is evaluated at t1
        at_t1 = signals.fetch(TARGETS, at=t1)
        prom.wait_for_targets(timeout_s=1.0)  # both were scraped (long ago)
        first = load.result()
        client.close()

        # 2. counter reset: triton-a restarts on the same ports, then gets load again
        restart: Future[LoadResult] | None = None
        across: list[tuple[float, ModelSignals]] = []
        a.stop()
        t_restart = time.monotonic()
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                across.append((time.monotonic() - t_restart, signals.fetch([A])[A.key]))
                done.wait(SCRAPE_S)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            a.start()
            restart = pool.submit(_load, a, RESTART_LOAD_S, 2)
            second = restart.result()
            time.sleep(SCRAPE_S)
        finally:
            done.set()
            poller.join(10)
        across.append((time.monotonic() - t_restart, signals.fetch([A])[A.key]))

        # the raw series of triton-a across the restart, to check that Prometheus saw a counter reset
        raw = prom.api("/api/v1/query", query=f'nv_inference_request_success{{pod="triton-a"}}[{int(WINDOW_S * 3)}s]')
        raw_values = [float(v) for series in raw["result"] for _, v in series["values"]]

        # 3. Prometheus down
        prom.stop()
        t = time.monotonic()
        down = signals.fetch(TARGETS)
        down_s = time.monotonic() - t
        signals.close()
        yield Observed(first, delta(before, after), t1 - t0, at_t1, second, across, raw_values, down, down_s)
    finally:
        pool.shutdown(wait=True)
        prom.close()
        a.stop()
        b.stop()


def _rel(a: float, b: float) -> float:
    return abs(a - b) / b


def test_request_rate_matches_the_load(observed: Observed) -> None:
    s = observed.signals[A.key]
    load = observed.load
    stats_rate = observed.stats.success.count / observed.stats_window_s
    print(load.summary())
    print(s.message)
    print(f"Prometheus {s.request_rate_rps} req/s, load achieved {load.achieved_rate_rps:.2f}, stats {stats_rate:.2f}")
    assert load.failed == 0, load.errors
    assert s.state is SignalState.OK, s.message
    assert s.request_rate_rps is not None
    assert s.inference_rate_rps is not None
    assert _rel(s.request_rate_rps, load.achieved_rate_rps) <= 0.15
    assert _rel(s.request_rate_rps, stats_rate) <= 0.10
    assert s.inference_rate_rps == pytest.approx(s.request_rate_rps, rel=1e-6)  # single-sample requests
    assert s.pods == 1


def test_batch_size_and_queue_time_match_triton_statistics(observed: Observed) -> None:
    s = observed.signals[A.key]
    st = observed.stats
    assert st.avg_batch_size is not None
    assert st.success.count > 0
    stats_queue_ms = st.queue.ns / st.success.count / 1e6
    print(f"avg batch: Prometheus {s.avg_batch_size}, statistics {st.avg_batch_size:.3f}")
    print(f"queue ms/request: Prometheus {s.queue_time_ms}, statistics {stats_queue_ms:.3f}")
    assert s.avg_batch_size is not None
    assert s.batch_fill is not None
    assert s.queue_time_ms is not None
    assert s.avg_batch_size > 1.3  # the 40 ms queue delay forms real batches at 40 req/s
    assert _rel(s.avg_batch_size, st.avg_batch_size) <= 0.10
    assert s.batch_fill == pytest.approx(s.avg_batch_size / MAX_BATCH)
    assert _rel(s.queue_time_ms, stats_queue_ms) <= 0.20


def test_p99_is_present_and_plausible(observed: Observed) -> None:
    s = observed.signals[A.key]
    print(f"server p99 {s.p99_ms} ms, client p99 {observed.load.p99_ms:.2f} ms")
    assert s.p99_ms is not None
    assert math.isfinite(s.p99_ms)
    assert ALPHA_MS < s.p99_ms <= observed.load.max_ms + 5.0  # server time is within the client's
    assert s.pending_requests is not None


def test_pods_without_traffic_are_idle_not_unknown(observed: Observed) -> None:
    s = observed.signals[B.key]
    print(s.message)
    assert s.state is SignalState.IDLE, s.message
    assert s.request_rate_rps == 0.0
    assert s.batch_fill is None
    assert s.queue_time_ms is None
    assert s.avg_batch_size is None
    for sig in observed.signals.values():
        json.dumps(asdict(sig), allow_nan=False)


def test_only_ready_pods_of_the_batched_model_count(observed: Observed) -> None:
    sig = observed.signals
    both, a = sig[AB.key], sig[A.key]
    assert both.state is SignalState.OK
    assert both.pods == 2
    assert both.request_rate_rps == pytest.approx(a.request_rate_rps)  # triton-b adds zero
    assert both.avg_batch_size == pytest.approx(a.avg_batch_size)
    # triton-a left the Ready set (terminating): its series are still in Prometheus but no longer count
    assert sig[AB_A_TERMINATING.key].state is SignalState.IDLE
    assert sig[AB_A_TERMINATING.key].pods == 1
    assert (sig[OTHER_NS.key].state, sig[OTHER_NS.key].reason) == (SignalState.UNKNOWN, SignalsReason.NO_SERIES)
    assert (sig[UNSCRAPED.key].state, sig[UNSCRAPED.key].reason) == (SignalState.UNKNOWN, SignalsReason.NO_SERIES)
    assert (sig[NO_PODS.key].state, sig[NO_PODS.key].reason) == (SignalState.UNKNOWN, SignalsReason.NO_READY_PODS)


def test_counter_reset_on_restart_neither_negative_nor_a_spike(observed: Observed) -> None:
    print(observed.restart_load.summary())
    rates = [(round(t, 1), s.state.value, s.request_rate_rps) for t, s in observed.across_restart]
    print("across the restart (s, state, req/s):", rates)
    assert observed.restart_load.failed == 0, observed.restart_load.errors
    assert len(rates) >= RESTART_LOAD_S / SCRAPE_S
    raw = observed.raw_success_counter
    drops = [(x, y) for x, y in itertools.pairwise(raw) if y < x]
    print(f"raw counter: {len(raw)} samples, drops {drops}")
    assert len(drops) == 1, "the restart should show up as exactly one counter reset in the scraped series"
    for t, s in observed.across_restart:
        # the window always holds successes from before or after the restart, so the state is never Idle
        assert s.state is SignalState.OK, (t, s.message)
        assert s.request_rate_rps is not None
        assert 0.0 <= s.request_rate_rps <= 1.3 * RATE_RPS, (t, s.message)
        assert s.queue_time_ms is not None
        assert s.queue_time_ms < 2 * QUEUE_DELAY_US / 1000, (t, s.message)
    last = observed.across_restart[-1][1].request_rate_rps
    assert last is not None
    assert last >= 0.6 * RATE_RPS * RESTART_LOAD_S / WINDOW_S


def test_prometheus_down_is_unknown_not_zero(observed: Observed) -> None:
    print(f"fetch with Prometheus stopped took {observed.after_stop_fetch_s:.3f} s")
    for key, s in observed.after_stop.items():
        assert s.state is SignalState.UNKNOWN, key
        assert s.request_rate_rps is None
        assert s.batch_fill is None
        assert s.queue_time_ms is None
        assert s.reason == (
            SignalsReason.NO_READY_PODS if key == NO_PODS.key else SignalsReason.PROMETHEUS_UNAVAILABLE
        ), (key, s.message)
    assert observed.after_stop_fetch_s < 2.0  # no retries with back-off inside a timer tick


def test_prometheus_work_dir_holds_config_and_targets(tmp_path: Path) -> None:
    """The generated configuration and file_sd targets, as Prometheus reads them (no server needed)."""
    prom = LocalPrometheus(
        [ScrapeTarget.from_url("http://127.0.0.1:8002/metrics", NS, "triton-a")],
        scrape_interval_s=0.5,
        work_dir=tmp_path,
    )
    prom.set_targets([*prom.targets, ScrapeTarget("127.0.0.1:8003", NS, "triton-b")])
    entries = json.loads(prom.targets_path.read_text())
    assert entries == [
        {"targets": ["127.0.0.1:8002"], "labels": {"namespace": NS, "pod": "triton-a", "__metrics_path__": "/metrics"}},
        {"targets": ["127.0.0.1:8003"], "labels": {"namespace": NS, "pod": "triton-b", "__metrics_path__": "/metrics"}},
    ]
    cfg = prom.config()
    assert cfg["global"]["scrape_interval"] == "500ms"
    assert cfg["scrape_configs"][0]["file_sd_configs"][0]["files"] == [str(prom.targets_path)]
