"""`batchfill serve` without a server: its flags are checked before anything starts, and SIGTERM cleans up as
Ctrl-C does (tritonserver stopped, work directory removed) with exit code 143.

tritonserver is replaced by a stand-in that records what is done to it; tests/component/test_serve_real_model.py
runs the real one.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from batchfill.cli import serve as serve_module
from batchfill.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
OCR = str(ROOT / "examples" / "ocr-recognizer.yaml")


class FakeTriton:
    """Stands in for LocalTriton; ``on_start`` runs inside ``start()`` (e.g. a signal while it waits)."""

    instances: ClassVar[list[FakeTriton]] = []
    on_start: ClassVar[Any] = None

    def __init__(self, repo: Path, **kwargs: Any) -> None:
        self.model_repository = repo
        self.started = self.stopped = False
        FakeTriton.instances.append(self)

    def start(self) -> FakeTriton:
        self.started = True
        if FakeTriton.on_start is not None:
            FakeTriton.on_start()
        return self

    def stop(self) -> int:
        self.stopped = True
        return 0

    def http_client(self) -> Any:
        raise AssertionError("not reached in these tests")


@pytest.fixture
def fake_triton(monkeypatch: pytest.MonkeyPatch) -> type[FakeTriton]:
    FakeTriton.instances = []
    FakeTriton.on_start = None
    monkeypatch.setattr(serve_module, "LocalTriton", FakeTriton)
    return FakeTriton


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--load", "0"], "--load=0.0 must be in (0, 2]"),
        (["--load", "-1"], "--load=-1.0 must be in (0, 2]"),
        (["--load", "nan"], "--load=nan must be in (0, 2]"),
        (["--load", "3"], "--load=3.0 must be in (0, 2]"),
        (["--duration", "0"], "--duration=0.0 must be in (0, 3600] seconds"),
        (["--duration", "inf"], "--duration=inf must be in (0, 3600] seconds"),
        (["--seed", "-1"], "--seed=-1 must be >= 0"),
    ],
)
def test_bad_flags_exit_2_before_tritonserver_starts(
    fake_triton: type[FakeTriton], capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["serve", OCR, *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(message), err
    assert fake_triton.instances == []


def test_sigterm_stops_tritonserver_removes_the_work_directory_and_exits_143(
    fake_triton: type[FakeTriton], capsys: pytest.CaptureFixture[str]
) -> None:
    def terminate() -> None:  # while tritonserver starts: the server spawned must be stopped all the same
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("SIGTERM did not interrupt serve")

    fake_triton.on_start = terminate
    before = signal.getsignal(signal.SIGTERM)
    assert main(["serve", OCR, "--no-measure", "--duration", "1"]) == 143
    (triton,) = fake_triton.instances
    assert triton.started
    assert triton.stopped
    assert not triton.model_repository.parent.exists()  # /tmp/batchfill-serve-*
    assert signal.getsignal(signal.SIGTERM) is before
    assert "Traceback" not in capsys.readouterr().err


def test_ctrl_c_cleans_up_the_same_and_exits_130(fake_triton: type[FakeTriton]) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt

    fake_triton.on_start = interrupt
    assert main(["serve", OCR, "--no-measure", "--duration", "1"]) == 130
    (triton,) = fake_triton.instances
    assert triton.stopped
    assert not triton.model_repository.parent.exists()


def test_served_slowdown_compares_the_load_phase_with_the_measured_profile() -> None:
    """Execution time while serving over the measured profile's for the same batches, sizes between measured ones
    interpolated: 10 batches of 1 at 12 ms and 5 of 3 at 33 ms against l(1) = 10, l(4) = 40 (l(3) = 30 ms)."""
    from batchfill.adapters.triton_stats import BatchStat, Duration, ModelStats
    from batchfill.api.status import PlanStatus

    def batch(b: int, n: int, ms: float) -> BatchStat:
        return BatchStat(b, compute_infer=Duration(n, int(n * ms * 1e6)))

    stats = ModelStats("m", "1", batches={1: batch(1, 10, 12.0), 3: batch(3, 5, 33.0)})
    plan = PlanStatus(
        maxBatchSize=4,
        preferredBatchSizes=[4],
        maxQueueDelayMicroseconds=100,
        instanceCount=1,
        serverBudgetMs=100,
        capacityPerReplicaRps=1,
        predictedP99Ms=1,
        minClientTimeoutMs=1,
        rule="t",
    )
    report = serve_module.ServeReport(plan, {1: 10.0, 4: 40.0}, 1.0, 1.0, 1, 0, 1.0, 1.0, 1.0, 1.0, False, stats)
    assert report.served_slowdown == pytest.approx((10 * 12 + 5 * 33) / (10 * 10 + 5 * 30))
    assert serve_module.ServeReport(plan, {}, 1.0, 1.0, 1, 0, 1.0, 1.0, 1.0, 1.0, False, stats).served_slowdown is None
