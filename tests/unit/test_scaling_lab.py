"""The scaling lab's pure parts: varying Poisson arrivals, the load schedule, and the timeline analysis.

The real-parts run is tests/component/test_autoscaling_ramp.py; here a synthetic record with known answers
checks the helpers the component test and benchmarks/scaling_ramp.py rely on.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchfill.api.status import PlanStatus
from batchfill.policy.signals import SignalState
from batchfill.testbed.loadgen import varying_poisson_arrivals
from batchfill.testbed.scaling_lab.analysis import (
    latency_windows,
    lower_bound_replica_seconds,
    need_steps,
    phase_stats,
    reactions,
    replica_seconds,
)
from batchfill.testbed.scaling_lab.config import LabConfig, sleep_model_config, sleep_spec
from batchfill.testbed.scaling_lab.records import LabResult, ServerRecord, TickRecord
from batchfill.testbed.scaling_lab.schedule import LoadSchedule, Phase, RampShape


def test_varying_arrivals_follow_the_rate_and_are_seeded() -> None:
    def rate(t: float) -> float:
        return 100.0 if t < 50 else 20.0

    a = varying_poisson_arrivals(rate, 100.0, rate_max_rps=100.0, seed=3)
    b = varying_poisson_arrivals(rate, 100.0, rate_max_rps=100.0, seed=3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, varying_poisson_arrivals(rate, 100.0, rate_max_rps=100.0, seed=4))
    first, second = np.count_nonzero(a < 50), np.count_nonzero(a >= 50)
    # Poisson counts: 5000 ± 71 and 1000 ± 32; 5 sigma
    assert abs(first - 5000) < 5 * math.sqrt(5000)
    assert abs(second - 1000) < 5 * math.sqrt(1000)
    assert np.all(np.diff(a) >= 0)
    assert a.min() >= 0
    assert a.max() < 100


def test_varying_arrivals_reject_a_rate_above_the_bound() -> None:
    with pytest.raises(ValueError, match="rate_at"):
        varying_poisson_arrivals(lambda t: 200.0, 10.0, rate_max_rps=100.0)


def test_schedule_from_ramp() -> None:
    s = LoadSchedule.from_ramp(
        RampShape(base=0.5, peak=2.0, low=0.25, warm_s=10, up_s=20, hold_s=10, down_s=5, low_s=5), 40
    )
    assert [p.name for p in s.phases] == ["warm", "ramp-up", "hold", "ramp-down", "low"]
    assert s.duration_s == 50
    assert s.peak_rps == 80
    assert s.rate_at(5) == 20
    assert s.rate_at(20) == pytest.approx(50)  # halfway up
    assert s.rate_at(35) == 80
    assert s.rate_at(47) == 10
    assert s.rate_at(50) == 0  # after the schedule
    # ∫ rate dt: 10·20 + 20·50 + 10·80 + 5·45 + 5·10
    assert s.integral(lambda r: r) == pytest.approx(200 + 1000 + 800 + 225 + 50, rel=1e-3)


def test_sleep_config_is_the_rendered_plan_plus_the_sleep_parameters() -> None:
    cfg = LabConfig()
    spec = sleep_spec(cfg)
    plan = PlanStatus(
        maxBatchSize=8,
        preferredBatchSizes=list(range(1, 9)),
        maxQueueDelayMicroseconds=100,
        instanceCount=1,
        serverBudgetMs=340,
        capacityPerReplicaRps=50,
        predictedP99Ms=300,
        minClientTimeoutMs=400,
        rule="test",
    )
    text = sleep_model_config(spec, plan, cfg.model)
    assert "max_batch_size: 8" in text
    assert "KIND_CPU" in text
    assert 'key: "alpha_ms"' in text
    assert 'string_value: "50.0"' in text
    assert 'string_value: "10.0"' in text


def _tick(t: float, current: int, ready: int, desired: int, reason: str = "Hold") -> TickRecord:
    return TickRecord(
        t=t,
        offered_rps=0.0,
        sent_rps=0.0,
        current=current,
        ready=ready,
        starting=current - ready,
        desired=desired,
        recommendation=desired,
        reason=reason,
        apply=desired != current,
        message="",
        saturated=False,
        sla_at_risk=False,
        state=SignalState.OK,
        pods=ready,
        request_rate_rps=None,
        inference_rate_rps=None,
        avg_batch_size=None,
        batch_fill=None,
        queue_time_ms=None,
        p99_ms=None,
        pending_requests=None,
        fetch_s=0.0,
    )


@pytest.fixture
def record() -> LabResult:
    """Capacity 50, u = 0.8 (40 per replica); 30 rps for 20 s, 70 rps for 20 s, 30 rps for 40 s.

    Need: 1 until 20 s, 2 until 40 s, then 1. The loop decided 2 at 26 s (Ready at 28 s) and 1 at 64 s
    (stopped at 65 s).
    """
    cfg = LabConfig()
    schedule = LoadSchedule(
        (Phase("low", 0, 20, 30, 30), Phase("high", 20, 40, 70, 70), Phase("after", 40, 80, 30, 30))
    )
    plan = PlanStatus(
        maxBatchSize=8,
        maxQueueDelayMicroseconds=100,
        instanceCount=1,
        serverBudgetMs=100,
        capacityPerReplicaRps=50,
        predictedP99Ms=90,
        minClientTimeoutMs=120,
        rule="test",
        batchFillAtTarget=0.4,
    )
    ticks = [
        _tick(t, 2 if 26 < t <= 64 else 1, 2 if 28 <= t <= 64 else 1, 2 if 26 <= t < 64 else 1) for t in range(2, 81, 2)
    ]
    servers = [
        ServerRecord(0, "ramp-0", 0.0, 0.0, None, math.inf, served=3),
        ServerRecord(1, "ramp-1", 26.0, 28.0, 64.0, 65.0, served=1),
    ]
    sent = np.array([1.0, 21.0, 22.0, 50.0])
    return LabResult(
        config=cfg,
        spec=sleep_spec(cfg),
        plan=plan,
        schedule=schedule,
        ticks=ticks,
        servers=servers,
        sent_s=sent,
        latency_ms=np.array([10.0, 200.0, np.nan, 20.0]),
        send_lag_ms=np.zeros(4),
        server_index=np.array([0, 0, 1, 0]),
        failed=1,
        errors=["boom"],
        wall_s=80.0,
        setup_s=1.0,
    )


def test_need_steps_and_reactions(record: LabResult) -> None:
    steps = need_steps(record)
    assert [(round(s.t), s.old, s.new) for s in steps] == [(20, 1, 2), (40, 2, 1)]
    up, down = reactions(record)
    # steps are found on a 0.05 s grid
    assert up.to_decision_s == pytest.approx(6.0, abs=0.05)
    assert up.to_capacity_s == pytest.approx(8.0, abs=0.05)
    assert down.to_decision_s == pytest.approx(24.0, abs=0.05)
    assert down.to_capacity_s == pytest.approx(25.0, abs=0.05)


def test_replica_seconds_and_the_lower_bound(record: LabResult) -> None:
    assert replica_seconds(record) == pytest.approx(80 + (65 - 26))
    assert lower_bound_replica_seconds(record) == pytest.approx((30 * 20 + 70 * 20 + 30 * 40) / 50, rel=1e-3)
    assert record.current_at(30) == 2
    assert record.ready_at(27) == 1
    assert record.current_at(64) == 1  # removed at 64 s


def test_latency_windows_and_phases(record: LabResult) -> None:
    w = latency_windows(record, 20.0)
    assert [x.requests for x in w] == [1, 1, 1, 0]  # the failed request counts in no window
    assert w[1].p99_ms == 200.0
    assert math.isnan(w[3].p99_ms)
    phases = {p.name: p for p in phase_stats(record)}
    assert (phases["high"].requests, phases["high"].failed) == (2, 1)
    assert phases["high"].mean_need == pytest.approx(2.0)
    assert record.ok == 3
