"""`batchfill profile`'s pure parts: flags, default batch sizes, profile values and the document it prints."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from batchfill.adapters.profiler import ModelInfo, SizeMeasurement, TensorInfo, default_batch_sizes
from batchfill.api.validate import load_model
from batchfill.cli import main
from batchfill.profiling import ProfileOptions, document_for, parse_shape, profile_points

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("max_batch_size", "sizes"),
    [(0, [1]), (1, [1]), (2, [1, 2]), (8, [1, 2, 4, 8]), (12, [1, 2, 4, 8, 12]), (16, [1, 2, 4, 8, 16])],
)
def test_default_batch_sizes_are_powers_of_two_and_the_maximum(max_batch_size: int, sizes: list[int]) -> None:
    assert default_batch_sizes(max_batch_size) == sizes


@pytest.mark.parametrize(("text", "parsed"), [("x=3", ("x", (3,))), ("in_1=3,224,224", ("in_1", (3, 224, 224)))])
def test_parse_shape(text: str, parsed: tuple[str, tuple[int, ...]]) -> None:
    assert parse_shape(text) == parsed


@pytest.mark.parametrize("text", ["x", "=3", "x=", "x=0", "x=-1", "x=a,b", "x=3,,4"])
def test_parse_shape_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"^--shape .* must be NAME=d1,d2"):
        parse_shape(text)


def test_profile_value_is_the_quantile_of_the_executions() -> None:
    runs = [SizeMeasurement(1, tuple(float(x) for x in range(1, 11))), SizeMeasurement(4, (20.0,) * 5)]
    # "higher": the smallest observed execution at or above the quantile, never an interpolation
    assert profile_points(runs, 0.9) == [{"batchSize": 1, "latencyMs": 10.0}, {"batchSize": 4, "latencyMs": 20.0}]
    assert profile_points(runs, 0.5)[0]["latencyMs"] == 6.0


INFO = ModelInfo(
    name="Text_Rec.v4",
    version="",
    platform="onnxruntime_onnx",
    backend="onnxruntime",
    max_batch_size=8,
    inputs=(TensorInfo("x", "FP32", (3, 48, -1)),),
    outputs=(TensorInfo("y", "BYTES", (1,)),),
)


def test_document_from_metadata_validates_and_names_the_model_as_kubernetes_allows() -> None:
    points = [{"batchSize": 1, "latencyMs": 4.2}, {"batchSize": 8, "latencyMs": 20.5}]
    doc = document_for(INFO, points, ProfileOptions(url="h:1", model="m", latency_p99_ms=100.0, network_overhead_ms=5))
    assert doc["metadata"]["name"] == "text-rec-v4"
    assert doc["spec"]["model"]["platform"] == "onnxruntime_onnx"
    assert doc["spec"]["model"]["outputs"] == [{"name": "y", "dataType": "TYPE_STRING", "dims": [1]}]
    bm = load_model(doc)
    assert bm.spec.profile is not None
    assert [p.latencyMs for p in bm.spec.profile] == [4.2, 20.5]
    assert bm.spec.sla.latencyP99Ms == 100.0


def test_document_from_a_file_keeps_everything_but_the_profile() -> None:
    base = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())
    points = [{"batchSize": 1, "latencyMs": 11.0}]
    doc = document_for(INFO, points, ProfileOptions(url="h:1", model="m", base_document=base))
    assert doc["spec"]["profile"] == points
    assert {k: v for k, v in doc["spec"].items() if k != "profile"} == {
        k: v for k, v in base["spec"].items() if k != "profile"
    }
    assert base["spec"]["profile"][0]["latencyMs"] == 10  # the caller's document is not modified


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-sizes", "1,x"], "--batch-sizes '1,x' must be comma-separated integers"),
        (["--batch-sizes", "0,2"], "--batch-sizes '0,2': every batch size must be >= 1"),
        (["--shape", "x"], "--shape 'x' must be NAME=d1,d2"),
        (["--latency-p99-ms", "-5"], "--latency-p99-ms=-5.0 must be a finite number >= 0"),
        (["-f", "/nonexistent/bm.yaml"], "/nonexistent/bm.yaml: cannot read"),
    ],
)
def test_bad_flags_exit_2_before_contacting_a_server(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    # the URL is unreachable: a flag error must be reported before any connection attempt
    assert main(["profile", "--url", "127.0.0.1:9", "--model", "m", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(message), err


def test_an_invalid_base_document_is_rejected_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text((ROOT / "examples" / "seed-example.yaml").read_text().replace("latencyP99Ms: 100", "latencyP99Ms: -1"))
    assert main(["profile", "--url", "127.0.0.1:9", "--model", "m", "-f", str(f)]) == 2
    assert "spec.sla.latencyP99Ms" in capsys.readouterr().err
