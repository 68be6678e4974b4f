"""Signals from Prometheus query results: the pure aggregation, the PromQL text, parsing and error classification.

Field cases (docs/field-cases.md): C09 average batch = Δinference_count / Δexec_count and ratios of sums; C10
increase per series before the sum, pods outside the Ready set excluded; C11 zero traffic is Idle, never NaN;
C12 empty or failed queries are Unknown, never zero. The HTTP part runs against a stub server on loopback.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfill.adapters.metrics import (
    PrometheusResponseError,
    PrometheusSignals,
    QueryFailure,
    QueryResults,
    SignalTarget,
    aggregate,
    build_queries,
    build_rate_change_queries,
    parse_vector,
    promql_duration,
)
from batchfill.api.reasons import SignalsReason
from batchfill.policy.signals import ModelSignals, SignalState

NAN, INF = math.nan, math.inf
W = 60.0


def target(pods: set[str] | frozenset[str] = frozenset({"p1"}), *, ns: str = "ml", name: str = "bm", model: str = "m",
           mbs: int = 32) -> SignalTarget:  # fmt: skip
    return SignalTarget(namespace=ns, name=name, model=model, max_batch_size=mbs, ready_pods=frozenset(pods))


def results(
    pods: Mapping[str | tuple[str, str, str], tuple[float, float, float, float]],
    p99_us: Mapping[str, float] | None = None,
    pending: Mapping[str, float] | None = None,
    failures: Mapping[str, float] | None = None,
    pending_min: Mapping[str, float] | None = None,
) -> QueryResults:
    """Per pod (or full (namespace, pod, model) key): (Δsuccess, Δinference_count, Δexec_count, Δqueue_us)."""

    def key(p: str | tuple[str, str, str]) -> tuple[str, str, str]:
        return p if isinstance(p, tuple) else ("ml", p, "m")

    cols: list[dict[tuple[str, str, str], float]] = [{}, {}, {}, {}]
    for p, values in pods.items():
        for col, v in zip(cols, values, strict=True):
            col[key(p)] = v
    return QueryResults(
        success=cols[0],
        inferences=cols[1],
        executions=cols[2],
        queue_us=cols[3],
        p99_us={key(p): v for p, v in (p99_us or {}).items()},
        pending={key(p): v for p, v in (pending or {}).items()},
        pending_min={key(p): v for p, v in (pending_min or {}).items()},
        failures={key(p): v for p, v in (failures or {}).items()},
    )


def one(t: SignalTarget, r: QueryResults | QueryFailure, window_s: float = W) -> ModelSignals:
    out = aggregate([t], r, window_s)
    assert set(out) == {t.key}
    return out[t.key]


def assert_json_safe(s: ModelSignals) -> None:
    """Status patches must be valid JSON: no NaN or Inf anywhere (docs/field-cases.md#no-traffic)."""
    json.dumps(asdict(s), allow_nan=False)


# -- C09: the right counters, sums before division (docs/field-cases.md#average-batch-size) ----------------------


def test_c09_average_batch_is_inferences_over_executions() -> None:
    s = one(target(), results({"p1": (200, 800, 50, 200 * 3000)}))
    assert s.state is SignalState.OK
    assert s.avg_batch_size == pytest.approx(16.0)  # not 4.0 (requests/exec) nor 0.25 (exec/requests)
    assert s.batch_fill == pytest.approx(0.5)  # not 0.125
    assert s.request_rate_rps == pytest.approx(200 / W)
    assert s.inference_rate_rps == pytest.approx(800 / W)
    assert s.queue_time_ms == pytest.approx(3.0)  # divisor Δrequest_success, not Δinference or Δexec
    assert s.pods == 1
    assert s.window_s == W
    assert_json_safe(s)


def test_c09_ratios_of_sums_over_pods_not_mean_of_ratios() -> None:
    # pod 1: 100 single-sample executions; pod 2: 700 samples in 10 executions.
    s = one(target({"p1", "p2"}), results({"p1": (100, 100, 100, 100_000), "p2": (100, 700, 10, 900_000)}))
    assert s.avg_batch_size == pytest.approx(800 / 110)  # mean of ratios would be 35.5
    assert s.queue_time_ms == pytest.approx(1_000_000 / 200 / 1000)  # 5 ms; mean of per-pod means is also 5
    assert s.request_rate_rps == pytest.approx(200 / W)
    assert s.pods == 2


@pytest.mark.parametrize(
    ("pods", "expected_queue_ms"),
    [
        ({"p1": (10, 10, 10, 10_000), "p2": (990, 990, 990, 990 * 20_000)}, (10_000 + 990 * 20_000) / 1000 / 1000),
        ({"p1": (1, 1, 1, 500_000), "p2": (999, 999, 999, 0)}, 0.5),  # one slow request among many
    ],
)
def test_c09_queue_time_weights_pods_by_requests(
    pods: dict[str, tuple[float, float, float, float]], expected_queue_ms: float
) -> None:
    s = one(target({"p1", "p2"}), results(pods))
    assert s.queue_time_ms == pytest.approx(expected_queue_ms)


# -- C10: increase per series, then sum; pods outside the Ready set excluded (docs/field-cases.md#counter-resets) --


def test_c10_queries_take_increase_per_series_then_sum() -> None:
    q = build_queries([target()], W)
    for name, metric in [
        ("success", "nv_inference_request_success"),
        ("inferences", "nv_inference_count"),
        ("executions", "nv_inference_exec_count"),
        ("queue_us", "nv_inference_queue_duration_us"),
    ]:
        assert q[name] == f'sum by (namespace, pod, model) (increase({metric}{{model=~"m",namespace=~"ml"}}[60s]))'
    assert q["p99_us"] == (
        'max by (namespace, pod, model) (nv_inference_request_summary_us{quantile="0.99",model=~"m",namespace=~"ml"})'
    )
    assert (
        q["pending"]
        == 'sum by (namespace, pod, model) (nv_inference_pending_request_count{model=~"m",namespace=~"ml"})'
    )
    for text in q.values():
        assert "increase(sum" not in text
        assert "rate(sum" not in text


def test_c10_restart_table_gives_queue_time_between_20_and_25_ms() -> None:
    # One pod scraped every 15 s restarts between the third and the fourth scrape: queue µs 1.0M, 1.3M, 1.6M, 50k,
    # 350k and requests 1000, 1015, 1030, 2, 17. Prometheus' increase() counts a drop as a reset and adds the
    # post-reset value: Δqueue = 300k + 300k + 50k + 300k, Δsuccess = 15 + 15 + 2 + 15.
    s = one(target(), results({"p1": (47, 47, 47, 950_000)}))
    assert s.queue_time_ms is not None
    assert 20.0 <= s.queue_time_ms <= 25.0


def test_c10_terminating_pod_series_excluded() -> None:
    # p-old still has series in the window (and wild values from its shutdown) but is no longer Ready.
    r = results(
        {"p-new": (15, 15, 15, 300_000), "p-old": (-1000, NAN, 0, -1.6e9)},
        p99_us={"p-new": 30_000, "p-old": INF},
        pending={"p-new": 0, "p-old": 500},
    )
    s = one(target({"p-new"}), r)
    assert s.state is SignalState.OK
    assert s.pods == 1
    assert s.queue_time_ms == pytest.approx(20.0)
    assert s.p99_ms == pytest.approx(30.0)
    assert s.pending_requests == 0


def test_other_batched_model_with_same_model_name_excluded() -> None:
    r = results(
        {
            ("ml", "p1", "m"): (60, 120, 60, 60_000),
            ("other", "p1", "m"): (6000, 6000, 6000, 6e9),  # same pod and model names, another namespace
            ("ml", "p1", "m2"): (6000, 6000, 6000, 6e9),  # another model on the same pod
            ("ml", "q1", "m"): (6000, 6000, 6000, 6e9),  # same model, pod of another BatchedModel
        }
    )
    s = one(target({"p1"}), r)
    assert s.request_rate_rps == pytest.approx(1.0)
    assert s.avg_batch_size == pytest.approx(2.0)
    assert s.queue_time_ms == pytest.approx(1.0)
    assert one(target({"p1"}, ns="nowhere"), r).reason == SignalsReason.NO_SERIES


def test_two_targets_in_one_pass() -> None:
    r = results({"p1": (60, 60, 60, 0), "q1": (0, 0, 0, 0)})
    out = aggregate([target({"p1"}, name="a"), target({"q1"}, name="b"), target(set(), name="c")], r, W)
    assert {k: v.state for k, v in out.items()} == {
        ("ml", "a"): SignalState.OK,
        ("ml", "b"): SignalState.IDLE,
        ("ml", "c"): SignalState.UNKNOWN,
    }
    assert out[("ml", "c")].reason == SignalsReason.NO_READY_PODS


# -- C11: no traffic is Idle, never NaN (docs/field-cases.md#no-traffic) -------------------------------------------


def test_c11_zero_increase_is_idle_not_nan() -> None:
    s = one(target({"p1", "p2", "p3"}), results(dict.fromkeys(("p1", "p2", "p3"), (0, 0, 0, 0))))
    assert s.state is SignalState.IDLE
    assert s.reason == ""
    assert s.request_rate_rps == 0.0
    assert s.inference_rate_rps == 0.0
    assert s.batch_fill is None
    assert s.avg_batch_size is None
    assert s.queue_time_ms is None
    assert s.p99_ms is None
    assert s.pods == 3
    assert_json_safe(s)


def test_c11_idle_ignores_a_stale_p99_and_reports_pending() -> None:
    s = one(target(), results({"p1": (0, 0, 0, 0)}, p99_us={"p1": 45_000}, pending={"p1": 0}))
    assert s.state is SignalState.IDLE
    assert s.p99_ms is None  # the summary's old observations describe no request of this window
    assert s.pending_requests == 0


def test_zero_completions_with_requests_pending_all_the_window_is_stalled_not_idle() -> None:
    s = one(target(), results({"p1": (0, 0, 0, 0)}, pending={"p1": 7}, pending_min={"p1": 2}))
    assert s.state is SignalState.UNKNOWN
    assert s.reason == SignalsReason.STALLED
    assert "pending all of it (7 now)" in s.message


@pytest.mark.parametrize("low", [{"p1": 0}, {}], ids=["none-pending-at-some-point", "no-series"])
def test_zero_completions_of_requests_that_just_came_are_in_flight_not_stalled(low: dict[str, float]) -> None:
    """A load that starts: the first requests are pending at the scrape, none has completed yet (test_demo_real saw
    'Stalled' and its Warning at the first tick of its load)."""
    s = one(target(), results({"p1": (0, 0, 0, 0)}, pending={"p1": 4}, pending_min=low))
    assert s.state is SignalState.UNKNOWN
    assert s.reason == SignalsReason.REQUESTS_IN_FLIGHT


# -- C12: empty or failed is Unknown, never zero (docs/field-cases.md#missing-metrics) -----------------------------


@pytest.mark.parametrize(
    "failure",
    [
        QueryFailure(SignalsReason.PROMETHEUS_UNAVAILABLE, "connection refused"),
        QueryFailure(SignalsReason.PROMETHEUS_TIMEOUT, "read timed out"),
        QueryFailure(SignalsReason.PROMETHEUS_ERROR, "HTTP 400"),
    ],
)
def test_c12_failed_query_makes_every_target_unknown(failure: QueryFailure) -> None:
    out = aggregate([target({"p1"}, name="a"), target({"q1"}, name="b")], failure, W)
    for s in out.values():
        assert s.state is SignalState.UNKNOWN
        assert s.reason == failure.reason
        assert s.message == failure.message
        assert s.request_rate_rps is None
        assert s.queue_time_ms is None
        assert_json_safe(s)


def test_c12_empty_result_is_no_series_not_zero() -> None:
    s = one(target(), QueryResults())
    assert s.state is SignalState.UNKNOWN
    assert s.reason == SignalsReason.NO_SERIES
    assert s.request_rate_rps is None


def test_c11_and_c12_through_the_same_path_differ() -> None:
    idle = one(target(), results({"p1": (0, 0, 0, 0)}))
    missing = one(target(), results({}))
    assert (idle.state, missing.state) == (SignalState.IDLE, SignalState.UNKNOWN)


def test_no_ready_pods_wins_over_a_failure() -> None:
    s = one(target(set()), QueryFailure(SignalsReason.PROMETHEUS_UNAVAILABLE, "down"))
    assert (s.state, s.reason) == (SignalState.UNKNOWN, SignalsReason.NO_READY_PODS)


def test_pod_without_all_counter_series_does_not_count() -> None:
    r = results({"p1": (60, 60, 60, 0), "p2": (600, 600, 600, 0)})
    partial = QueryResults(
        success=r.success, inferences=r.inferences, executions={k: v for k, v in r.executions.items() if k[1] == "p1"},
        queue_us=r.queue_us,
    )  # fmt: skip
    s = one(target({"p1", "p2"}), partial)
    assert s.pods == 1
    assert s.request_rate_rps == pytest.approx(1.0)
    only_partial = one(target({"p2"}), partial)
    assert only_partial.reason == SignalsReason.NO_SERIES
    assert "incomplete series for p2" in only_partial.message


def test_ready_pod_not_yet_scraped_is_left_out() -> None:
    s = one(target({"p1", "p-new"}), results({"p1": (60, 60, 60, 0)}))
    assert s.state is SignalState.OK
    assert s.pods == 1
    assert "1 of 2 Ready pod(s)" in s.message


# -- NaN, Inf, negative --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [NAN, INF, -INF, -1.0])
@pytest.mark.parametrize("column", range(4))
def test_invalid_counter_sample_of_a_counted_pod_is_unknown(bad: float, column: int) -> None:
    values = [60.0, 120.0, 60.0, 6000.0]
    values[column] = bad
    s = one(target({"p1", "p2"}), results({"p1": (60, 60, 60, 0), "p2": tuple(values)}))  # type: ignore[dict-item]
    assert (s.state, s.reason) == (SignalState.UNKNOWN, SignalsReason.INVALID_VALUE)
    assert_json_safe(s)


@pytest.mark.parametrize("bad", [INF, -INF, -5.0])
@pytest.mark.parametrize("gauge", ["p99_us", "pending"])
def test_infinite_or_negative_gauge_is_unknown(bad: float, gauge: str) -> None:
    s = one(target(), results({"p1": (60, 60, 60, 0)}, **{gauge: {"p1": bad}}))
    assert (s.state, s.reason) == (SignalState.UNKNOWN, SignalsReason.INVALID_VALUE)


def test_nan_p99_means_no_observation_and_leaves_p99_none() -> None:
    s = one(target({"p1", "p2"}), results({"p1": (60, 60, 60, 0), "p2": (60, 60, 60, 0)}, p99_us={"p1": NAN}))
    assert s.state is SignalState.OK
    assert s.p99_ms is None
    assert_json_safe(s)


def test_missing_p99_and_pending_with_traffic_are_none_not_unknown() -> None:
    s = one(target(), results({"p1": (60, 60, 60, 6000)}))
    assert s.state is SignalState.OK
    assert s.p99_ms is None
    assert s.pending_requests is None
    assert s.queue_time_ms == pytest.approx(0.1)


def test_p99_is_the_largest_over_pods_and_pending_the_sum() -> None:
    pods = dict.fromkeys(("p1", "p2", "p3"), (60.0, 60.0, 60.0, 0.0))
    s = one(
        target(set(pods)),
        results(pods, p99_us={"p1": 12_000, "p2": 48_500, "p3": NAN}, pending={"p1": 2, "p2": 3, "p3": NAN}),
    )
    assert s.p99_ms == pytest.approx(48.5)
    assert s.pending_requests == 5


# -- batch fill edges ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "mbs", "avg", "fill"),
    [
        ({"p1": (10, 10, 0, 100)}, 8, None, None),  # traffic but no execution counted in the window edge
        ({"p1": (10, 90, 2, 100)}, 32, 45.0, 1.0),  # extrapolation above max_batch_size: fill clipped
        ({"p1": (10, 20, 10, 100)}, 0, 2.0, None),  # max_batch_size 0: Triton does not batch
        ({"p1": (10, 10, 10, 100)}, 1, 1.0, 1.0),
    ],
)
def test_batch_fill_edges(
    pods: dict[str, tuple[float, float, float, float]], mbs: int, avg: float | None, fill: float | None
) -> None:
    s = one(target(mbs=mbs), results(pods))
    assert s.state is SignalState.OK
    assert s.avg_batch_size == (pytest.approx(avg) if avg is not None else None)
    assert s.batch_fill == (pytest.approx(fill) if fill is not None else None)


finite_or_not = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, NAN, INF, -INF, 1e308, -1e-300])
)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.tuples(*[finite_or_not] * 6), min_size=0, max_size=3),
    mbs=st.integers(min_value=0, max_value=4096),
    window=st.sampled_from([1.0, 15.0, 60.0]),
)
def test_any_input_gives_a_valid_json_safe_signal(
    values: list[tuple[float, float, float, float, float, float]], mbs: int, window: float
) -> None:
    pods = [f"p{i}" for i in range(len(values))]
    r = results(
        {p: v[:4] for p, v in zip(pods, values, strict=True)},
        p99_us={p: v[4] for p, v in zip(pods, values, strict=True)},
        pending={p: v[5] for p, v in zip(pods, values, strict=True)},
    )
    s = one(target(set(pods) | {"p-unscraped"}, mbs=mbs), r, window)  # never raises
    assert_json_safe(s)
    if s.batch_fill is not None:
        assert 0.0 <= s.batch_fill <= 1.0
    if s.state is not SignalState.UNKNOWN:
        assert s.request_rate_rps is not None


# -- PromQL text and parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "text"), [(60, "60s"), (15.0, "15s"), (1.5, "1500ms"), (0.25, "250ms")])
def test_promql_duration(seconds: float, text: str) -> None:
    assert promql_duration(seconds) == text


@pytest.mark.parametrize("bad", [0, -1, NAN, INF, 0.0001])
def test_promql_duration_rejects(bad: float) -> None:
    with pytest.raises(ValueError, match="window"):
        promql_duration(bad)


def test_queries_cover_all_targets_once_and_escape_regex() -> None:
    ts = [target(ns="a", model="resnet.v1"), target(ns="b", model="m+x"), target(ns="a", model="resnet.v1", name="2")]
    q = build_queries(ts, 30)
    assert len(q) == 8
    assert q["pending_min"].startswith(
        "sum by (namespace, pod, model) (min_over_time(nv_inference_pending_request_count{"
    )
    assert q["pending_min"].endswith("[30s]))")
    assert '{model=~"m\\\\+x|resnet\\\\.v1",namespace=~"a|b"}' in q["success"]
    assert "[30s]" in q["success"]
    with pytest.raises(ValueError, match="no targets"):
        build_queries([], 30)


def test_parse_vector_keeps_special_values_and_labels() -> None:
    raw = [
        {"metric": {"namespace": "ml", "pod": "p1", "model": "m"}, "value": [1.7e9, "12.5"]},
        {"metric": {"namespace": "ml", "pod": "p2", "model": "m"}, "value": [1.7e9, "NaN"]},
        {"metric": {"namespace": "ml", "pod": "p3", "model": "m"}, "value": [1.7e9, "+Inf"]},
        {"metric": {"pod": "p4"}, "value": [1.7e9, "-Inf"]},
    ]
    out = parse_vector(raw)
    assert out[("ml", "p1", "m")] == 12.5
    assert math.isnan(out[("ml", "p2", "m")])
    assert out[("ml", "p3", "m")] == INF
    assert out[("", "p4", "")] == -INF
    assert parse_vector([]) == {}


@pytest.mark.parametrize(
    "raw",
    [
        {"resultType": "vector"},
        [1.7e9, "3"],  # a scalar answer
        [{"metric": {}, "value": [1.7e9, "abc"]}],
        [{"metric": {}}],
        [{"value": [1.7e9, "1"]}],
        [{"metric": {"pod": "p"}, "value": [1, "1"]}, {"metric": {"pod": "p"}, "value": [1, "2"]}],  # duplicate
    ],
)
def test_parse_vector_rejects_malformed(raw: Any) -> None:
    with pytest.raises(PrometheusResponseError):
        parse_vector(raw)


# -- PrometheusSignals against a stub HTTP server (error classification) -------------------------------------------

Reply = tuple[int, bytes] | None  # None: accept the request and never answer


def _vector(samples: dict[tuple[str, str, str], str]) -> bytes:
    result = [
        {"metric": {"namespace": n, "pod": p, "model": m}, "value": [1.7e9, v]} for (n, p, m), v in samples.items()
    ]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


@pytest.fixture
def stub() -> Iterator[tuple[str, list[Callable[[str], Reply]], list[dict[str, list[str]]]]]:
    """A loopback HTTP server answering ``/api/v1/query`` with ``handlers[0](query)``; records the parameters."""
    handlers: list[Callable[[str], Reply]] = []
    seen: list[dict[str, list[str]]] = []
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            params = parse_qs(urlsplit(self.path).query)
            seen.append(params)
            reply = handlers[0](params["query"][0])
            if reply is None:
                release.wait(10)
                return
            status, body = reply
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handlers, seen
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_fetch_ok_one_query_per_signal_at_one_instant(stub: Any) -> None:
    url, handlers, seen = stub
    key = ("ml", "p1", "m")
    canned = {
        "nv_inference_request_success": "120",
        "nv_inference_count": "480",
        "nv_inference_exec_count": "60",
        "nv_inference_queue_duration_us": "240000",
        "nv_inference_request_summary_us": "25000",
        "nv_inference_pending_request_count": "1",
        "nv_inference_request_failure": "30",
    }

    def answer(query: str) -> Reply:
        if query.startswith(("avg_over_time", "count_over_time")):  # the rate variability, per model
            return 200, _vector({("ml", "", "m"): "0.0025" if query.startswith("avg") else "121"})
        metric = next(m for m in canned if m + "{" in query)
        return 200, _vector({key: canned[metric], ("ml", "other-pod", "m"): "NaN"})

    handlers.append(answer)
    with PrometheusSignals(url, window_s=60, timeout_s=2) as prom:
        out = prom.fetch([target({"p1"}, mbs=8), target(set(), name="empty")], at=1_700_000_000.0)
    s = out[("ml", "bm")]
    assert s.state is SignalState.OK, s.message
    assert s.request_rate_rps == pytest.approx(2.0)
    assert s.avg_batch_size == pytest.approx(8.0)
    assert s.batch_fill == pytest.approx(1.0)
    assert s.queue_time_ms == pytest.approx(2.0)
    assert s.p99_ms == pytest.approx(25.0)
    assert s.pending_requests == 1
    assert s.failure_rate_rps == pytest.approx(0.5)
    assert s.rate_change_rms == pytest.approx(0.05)
    assert out[("ml", "empty")].reason == SignalsReason.NO_READY_PODS
    assert len(seen) == 10
    assert {p["time"][0] for p in seen} == {"1700000000.000"}
    assert {p["timeout"][0] for p in seen} == {"2s"}


def test_fetch_without_ready_pods_asks_nothing(stub: Any) -> None:
    url, handlers, seen = stub
    handlers.append(lambda q: (500, b""))
    with PrometheusSignals(url) as prom:
        out = prom.fetch([target(set())])
    assert out[("ml", "bm")].reason == SignalsReason.NO_READY_PODS
    assert seen == []


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ((503, b"Service Unavailable"), SignalsReason.PROMETHEUS_UNAVAILABLE),
        (
            (503, b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}'),
            SignalsReason.PROMETHEUS_TIMEOUT,
        ),
        ((400, b'{"status":"error","errorType":"bad_data","error":"parse error"}'), SignalsReason.PROMETHEUS_ERROR),
        ((422, b'{"status":"error","errorType":"execution","error":"many-to-many"}'), SignalsReason.PROMETHEUS_ERROR),
        ((500, b"oops"), SignalsReason.PROMETHEUS_ERROR),
        ((200, b"<html>a proxy login page</html>"), SignalsReason.PROMETHEUS_ERROR),
        (
            (200, b'{"status":"success","data":{"resultType":"scalar","result":[1.7e9,"1"]}}'),
            SignalsReason.PROMETHEUS_ERROR,
        ),
        ((200, b'{"status":"success"}'), SignalsReason.PROMETHEUS_ERROR),
    ],
)
def test_fetch_failures_are_told_apart(stub: Any, reply: tuple[int, bytes], reason: str) -> None:
    url, handlers, seen = stub
    handlers.append(lambda q: reply)
    with PrometheusSignals(url, timeout_s=2) as prom:
        out = prom.fetch([target({"p1"}, name="a"), target({"q1"}, name="b")])
    assert {s.reason for s in out.values()} == {reason}, out
    assert all(s.state is SignalState.UNKNOWN and s.request_rate_rps is None for s in out.values())
    # the ten queries run concurrently (a failure cancels only those not sent yet); none is retried
    sent = [q["query"][0] for q in seen]
    assert 1 <= len(sent) <= 10
    assert len(set(sent)) == len(sent), sent


def test_fetch_timeout(stub: Any) -> None:
    url, handlers, _ = stub
    handlers.append(lambda q: None)
    with PrometheusSignals(url, timeout_s=0.3) as prom:
        s = prom.fetch([target()])[("ml", "bm")]
    assert (s.state, s.reason) == (SignalState.UNKNOWN, SignalsReason.PROMETHEUS_TIMEOUT)


def test_fetch_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        with PrometheusSignals(f"http://127.0.0.1:{port}", timeout_s=2) as prom:
            s = prom.fetch([target()])[("ml", "bm")]
    assert (s.state, s.reason) == (SignalState.UNKNOWN, SignalsReason.PROMETHEUS_UNAVAILABLE)
    assert "Connection refused" in s.message


@pytest.mark.parametrize(
    "kwargs", [{"window_s": 0}, {"window_s": NAN}, {"timeout_s": 0}, {"timeout_s": INF}, {"variability_refresh_s": NAN}]
)
def test_signals_reject_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="positive"):
        PrometheusSignals("http://127.0.0.1:1", **kwargs)


# -- failed requests are traffic, not idleness ----------------------------------------------------------------------


def test_failure_query_takes_increase_per_series_then_sum() -> None:
    q = build_queries([target()], W)
    assert q["failures"] == (
        'sum by (namespace, pod, model) (increase(nv_inference_request_failure{model=~"m",namespace=~"ml"}[60s]))'
    )


def test_every_request_failing_is_ok_with_a_failure_rate_not_idle() -> None:
    # the model rejects every input: success, inferences, executions and queue time stay flat, failures grow
    # (Triton 2.51 counts the failed executions, without samples)
    s = one(target({"p1", "p2"}), results({"p1": (0, 0, 9, 0), "p2": (0, 0, 3, 0)}, failures={"p1": 90, "p2": 30}))
    assert s.state is SignalState.OK, s.message
    assert (s.request_rate_rps, s.inference_rate_rps) == (0.0, 0.0)
    assert s.failure_rate_rps == pytest.approx(120 / W)
    assert s.failure_fraction == 1.0
    assert (s.avg_batch_size, s.batch_fill, s.queue_time_ms) == (None, None, None)
    assert "failed 2.00 req/s" in s.message
    assert_json_safe(s)


def test_failures_with_pending_requests_are_not_stalled() -> None:
    s = one(target(), results({"p1": (0, 0, 0, 0)}, pending={"p1": 4}, failures={"p1": 6}))
    assert (s.state, s.failure_rate_rps, s.pending_requests) == (SignalState.OK, pytest.approx(0.1), 4)


def test_some_failures_among_successes_give_their_share() -> None:
    s = one(target(), results({"p1": (270, 270, 90, 270 * 1000)}, failures={"p1": 30}))
    assert s.state is SignalState.OK
    assert s.request_rate_rps == pytest.approx(4.5)
    assert s.failure_fraction == pytest.approx(0.1)
    assert s.queue_time_ms == pytest.approx(1.0)


def test_no_traffic_and_no_failures_is_still_idle_and_the_counter_is_optional() -> None:
    idle = one(target(), results({"p1": (0, 0, 0, 0)}, failures={"p1": 0}))
    assert (idle.state, idle.failure_rate_rps) == (SignalState.IDLE, 0.0)
    # a Triton without the failure series: the pod still counts, the rate is not measured
    s = one(target(), results({"p1": (60, 60, 60, 0)}))
    assert (s.state, s.failure_rate_rps, s.failure_fraction) == (SignalState.OK, None, None)


@pytest.mark.parametrize("bad", [NAN, INF, -1.0])
def test_invalid_failure_increase_is_unknown(bad: float) -> None:
    s = one(target(), results({"p1": (60, 60, 60, 0)}, failures={"p1": bad}))
    assert (s.state, s.reason) == (SignalState.UNKNOWN, SignalsReason.INVALID_VALUE)
    assert "failures" in s.message


# -- the rate variability (policy/headroom.py) ------------------------------------------------------------------
MODEL_KEY = ("ml", "", "m")


def with_variability(r: QueryResults, mean_square: float | None, count: float | None) -> QueryResults:
    return QueryResults(
        **{
            **{f: getattr(r, f) for f in ("success", "inferences", "executions", "queue_us", "failures")},
            "rate_change_ms": {} if mean_square is None else {MODEL_KEY: mean_square},
            "rate_change_count": {} if count is None else {MODEL_KEY: count},
        }
    )


TRAFFIC = results({"p1": (120.0, 480.0, 60.0, 240_000.0)})
NO_TRAFFIC = results({"p1": (0.0, 0.0, 0.0, 0.0)})


@pytest.mark.parametrize(
    ("mean_square", "count", "expected"),
    [
        (0.0025, 120.0, 0.05),
        (0.0, 60.0, 0.0),
        (0.0025, 59.0, None),  # fewer than half the horizon's changes
        (None, 120.0, None),
        (0.0025, None, None),
        (None, None, None),  # no positive rate at both ends of any change
        (NAN, 120.0, None),
        (INF, 120.0, None),
        (-0.1, 120.0, None),
        (0.0025, NAN, None),
        (0.0025, INF, None),
    ],
)
def test_rate_variability_cases(mean_square: float | None, count: float | None, expected: float | None) -> None:
    s = one(target(), with_variability(TRAFFIC, mean_square, count))
    assert s.state is SignalState.OK
    assert s.rate_change_rms == (None if expected is None else pytest.approx(expected))
    assert_json_safe(s)


def test_rate_variability_is_per_model_and_namespace_and_kept_when_idle() -> None:
    idle = one(target(), with_variability(NO_TRAFFIC, 0.01, 120.0))
    assert (idle.state, idle.rate_change_rms) == (SignalState.IDLE, pytest.approx(0.1))
    assert one(target(model="other"), with_variability(TRAFFIC, 0.01, 120.0)).rate_change_rms is None
    assert one(target(ns="other"), with_variability(TRAFFIC, 0.01, 120.0)).rate_change_rms is None


def test_rate_variability_query_sums_every_pod_of_the_model_per_series_increase() -> None:
    q = build_rate_change_queries([target(), target(ns="b", model="n.1")])
    total = (
        'sum by (namespace, model) (increase(nv_inference_request_success{model=~"m|n\\\\.1",namespace=~"b|ml"}[60s]'
    )
    for name, fn in (("rate_change_ms", "avg_over_time"), ("rate_change_count", "count_over_time")):
        assert q[name].startswith(f"{fn}((")
        assert q[name].count(total) == 2
        assert f"{total} offset 60s)) > 0)) ^ 2)[1800s:15s])" in q[name]
        assert "pod" not in q[name]
    with pytest.raises(ValueError, match="no targets"):
        build_rate_change_queries([])


def test_a_failing_variability_query_leaves_the_other_signals(stub: Any) -> None:
    url, handlers, _ = stub

    def answer(query: str) -> Reply:
        if query.startswith(("avg_over_time", "count_over_time")):
            return (
                422,
                b'{"status":"error","errorType":"execution","error":"query processing would load too many samples"}',
            )
        return 200, _vector({("ml", "p1", "m"): "120"})

    handlers.append(answer)
    with PrometheusSignals(url, window_s=60, timeout_s=2) as prom:
        s = prom.fetch([target()])[("ml", "bm")]
    assert s.state is SignalState.OK, s.message
    assert s.request_rate_rps == pytest.approx(2.0)
    assert s.rate_change_rms is None


def test_the_variability_is_reused_for_its_refresh_interval_and_retried_after_a_failure(stub: Any) -> None:
    url, handlers, seen = stub
    fail = {"variability": False}

    def answer(query: str) -> Reply:
        if query.startswith(("avg_over_time", "count_over_time")):
            if fail["variability"]:
                return 503, b""
            return 200, _vector({MODEL_KEY: "0.0025" if query.startswith("avg") else "120"})
        return 200, _vector({("ml", "p1", "m"): "120"})

    handlers.append(answer)
    t0 = 1_700_000_000.0
    with PrometheusSignals(url, window_s=60, timeout_s=2, variability_refresh_s=60) as prom:
        counts = []
        for at, failing in ((t0, False), (t0 + 15, False), (t0 + 59, True), (t0 + 60, True), (t0 + 75, False)):
            fail["variability"] = failing
            before = len(seen)
            s = prom.fetch([target()], at=at)[("ml", "bm")]
            counts.append((len(seen) - before, s.rate_change_rms))
    assert counts == [(10, pytest.approx(0.05)), (8, pytest.approx(0.05)), (8, pytest.approx(0.05)), (10, None),
                      (10, pytest.approx(0.05))]  # fmt: skip
