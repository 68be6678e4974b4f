"""`batchfill demo`'s measuring step and load table, without a server.

tritonserver and the profiler's calls are replaced by stand-ins that record what is done to them;
tests/cluster/test_demo.py runs the real demo.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from rich.console import Console

from batchfill.adapters.profiler import ModelInfo, ProfileError, SizeMeasurement, TensorInfo
from batchfill.api.validate import load_model
from batchfill.cli import demo as demo_module
from batchfill.cli.demo import profile as demo_profile
from batchfill.testbed.loadgen import LoadResult

EXAMPLE: dict[str, Any] = yaml.safe_load(demo_module.EXAMPLE.read_text())
DECLARED = {1: 28.2, 2: 52.9, 4: 105.7, 8: 224.8, 16: 533.0}
INFO = ModelInfo(
    name="text_recognizer",
    version="",
    platform="",
    backend="python",
    max_batch_size=16,
    inputs=(TensorInfo("x", "FP32", (3, 48, 320)),),
    outputs=(),
)


class FakeTriton:
    """Stands in for LocalTriton: records start and stop; ``fail`` is raised inside ``start()``."""

    def __init__(self, repository: Path, *, fail: BaseException | None = None, **kwargs: Any) -> None:
        self.repository, self.kwargs, self.fail = repository, kwargs, fail
        self.started = self.stopped = False
        self.http_url = "127.0.0.1:18000"

    def start(self) -> FakeTriton:
        self.started = True
        if self.fail is not None:
            raise self.fail
        return self

    def stop(self) -> None:
        self.stopped = True


class Recorder:
    """The profiler's calls as the demo makes them; each round's executions of size b are ``b * scale[round]`` ms."""

    def __init__(self, scale: list[float]) -> None:
        self.scale = scale
        self.calls: list[dict[str, Any]] = []
        self.closed = 0
        self.triton: FakeTriton | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch, fail: BaseException | None = None) -> None:
        def triton(repository: Path, **kwargs: Any) -> FakeTriton:
            self.triton = FakeTriton(repository, fail=fail, **kwargs)
            return self.triton

        client = type("Client", (), {"close": lambda _: setattr(self, "closed", self.closed + 1)})()
        monkeypatch.setattr(demo_profile, "LocalTriton", triton)
        monkeypatch.setattr(demo_profile, "connect", lambda url: client)
        monkeypatch.setattr(demo_profile, "read_model_info", lambda c, url, model: INFO)
        monkeypatch.setattr(demo_profile, "input_maker", lambda info, url, seed=0: lambda b: [])
        monkeypatch.setattr(demo_profile, "measure", self.measure)

    def measure(
        self, client: Any, info: ModelInfo, make: Any, sizes: list[int], *, warmup: int, repeats: int
    ) -> list[SizeMeasurement]:
        scale = self.scale[len(self.calls)]
        self.calls.append({"sizes": list(sizes), "warmup": warmup, "repeats": repeats})
        return [SizeMeasurement(b, tuple(b * scale for _ in range(repeats))) for b in sizes]


def _console() -> Console:
    return Console(record=True, width=200, force_terminal=False)


def test_profile_is_measured_in_rounds_and_takes_the_p90_of_every_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # round i runs every size at i+1 ms per sample: each size sees every round's load, not one moment's
    rec = Recorder([float(i + 1) for i in range(demo_module.PROFILE_REPEATS)])
    rec.install(monkeypatch)
    console = _console()
    points = demo_module.measure_example_profile(EXAMPLE, tmp_path / "profile", console, seed=3)

    assert [c["sizes"] for c in rec.calls] == [list(DECLARED)] * demo_module.PROFILE_REPEATS
    assert [c["warmup"] for c in rec.calls] == [demo_module.PROFILE_WARMUP] + [0] * (demo_module.PROFILE_REPEATS - 1)
    assert {c["repeats"] for c in rec.calls} == {1}
    # p90 ("higher") of 1..10 ms per sample is 10 ms per sample, i.e. the slowest round
    expected = float(np.quantile(np.arange(1, demo_module.PROFILE_REPEATS + 1), 0.9, method="higher"))
    assert points == [{"batchSize": b, "latencyMs": b * expected} for b in DECLARED]
    # the server: started on a repository holding the model with a config for every declared size, then stopped
    assert rec.triton is not None
    assert rec.triton.started
    assert rec.triton.stopped
    assert rec.closed == 1
    config = (tmp_path / "profile" / "models" / "text_recognizer" / "config.pbtxt").read_text()
    assert "max_batch_size: 16" in config
    assert "KIND_CPU" in config
    text = console.export_text()
    assert "declared ms" in text
    assert "measured ms" in text
    for b, ms in DECLARED.items():
        assert f"│ {b:>10} │ {ms:>11g} │ {b * expected:>11.2f} │ {b * expected / ms:>19.2f} │" in text, text


@pytest.mark.parametrize(
    ("fail", "raised"),
    [
        (demo_profile.TritonStartError("tritonserver exited with code 1"), demo_module.DemoError),
        (KeyboardInterrupt(), KeyboardInterrupt),
    ],
)
def test_a_server_that_does_not_start_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: BaseException, raised: type[BaseException]
) -> None:
    rec = Recorder([1.0])
    rec.install(monkeypatch, fail=fail)
    with pytest.raises(raised) as info:
        demo_module.measure_example_profile(EXAMPLE, tmp_path / "profile", _console())
    assert rec.triton is not None
    assert rec.triton.stopped
    assert rec.calls == []
    if raised is demo_module.DemoError:
        assert "exited with code 1" in str(info.value)
        assert str(tmp_path / "profile" / "tritonserver.log") in str(info.value)


def test_a_failed_measurement_is_a_demo_error_and_stops_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorder([1.0])
    rec.install(monkeypatch)

    def failing(*args: Any, **kwargs: Any) -> list[SizeMeasurement]:
        raise ProfileError("'text_recognizer': inference of batch size 16 failed: out of memory")

    monkeypatch.setattr(demo_profile, "measure", failing)
    with pytest.raises(demo_module.DemoError, match="batch size 16 failed: out of memory"):
        demo_module.measure_example_profile(EXAMPLE, tmp_path / "profile", _console())
    assert rec.triton is not None
    assert rec.triton.stopped
    assert rec.closed == 1


def test_with_profile_replaces_the_profile_only() -> None:
    before = copy.deepcopy(EXAMPLE)
    measured = [{"batchSize": b, "latencyMs": 2 * ms} for b, ms in DECLARED.items()]
    doc = demo_module.with_profile(EXAMPLE, measured)
    assert before == EXAMPLE  # the example itself is untouched
    assert doc["spec"]["profile"] == measured
    assert {**doc, "spec": {**doc["spec"], "profile": None}} == {
        **EXAMPLE,
        "spec": {**EXAMPLE["spec"], "profile": None},
    }
    spec = load_model(doc).spec
    assert {p.batchSize: p.latencyMs for p in spec.profile or []} == {b: 2 * ms for b, ms in DECLARED.items()}


def test_load_table_shows_the_poisson_rate_next_to_what_was_sent() -> None:
    # a seeded 15 s draw for λ = 22.3 req/s held 292 arrivals: 19.5 sent per second, 2 of them failed
    load = LoadResult(
        rate_rps=22.3, duration_s=15.0, sent=292, ok=290, failed=2, latency_ms=np.linspace(10, 300, 290),
        send_lag_ms=np.zeros(292), wall_s=15.4,
    )  # fmt: skip
    result = demo_module.DemoResult(
        model="text_recognizer",
        server_budget_ms=450,
        capacity_rps=31.9,
        pods={"pod-a": "gpu-node-0"},
        loads={"pod-a": load},
        server_p99_ms={"pod-a": 287.5},
    )
    console = _console()
    console.print(demo_module.load_table(result))
    text = console.export_text()
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.strip().strip("┃").split("┃")] == [
        "pod",
        "λ req/s",
        "sent req/s",
        "achieved req/s",
        "sent/failed",
        "server p99 ms",
        "client p99 ms",
        "T ms",
    ]
    row = next(line for line in text.splitlines() if "pod-a" in line)
    cells = [c.strip() for c in row.strip().strip("│").split("│")]
    assert cells[:6] == ["pod-a", "22.3", "19.5", "19.3", "292/2", "287.5"]
    assert cells[7] == "450"
