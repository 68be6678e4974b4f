"""The rate variability (policy/headroom.py) read through a real Prometheus, checked against the estimator the
fleet simulator uses on the rates the series were made from.

The estimate needs 30 min of history, so a real Prometheus (Debian 2.42) starts on 40 min of Triton's counter
series written into its TSDB beforehand (``promtool tsdb create-blocks-from openmetrics``, the same package)
instead of scraping a tritonserver for 40 min; tests/component/test_metrics_real.py reads the same metric names
from live tritonservers. The series are Triton's four counters per pod, with ``namespace``/``pod``/``model``
labels as a ServiceMonitor writes them, one sample per 15 s, for four models:

* ``steady``: one pod the whole time, 200 req/s with independent log-normal noise of σ 0.03 per minute;
* ``churn``: the same noise at σ 0.25 on two pods sharing the load; one pod is replaced by a new one 20 min
  before the query (a new series from 0) and the other restarts 10 min before it (its counters reset to 0);
* ``young``: traffic for the last 10 min only, too few changes for an estimate;
* ``idle``: counters that never move.

The expected value is :func:`batchfill.policy.headroom.rate_change_rms` on the model's exact rate over the
60 s before every 15 s step. Tolerances: 3 % on ``steady`` (Prometheus' subquery takes both ends of its 30 min,
121 changes against the estimator's 120; seeds 1-7 differed by -0.4 % to +1.5 %); 5 % on ``churn``, whose series
start and end inside some windows, where Prometheus extrapolates ``increase`` (seeds 1-7: within 0.6 %).

A second Prometheus on the same history, started with ``--query.max-samples`` too small for the 30 min
subquery but not for the instant queries, shows that a failing variability query leaves the variability
unknown and every other signal as it was.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from batchfill.adapters.metrics import PrometheusSignals, SignalTarget, TargetKey
from batchfill.api.spec import DEFAULT_MAX_TARGET_UTILIZATION
from batchfill.policy.headroom import (
    RATE_CHANGE_LAG_S,
    RATE_CHANGE_STEP_S,
    effective_target_utilization,
    rate_change_rms,
)
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.testbed.prometheus_local import DEFAULT_BINARY, PROMTOOL, LocalPrometheus
from batchfill.testbed.triton_history import counter_samples, openmetrics

pytestmark = [
    pytest.mark.component,
    pytest.mark.skipif(
        shutil.which(DEFAULT_BINARY) is None or shutil.which(PROMTOOL) is None,
        reason=f"{DEFAULT_BINARY} and {PROMTOOL} (Debian's prometheus package) are needed",
    ),
]

NS = "ns1"
HISTORY_S = 2400
STEADY = SignalTarget(NS, "bm-steady", "steady", 8, frozenset({"steady-a"}))
CHURN = SignalTarget(NS, "bm-churn", "churn", 8, frozenset({"churn-a", "churn-c"}))
YOUNG = SignalTarget(NS, "bm-young", "young", 8, frozenset({"young-a"}))
IDLE = SignalTarget(NS, "bm-idle", "idle", 8, frozenset({"idle-a"}))
TARGETS = [STEADY, CHURN, YOUNG, IDLE]
#: Above the instant queries' samples (4 counters x 5 pods x 5 samples), far below the subquery's.
MAX_SAMPLES = 1000


@dataclass(frozen=True)
class History:
    """The series written and the truth behind them."""

    openmetrics: str
    now: int  # the query time, Unix seconds (the last sample's)
    expected: dict[str, float | None]  # model -> rate_change_rms on the exact rates


def _minute_rates(rng: np.random.Generator, sigma: float, minutes: int) -> np.ndarray:
    return np.asarray(200.0 * np.exp(rng.normal(0.0, sigma, minutes)))


def _history(seed: int = 7) -> History:
    """Counter samples every 15 s for HISTORY_S up to now, rounded to whole seconds (module docstring)."""
    rng = np.random.default_rng(seed)
    now = int(time.time()) // RATE_CHANGE_STEP_S * RATE_CHANGE_STEP_S - RATE_CHANGE_STEP_S
    start = now - HISTORY_S
    steps = list(range(start, now + 1, RATE_CHANGE_STEP_S))
    minutes = HISTORY_S // 60 + 2
    rates = {"steady": _minute_rates(rng, 0.03, minutes), "churn": _minute_rates(rng, 0.25, minutes)}
    rates["young"] = _minute_rates(rng, 0.1, minutes)
    rates["idle"] = np.zeros(minutes)
    lines: list[str] = []
    totals: dict[str, dict[int, float]] = {m: {} for m in rates}
    counters: dict[str, float] = {}  # pod -> success count since its (re)start

    def pods_at(model: str, t: int) -> list[str]:
        if model == "churn":
            return ["churn-a", "churn-b" if t < now - 1200 else "churn-c"]
        return [f"{model}-a"] if model != "young" or t > now - 600 else []

    for t in steps:
        for model, per_minute in rates.items():
            pods = pods_at(model, t)
            served = float(per_minute[(t - start) // 60]) * RATE_CHANGE_STEP_S if t > start and pods else 0.0
            totals[model][t] = totals[model].get(t - RATE_CHANGE_STEP_S, 0.0) + served
            for pod in pods:
                if model == "churn" and pod == "churn-a" and t == now - 600:
                    counters[pod] = 0.0  # the container restarted: Triton's counters start over
                counters[pod] = counters.get(pod, 0.0) + served / len(pods)
                lines += counter_samples(NS, pod, model, t, counters[pod])
    expected: dict[str, float | None] = {}
    for model, total in totals.items():
        window_rates = {
            t: (total[t] - total[t - RATE_CHANGE_LAG_S]) / RATE_CHANGE_LAG_S
            for t in total
            if t - RATE_CHANGE_LAG_S in total
        }
        expected[model] = rate_change_rms(window_rates, now)[0]
    return History(openmetrics(lines), now, expected)


@dataclass(frozen=True)
class Observed:
    history: History
    signals: dict[TargetKey, ModelSignals]
    signals_query_limited: dict[TargetKey, ModelSignals]


def _read(history: History, work_dir: Path, extra_args: list[str]) -> dict[TargetKey, ModelSignals]:
    prom = LocalPrometheus(work_dir=work_dir, extra_args=extra_args)
    try:
        prom.backfill(history.openmetrics)
        prom.start()
        with PrometheusSignals(prom.url, window_s=60.0, timeout_s=20.0) as signals:
            return signals.fetch(TARGETS, at=history.now)
    finally:
        prom.close()


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Observed:
    root = tmp_path_factory.mktemp("rate_variability")
    history = _history()
    full = _read(history, root / "full", [])
    limited = _read(history, root / "limited", [f"--query.max-samples={MAX_SAMPLES}"])
    return Observed(history, full, limited)


@pytest.mark.parametrize(
    ("target", "rel_tol"),
    [
        pytest.param(STEADY, 0.03, id="steady"),
        # a reset mistaken for a drop would add ln(≈1/40)^2 ≈ 14 to one change: far outside this band
        pytest.param(CHURN, 0.05, id="pod-replaced-and-counter-reset"),
    ],
)
def test_prometheus_gives_the_simulator_s_estimate(observed: Observed, target: SignalTarget, rel_tol: float) -> None:
    got, want = observed.signals[target.key], observed.history.expected[target.model]
    assert got.state == SignalState.OK, got.message
    assert want is not None
    assert got.rate_change_rms is not None, got.message
    print(f"{target.model}: Prometheus {got.rate_change_rms:.5f}, estimator {want:.5f}")
    assert math.isclose(got.rate_change_rms, want, rel_tol=rel_tol)
    assert "rate variability" in got.message


def test_calm_traffic_raises_the_target_utilization_and_noisy_traffic_keeps_it(observed: Observed) -> None:
    steady, churn = observed.signals[STEADY.key].rate_change_rms, observed.signals[CHURN.key].rate_change_rms
    assert steady is not None
    assert churn is not None
    u = 0.85
    assert effective_target_utilization(u, DEFAULT_MAX_TARGET_UTILIZATION, steady) > u
    assert effective_target_utilization(u, DEFAULT_MAX_TARGET_UTILIZATION, churn) == u


def test_too_little_history_or_no_traffic_gives_no_estimate(observed: Observed) -> None:
    young, idle = observed.signals[YOUNG.key], observed.signals[IDLE.key]
    assert young.state == SignalState.OK, young.message
    assert young.rate_change_rms is None, young.message
    assert observed.history.expected["young"] is None
    assert idle.state == SignalState.IDLE, idle.message
    assert idle.rate_change_rms is None, idle.message


def test_a_failing_variability_query_leaves_the_other_signals_as_they_were(observed: Observed) -> None:
    for target in TARGETS:
        full, limited = observed.signals[target.key], observed.signals_query_limited[target.key]
        assert limited.rate_change_rms is None, (target.name, limited.message)
        assert (limited.state, limited.request_rate_rps, limited.batch_fill) == (
            full.state,
            full.request_rate_rps,
            full.batch_fill,
        ), target.name
