"""The real example model, end to end: measured on the real server, planned, served with the derived config.

This is `batchfill serve examples/ocr-recognizer.yaml` (`make serve`) with a shorter load phase:
PaddleOCR's PP-OCRv4 recognizer (trained weights from the rapidocr-onnxruntime wheel) in Triton's Python
backend on CPU, profiled through the statistics API, planned from the SLA and that profile, reloaded with the
rendered config.pbtxt and driven with Poisson load at 90 % of the predicted capacity.

The plan's promise (server p99 within T) holds for a server that executes as fast as it was measured. On a
machine shared with other work it may not: measured at 20.7 ms per execution, served at 27.2 ms a few seconds
later, and with one batch per 20 ms at 90 % of the capacity the queue grows without bound. So each attempt's
executions while serving are compared with the measured profile, and the plan's own simulator, on the very
arrivals the server got, decides whether the plan could keep T at that speed. An attempt where it could not
measured the machine, not the plan, and the whole job (measure, plan, serve) runs again, ``ATTEMPTS`` times in
all. The test fails when an attempt the plan should have kept missed T; it is skipped, with the figures, when
the machine's speed changed under every attempt.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from batchfill.api.documents import parse_documents
from batchfill.api.spec import ProfilePoint
from batchfill.api.validate import load_model
from batchfill.cli.serve import ServeReport, serve
from batchfill.policy.profile import LatencyProfile
from batchfill.sim.batcher import BatcherConfig, simulate_batcher
from batchfill.testbed.loadgen import poisson_arrivals

pytestmark = pytest.mark.component

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ocr-recognizer.yaml"
LOAD_FRACTION = 0.9
DURATION_S = 20.0
SEED = 0
ATTEMPTS = 3
#: Standard deviations a Poisson count may lie from its mean (two-sided p < 1e-4).
POISSON_Z = 4.0


def _predicted_p99_ms(report: ServeReport, slowdown: float) -> float:
    """The simulator's p99 for the plan on the arrivals the load generator drew, every execution ``slowdown``
    times the measured profile (the planner's model of the server, at the speed it actually ran)."""
    plan = report.plan
    points = [ProfilePoint(batchSize=b, latencyMs=v) for b, v in sorted(report.measured_profile.items())]
    table = [slowdown * x for x in LatencyProfile.from_points(points).table(plan.maxBatchSize)]
    arrivals_ms = poisson_arrivals(report.offered_rps, duration_s=DURATION_S, seed=SEED) * 1000.0
    config = BatcherConfig(
        plan.maxBatchSize, tuple(plan.preferredBatchSizes), plan.maxQueueDelayMicroseconds, plan.instanceCount
    )
    return float(np.percentile(simulate_batcher(list(arrivals_ms), config, table).latencies_ms, 99))


def _check_the_job(report: ServeReport, profile_sizes: list[int]) -> None:
    """What every attempt must show whatever the machine's speed."""
    # measured on this server, every declared batch size
    assert sorted(report.measured_profile) == profile_sizes
    assert all(v > 0 for v in report.measured_profile.values())
    # the plan was derived from that measurement and the SLA (500 ms, 50 ms outside Triton)
    assert report.plan.serverBudgetMs == 450
    assert report.plan.maxBatchSize >= 1
    assert report.plan.capacityPerReplicaRps > 0
    assert report.offered_rps == pytest.approx(LOAD_FRACTION * report.plan.capacityPerReplicaRps)
    # The load is a Poisson process of that rate: its count over the window is Poisson(λ·duration), whose
    # standard deviation is the square root of its mean (seed 0 draws 2.3 of them below it at about 19 req/s).
    mean = report.offered_rps * DURATION_S
    assert abs(report.sent - mean) <= POISSON_Z * math.sqrt(mean), f"{report.sent} arrivals, expected {mean:.0f}"
    # served: every request answered, and counted by Triton
    assert report.failed == 0
    assert round(report.achieved_rps * DURATION_S) == report.sent
    assert report.served_stats.success.count >= report.sent
    assert report.server_p99_ms is not None


def test_real_model_is_measured_planned_and_served_within_the_sla(tmp_path: Path) -> None:
    bm = load_model(parse_documents(EXAMPLE.read_text())[0])
    sizes = [p.batchSize for p in bm.spec.profile or []]
    judged: list[ServeReport] = []
    not_judged: list[str] = []
    for attempt in range(1, ATTEMPTS + 1):
        log = tmp_path / f"serve-{attempt}.log"
        with log.open("w") as f:
            report = serve(bm, Console(file=f, width=120), load_fraction=LOAD_FRACTION, duration_s=DURATION_S,
                           repeats=8, seed=SEED, workdir=tmp_path)  # fmt: skip
        print(log.read_text())
        _check_the_job(report, sizes)
        slowdown = report.served_slowdown
        assert slowdown is not None
        predicted = _predicted_p99_ms(report, slowdown)
        summary = (
            f"attempt {attempt}: B={report.plan.maxBatchSize}, {report.sent / DURATION_S:.1f} req/s arrived "
            f"({report.sent / DURATION_S / report.plan.capacityPerReplicaRps:.0%} of the capacity), executions "
            f"{slowdown - 1:+.0%} vs measured, simulated p99 at that speed {predicted:.0f} ms, server p99 "
            f"{report.server_p99_ms:.0f} ms, T {report.plan.serverBudgetMs:g} ms"
            + (", load generator behind schedule" if report.generator_saturated else "")
        )
        print(summary)
        if report.sla_kept and not report.generator_saturated:
            return
        if predicted <= report.plan.serverBudgetMs and not report.generator_saturated:
            judged.append(report)
        else:
            not_judged.append(summary)
    if not judged:
        pytest.skip("the machine's speed changed under every attempt: " + "; ".join(not_judged))
    best = min(judged, key=lambda r: r.server_p99_ms or math.inf)
    assert best.sla_kept, f"server p99 {best.server_p99_ms} ms > T at a speed the plan should keep: {best}"
