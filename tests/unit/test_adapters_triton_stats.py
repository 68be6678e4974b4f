"""Pure parts of the Triton adapters: statistics parsing and deltas, summary quantiles, Poisson arrivals."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from batchfill.adapters.triton_stats import delta, parse_model_stats, summary_quantile_ms
from batchfill.testbed.loadgen import LoadResult, poisson_arrivals


def _stats(count: int, infer_ns: int, *, batch: int = 4, version: str = "1", grpc: bool = False) -> dict[str, Any]:
    """A /v2/models/m/stats answer with one batch size; grpc=True spells uint64 as strings (as_json)."""

    def n(x: int) -> Any:
        return str(x) if grpc else x

    return {
        "model_stats": [
            {
                "name": "m",
                "version": version,
                "inference_count": n(count * batch),
                "execution_count": n(count),
                "inference_stats": {
                    "success": {"count": n(count * batch), "ns": n(count * batch * 2_000_000)},
                    "queue": {"count": n(count * batch), "ns": n(count * batch * 500_000)},
                    "compute_infer": {"count": n(count), "ns": n(infer_ns)},
                },
                "batch_stats": [
                    {
                        "batch_size": n(batch),
                        "compute_input": {"count": n(count), "ns": n(count * 100_000)},
                        "compute_infer": {"count": n(count), "ns": n(infer_ns)},
                        "compute_output": {"count": n(count), "ns": n(count * 200_000)},
                    }
                ],
            },
            {"name": "other", "version": "1", "batch_stats": []},
        ]
    }


@pytest.mark.parametrize("grpc", [False, True])
def test_parse_turns_batch_stats_into_mean_execution_latency(grpc: bool) -> None:
    s = parse_model_stats(_stats(10, 10 * 9_700_000, grpc=grpc), "m")
    assert s.version == "1"
    assert s.execution_count == 10
    assert s.inference_count == 40
    assert s.avg_batch_size == 4
    # (input 0.1 + infer 9.7 + output 0.2) ms per execution
    assert s.exec_latency_ms() == {4: pytest.approx(10.0)}
    assert s.batches[4].executions == 10


def test_parse_picks_the_requested_or_highest_version_and_names_missing_models() -> None:
    doc = _stats(1, 1_000_000)
    doc["model_stats"].append(copy.deepcopy(doc["model_stats"][0]) | {"version": "2", "execution_count": 7})
    assert parse_model_stats(doc, "m").version == "2"
    assert parse_model_stats(doc, "m", "1").execution_count == 1
    with pytest.raises(KeyError, match="nope"):
        parse_model_stats(doc, "nope")


def test_delta_excludes_warm_up_and_drops_batch_sizes_without_new_executions() -> None:
    before = parse_model_stats(_stats(3, 3 * 50_000_000), "m")  # slow warm-up executions
    after = parse_model_stats(_stats(13, 3 * 50_000_000 + 10 * 9_700_000), "m")
    d = delta(before, after)
    assert d.execution_count == 10
    assert d.exec_latency_ms() == {4: pytest.approx(10.0)}
    assert d.queue.mean_ms == pytest.approx(0.5)
    assert delta(after, after).batches == {}
    assert delta(after, after).exec_latency_ms() == {}


def test_delta_refuses_counters_that_went_backwards() -> None:
    before = parse_model_stats(_stats(13, 10**9), "m")
    after = parse_model_stats(_stats(2, 10**7), "m")  # the model was reloaded in between
    with pytest.raises(ValueError, match="reloaded"):
        delta(before, after)


def test_exec_latency_can_require_a_minimum_number_of_executions() -> None:
    s = parse_model_stats(_stats(3, 30_000_000), "m")
    assert s.exec_latency_ms(min_executions=3) == {4: pytest.approx(10.3)}
    assert s.exec_latency_ms(min_executions=4) == {}


METRICS = """\
# HELP nv_inference_request_summary_us Summary of inference request duration in microseconds
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{model="a",version="1"} 10
nv_inference_request_summary_us_sum{model="a",version="1"} 1000
nv_inference_request_summary_us{model="a",version="1",quantile="0.5"} 900
nv_inference_request_summary_us{model="a",version="1",quantile="0.99"} 65432
nv_inference_request_summary_us{model="b",version="1",quantile="0.99"} NaN
# HELP nv_inference_queue_summary_us Summary of inference queue duration in microseconds
# TYPE nv_inference_queue_summary_us summary
nv_inference_queue_summary_us{model="a",version="1",quantile="0.99"} 1234
"""


def test_summary_quantile_reads_the_model_series_in_ms() -> None:
    assert summary_quantile_ms(METRICS, "a") == pytest.approx(65.432)
    assert summary_quantile_ms(METRICS, "a", 0.5) == pytest.approx(0.9)
    assert summary_quantile_ms(METRICS, "a", metric="nv_inference_queue_summary_us") == pytest.approx(1.234)
    assert summary_quantile_ms(METRICS, "b") is None  # no observations yet: NaN never leaves the parser
    assert summary_quantile_ms(METRICS, "missing") is None
    assert summary_quantile_ms(METRICS, "a", version="2") is None


def test_poisson_arrivals_are_seeded_sorted_and_have_the_requested_rate() -> None:
    a = poisson_arrivals(300.0, duration_s=100.0, seed=1)
    assert np.array_equal(a, poisson_arrivals(300.0, duration_s=100.0, seed=1))
    assert not np.array_equal(a, poisson_arrivals(300.0, duration_s=100.0, seed=2))
    assert np.all(np.diff(a) >= 0)
    assert a[-1] < 100.0
    assert abs(len(a) - 30_000) < 5 * math.sqrt(30_000)
    gaps = np.diff(a)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.03)  # exponential: CV = 1
    c = poisson_arrivals(300.0, count=500, seed=1)
    assert len(c) == 500
    np.testing.assert_allclose(c, a[:500])  # same seed: the same first arrivals either way


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"duration_s": 1.0, "count": 3}, "exactly one"),
        ({}, "exactly one"),
        ({"duration_s": 0.0}, "duration must be > 0"),
        ({"count": -1}, "count must be >= 0"),
    ],
)
def test_poisson_arrivals_reject_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        poisson_arrivals(10.0, **kwargs)
    with pytest.raises(ValueError, match="positive finite"):
        poisson_arrivals(0.0, duration_s=1.0)


def test_load_result_reports_rates_and_percentiles() -> None:
    lat = np.arange(1, 101, dtype=float)
    r = LoadResult(
        rate_rps=50, duration_s=2.0, sent=101, ok=100, failed=1, latency_ms=lat,
        send_lag_ms=np.full(101, 0.5), wall_s=2.1,
    )  # fmt: skip
    assert r.achieved_rate_rps == 50
    assert r.p50_ms == pytest.approx(50.5)
    assert r.p99_ms == pytest.approx(99.01)
    assert not r.generator_saturated
    assert "failed 1" in r.summary()
