"""The real example model, end to end: measured on the real server, planned, served with the derived config.

This is `batchfill serve examples/ocr-recognizer.yaml` (`make serve`) with a shorter load phase:
PaddleOCR's PP-OCRv4 recognizer (trained weights from the rapidocr-onnxruntime wheel) in Triton's Python
backend on CPU, profiled through the statistics API, planned from the SLA and that profile, reloaded with the
rendered config.pbtxt and driven with Poisson load at 90 % of the predicted capacity.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from batchfill.api.validate import load_model, parse_documents
from batchfill.cli.serve import serve

pytestmark = pytest.mark.component

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ocr-recognizer.yaml"


def test_real_model_is_measured_planned_and_served_within_the_sla(tmp_path: Path) -> None:
    bm = load_model(parse_documents(EXAMPLE.read_text())[0])
    console = Console(file=(tmp_path / "serve.log").open("w"), width=120)
    report = serve(bm, console, load_fraction=0.9, duration_s=20, repeats=8, seed=0, workdir=tmp_path)
    print((tmp_path / "serve.log").read_text())

    # measured on this server, every declared batch size
    assert sorted(report.measured_profile) == [p.batchSize for p in bm.spec.profile or []]
    assert all(v > 0 for v in report.measured_profile.values())
    # the plan was derived from that measurement and the SLA (500 ms, 50 ms outside Triton)
    assert report.plan.serverBudgetMs == 450
    assert report.plan.maxBatchSize >= 1
    assert report.plan.capacityPerReplicaRps > 0
    # served: every request answered, the offered load reached, Triton's own p99 within T
    assert report.failed == 0
    assert not report.generator_saturated
    assert abs(report.achieved_rps - report.offered_rps) / report.offered_rps < 0.1
    assert report.server_p99_ms is not None
    assert report.server_p99_ms <= report.plan.serverBudgetMs, report
    assert report.sla_kept
