"""The headroom that follows the traffic (policy/headroom.py), end to end: real Triton metrics through a real
Prometheus, the operator's adapter and decision, the Deployment's replicas on the real API server.

The lab is test_scaling.py's (tests/cluster/scaling_lab.py): kwok pods on fake GPU nodes, each Ready pod paired
with a real tritonserver running the sleep model, Poisson load spread round-robin over them. The rate variability
looks back 30 min, which no test can afford to serve live, so the model's history before the test is written into
Prometheus' TSDB with Debian's promtool (``LocalPrometheus.backfill``): 30 min of Triton's counters of a pod the
model had before, replaced by the running ones at the moment the load began, at the same rate with σ 0.02 noise
per minute (its last 2 min scraped every second, like the live pods, so that Prometheus' extrapolation at the
hand-over adds no step). That is what Prometheus holds for a model whose pod was replaced after half an hour of
calm traffic.

Checked: a load of 0.82 of one replica's capacity at SLA (1.17 replicas at targetUtilization 0.7, under one at
the ~0.94 the calm history raises it to; the wide band keeps the test clear of the load generator's shortfall
and of the fill's noise)

1. keeps 2 replicas while the model has no 30 min history (the variability is unknown, targetUtilization 0.7
   holds, status.effectiveTargetUtilization 0.7), after minReplicas drops from 2 to 1;
2. once the history is in Prometheus: status.observed.rateVariability is the small calm figure,
   status.effectiveTargetUtilization is exp(-2s) of it (policy/headroom.py), and the model scales in to 1 replica
   (ScaleInLoadFits, the Event saying the target was raised), where it stays with the SLA kept.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from batchfill.api.reasons import ScalingReason
from batchfill.api.spec import DEFAULT_MAX_TARGET_UTILIZATION, GROUP, PLURAL, VERSION
from batchfill.policy.headroom import RATE_CHANGE_HORIZON_S, RATE_CHANGE_STEP_S, effective_target_utilization
from batchfill.testbed.triton_history import counter_samples, openmetrics

from .conftest import USE_EXISTING
from .scaling_lab import Lab, is_planned, running_lab, scale_events, sleep_model
from .support import Kube, until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        USE_EXISTING, reason="pairs kwok pods with local tritonservers; an existing cluster's pods run real images"
    ),
]

NAME = "calm"
TARGET_UTILIZATION = 0.7
#: The load as a fraction of one replica's capacity at SLA: 2 replicas at 0.7, 1 at the raised target.
LOAD_OF_CAPACITY = 0.82
#: Per-minute log-normal noise of the written history. With the live Poisson counts and the outage of the
#: restart the estimate was 0.028-0.033; above 0.07, exp(-2s) < 0.87 would leave the load too near one replica.
HISTORY_SIGMA = 0.02
MAX_VARIABILITY = 0.07
#: The replaced pod's last seconds scraped every second (as the live pods are), earlier ones every 15 s.
FINE_SCRAPES_S = 120


@pytest.fixture(scope="module")
def lab(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with running_lab(kube, tmp_path_factory.mktemp("calm")) as lab:
        yield lab


def replaced_pod_history(ns: str, model: str, rate_rps: float, end_s: int, seed: int = 11) -> str:
    """Triton's counters of the pod ``model`` had for a little more than ``RATE_CHANGE_HORIZON_S`` before ``end_s``
    (Unix s), ending exactly at ``end_s``: ``rate_rps`` with log-normal noise of σ ``HISTORY_SIGMA`` per minute,
    a sample every ``RATE_CHANGE_STEP_S``, and every second over the last ``FINE_SCRAPES_S``."""
    rng = np.random.default_rng(seed)
    start = end_s - RATE_CHANGE_HORIZON_S - 120
    times = [*range(start, end_s - FINE_SCRAPES_S, RATE_CHANGE_STEP_S), *range(end_s - FINE_SCRAPES_S, end_s + 1)]
    per_minute = rate_rps * np.exp(rng.normal(0.0, HISTORY_SIGMA, (end_s - start) // 60 + 1))
    lines: list[str] = []
    served = 0.0
    for before, t in zip([start, *times], times, strict=False):
        served += float(per_minute[(t - start) // 60]) * (t - before)
        lines += counter_samples(ns, f"{model}-triton-replaced", model, t, served)
    return openmetrics(lines)


def test_calm_history_raises_the_target_utilization_and_one_replica_carries_the_load(lab: Lab) -> None:
    lab.following = NAME
    body = sleep_model(NAME, "Auto")
    body["spec"]["scaling"]["minReplicas"] = 2
    body["spec"]["scaling"]["targetUtilization"] = TARGET_UTILIZATION
    lab.custom.create_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, body)
    bm = until("Planned", lambda: lab.bm(NAME), is_planned, 60)
    capacity = bm["status"]["plan"]["capacityPerReplicaRps"]
    budget_ms = bm["status"]["plan"]["serverBudgetMs"]
    until("2 Ready pods with their tritonservers", lambda: lab.tritons.endpoints(), lambda e: len(e) == 2, 120)
    rate = LOAD_OF_CAPACITY * capacity
    lab.load.set_rate(rate)
    load_began_s = int(time.time())
    until(
        "signals of the load",
        lambda: lab.bm(NAME)["status"].get("observed") or {},
        lambda o: o.get("requestRate", 0) > 0.9 * rate,  # a whole signal window of it
        60,
    )

    # 1. no history: the user's headroom holds, and at 0.7 the load needs both replicas
    lab.custom.patch_namespaced_custom_object(
        GROUP, VERSION, lab.ns, PLURAL, NAME, {"spec": {"scaling": {"minReplicas": 1}}}
    )
    held: list[int] = []
    for _ in range(40):  # twice the stabilization window (20 s)
        held.append(lab.replicas(NAME))
        time.sleep(1)
    status = lab.bm(NAME)["status"]
    assert set(held) == {2}, (held, status, scale_events(lab, NAME)[-3:])
    assert status["effectiveTargetUtilization"] == TARGET_UTILIZATION, status
    assert "rateVariability" not in status["observed"], status

    # 2. the model's last 30 min, on the pod the running ones replaced, written into Prometheus' TSDB
    lab.prometheus.stop()
    lab.prometheus.backfill(replaced_pod_history(lab.ns, "sleep", rate, load_began_s))
    lab.prometheus.start()
    status = until(
        "the raised target utilization in status",
        lambda: lab.bm(NAME)["status"],
        lambda s: s.get("effectiveTargetUtilization", 0) > TARGET_UTILIZATION,
        120,
    )
    variability = status["observed"]["rateVariability"]
    assert 0 < variability < MAX_VARIABILITY, status["observed"]
    raised = effective_target_utilization(TARGET_UTILIZATION, DEFAULT_MAX_TARGET_UTILIZATION, variability)
    assert status["effectiveTargetUtilization"] == pytest.approx(raised, abs=0.006), status
    assert raised > LOAD_OF_CAPACITY + 0.03, "the test's load must fit one replica at the raised target"
    until("scale-in to 1", lambda: lab.replicas(NAME), lambda n: n == 1, 90)
    status = lab.bm(NAME)["status"]
    assert status["lastScaleReason"] == ScalingReason.SCALE_IN_LOAD_FITS, status
    scale_in = [m for r, m in scale_events(lab, NAME) if r == ScalingReason.SCALE_IN_LOAD_FITS]
    assert scale_in, scale_events(lab, NAME)
    assert "2 -> 1" in scale_in[-1], scale_in[-1]
    assert f"raised from {TARGET_UTILIZATION:.0%}" in scale_in[-1], scale_in[-1]
    until("one Ready pod serving", lambda: lab.tritons.endpoints(), lambda e: len(e) == 1, 60)

    # one replica carries the load within the SLA and is not scaled out again
    time.sleep(15)  # a full signal window (10 s) on the one replica
    after: list[int] = []
    for _ in range(30):
        after.append(lab.replicas(NAME))
        time.sleep(1)
    status = lab.bm(NAME)["status"]
    observed = status["observed"]
    plan = status["plan"]
    print(
        f"C {capacity:.1f} rps, load {rate:.1f} rps, variability {variability:.4f}, plan's fill "
        f"{plan['batchFillAtTarget']} at {TARGET_UTILIZATION} C and {plan['batchFillAtMaxTarget']} at 0.95 C; "
        f"one replica: {observed}"
    )
    assert set(after) == {1}, (after, scale_events(lab, NAME)[-3:])
    assert observed["requestRate"] == pytest.approx(rate, rel=0.3), observed
    assert observed["p99Ms"] < budget_ms, observed
    lab.load.set_rate(0)
    lab.custom.delete_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, NAME)
