"""`batchfill profile`'s pure parts: flags, default batch sizes, profile values and the document it prints."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchfill.adapters.profiler import (
    ModelInfo,
    ProfileError,
    SizeMeasurement,
    TensorInfo,
    _client_class,
    check_url,
    default_batch_sizes,
    one_line,
    read_model_info,
)
from batchfill.api.validate import load_model
from batchfill.cli import profile as profiling
from batchfill.cli.main import main
from batchfill.cli.profile import (
    NO_REPOSITORY_COMMENT,
    ProfileOptions,
    document_for,
    dump_document,
    parse_shape,
    profile_points,
)

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
        (["--latency-p99-ms", "-5"], "--latency-p99-ms=-5.0 must be > 0 ms"),
        (["--latency-p99-ms", "inf"], "--latency-p99-ms=inf must be a finite number > 0 ms"),
        (["--latency-p99-ms", "80", "--network-overhead-ms", "-1"], "--network-overhead-ms=-1.0 must be a finite"),
        (["-f", "/nonexistent/bm.yaml"], "/nonexistent/bm.yaml: cannot read"),
        (
            ["-f", str(ROOT / "examples" / "seed-example.yaml")],
            f"-f {ROOT / 'examples' / 'seed-example.yaml'}: spec.model.name=resnet50 but --model m",
        ),
        (["--quantile", "1"], "--quantile=1.0 must be between 0 and 1, both excluded"),
        (["--quantile", "0"], "--quantile=0.0 must be between 0 and 1, both excluded"),
        (["--quantile", "nan"], "--quantile=nan must be between 0 and 1"),
        (["--repeats", "0"], "--repeats=0 must be >= 1"),
        (["--warmup", "-1"], "--warmup=-1 must be >= 0"),
        (["--latency-p99-ms", "0"], "--latency-p99-ms=0.0 must be > 0 ms"),
        (["--latency-p99-ms", "4e6"], "--latency-p99-ms=4000000.0: Input should be less than or equal to 3600000"),
        (
            ["--latency-p99-ms", "5", "--network-overhead-ms", "10"],
            "--network-overhead-ms=10.0 must be less than --latency-p99-ms=5.0",
        ),
        (["--network-overhead-ms", "3"], "--network-overhead-ms=3.0 needs --latency-p99-ms"),
        (
            ["-f", str(ROOT / "examples" / "seed-example.yaml"), "--latency-p99-ms", "80"],
            f"--latency-p99-ms cannot be combined with -f {ROOT / 'examples' / 'seed-example.yaml'}",
        ),
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


# --- against a stand-in server: what is checked once the server has described the model, and what is printed

SLEEPY = ModelInfo(
    name="sleepy",
    version="",
    platform="",
    backend="python",
    max_batch_size=8,
    inputs=(TensorInfo("INPUT0", "FP32", (4,)),),
    outputs=(TensorInfo("OUTPUT0", "FP32", (4,)),),
)


class FakeServer:
    """Stands in for connect/read_model_info/measure; ``measured`` records the batch sizes measured."""

    def __init__(self, info: ModelInfo = SLEEPY, fail: str | None = None) -> None:
        self.info = info
        self.fail = fail
        self.connected = 0
        self.measured: list[list[int]] = []

    def connect(self, url: str, timeout_s: float = 10.0) -> Any:
        self.connected += 1
        return self

    def close(self) -> None:
        pass

    def read_model_info(self, client: Any, url: str, model: str, version: str = "") -> ModelInfo:
        return self.info

    def measure(
        self,
        client: Any,
        info: ModelInfo,
        make_inputs: Callable[[int], list[Any]],
        batch_sizes: Sequence[int],
        *,
        warmup: int = 5,
        repeats: int = 30,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[SizeMeasurement]:
        self.measured.append(list(batch_sizes))
        if self.fail:
            raise ProfileError(self.fail)
        for done in range(1, len(batch_sizes) * repeats + 1):
            if progress is not None:
                progress(done, len(batch_sizes) * repeats)
        return [SizeMeasurement(b, tuple(2.0 + 0.5 * b for _ in range(repeats))) for b in batch_sizes]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    fake = FakeServer()
    monkeypatch.setattr(profiling, "connect", fake.connect)
    monkeypatch.setattr(profiling, "read_model_info", fake.read_model_info)
    monkeypatch.setattr(profiling, "measure", fake.measure)
    return fake


def profile(*args: str) -> list[str]:
    return ["profile", "--url", "h:1", "--model", "sleepy", "--repeats", "3", "--warmup", "0", *args]


def sleepy_file(tmp_path: Path, **spec: Any) -> Path:
    """The seed example made the sleep model, its profile reaching batch size 16, with ``spec`` overrides."""
    doc = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())
    doc["spec"]["model"] = {
        "name": "sleepy",
        "backend": "python",
        "inputs": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
        "outputs": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": [4]}],
        "repository": {"pvc": {"claimName": "models", "path": "triton"}},
    }
    doc["spec"]["profile"] += [{"batchSize": 16, "latencyMs": 80}, {"batchSize": 32, "latencyMs": 150}]
    doc["spec"].update(spec)
    path = tmp_path / "bm.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ("4,16", "--batch-sizes 16 exceeds the max_batch_size=8 of model 'sleepy' on h:1"),
        ("64,2,32", "--batch-sizes 32,64 exceed the max_batch_size=8 of model 'sleepy' on h:1"),
    ],
)
def test_batch_sizes_above_the_servers_max_batch_size_exit_2_before_anything_is_measured_or_printed(
    server: FakeServer, capsys: pytest.CaptureFixture[str], sizes: str, message: str
) -> None:
    assert main(profile("--batch-sizes", sizes, "--latency-p99-ms", "80")) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [message]  # one line, no blank line before it, no traceback
    assert captured.out == ""
    assert server.measured == []


def test_batch_sizes_above_1_for_a_model_without_batching_exit_2(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.info = ModelInfo(**{**SLEEPY.__dict__, "max_batch_size": 0})
    assert main(profile("--batch-sizes", "1,2")) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "--batch-sizes 2: model 'sleepy' on h:1 does not batch (max_batch_size=0), so every request holds one "
        "sample: the only batch size is 1"
    ]
    assert server.measured == []


def test_a_files_profile_above_max_batch_size_is_noted_and_replaced(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = sleepy_file(tmp_path)
    assert main(profile("-f", str(path), "-o", "yaml")) == 0
    captured = capsys.readouterr()
    assert server.measured == [[1, 2, 4, 8]]
    err = captured.err.splitlines()
    assert err[0] == (
        f"note: -f {path}: spec.profile batch sizes 16,32 are above the max_batch_size=8 of model 'sleepy' on h:1; "
        "the measured profile replaces the file's and stops at 8"
    )
    assert err[1].startswith("plan: max_batch_size")
    assert len(err) == 2, err
    doc = yaml.safe_load(captured.out)
    assert [p["batchSize"] for p in doc["spec"]["profile"]] == [1, 2, 4, 8]


def test_a_file_that_needs_batch_sizes_above_max_batch_size_exits_2_before_measuring(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = sleepy_file(tmp_path, batching={"preferredBatchSizes": [4, 16]})
    assert main(profile("-f", str(path))) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"-f {path} does not fit the profile to measure, at batch sizes 1,2,4,8 (max_batch_size=8 of model "
        "'sleepy' on h:1): spec.batching.preferredBatchSizes[1]=16 exceeds the largest profiled batch size 8 "
        "(spec.profile[3].batchSize); the profile is never extrapolated"
    ]
    assert captured.out == ""
    assert server.measured == []


def test_a_model_the_server_describes_outside_the_schema_fails_before_measuring(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.info = ModelInfo(**{**SLEEPY.__dict__, "name": "my model"})
    assert main(profile("--latency-p99-ms", "80")) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("batchfill profile: model 'my model' on h:1 does not make a valid BatchedModel: "), err
    assert "spec.model.name" in err[0]
    assert server.measured == []


def test_a_shape_for_an_unknown_input_exits_2(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(profile("--shape", "FOO=3")) == 2
    assert capsys.readouterr().err.splitlines() == [
        "--shape names ['FOO'], which are not inputs of 'sleepy' on h:1 (its inputs: ['INPUT0'])"
    ]
    assert server.measured == []


@pytest.mark.parametrize(
    ("args", "stderr"),
    [
        (["-o", "yaml"], []),
        (["-o", "yaml", "--latency-p99-ms", "80"], ["plan: max_batch_size"]),
        ([], []),
    ],
)
def test_stderr_has_no_blank_line_when_not_a_terminal(
    server: FakeServer, capsys: pytest.CaptureFixture[str], args: list[str], stderr: list[str]
) -> None:
    assert main(profile(*args)) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(stderr), err
    assert all(line.startswith(start) for line, start in zip(err, stderr, strict=True)), err


def test_an_error_while_measuring_is_one_line(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    server.fail = "'sleepy': inference of batch size 4 failed: out of memory"
    assert main(profile()) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["batchfill profile: 'sleepy': inference of batch size 4 failed: out of memory"]
    assert captured.out == ""


def test_a_document_built_from_metadata_says_it_has_no_repository(
    server: FakeServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(profile("--latency-p99-ms", "80", "-o", "yaml")) == 0
    out = capsys.readouterr().out
    assert out.startswith(NO_REPOSITORY_COMMENT)
    doc = yaml.safe_load(out)
    assert "repository" not in doc["spec"]["model"]
    path = tmp_path / "measured.yaml"
    path.write_text(out)
    assert main(["plan", str(path)]) == 0  # the comment is YAML: the output is still accepted unchanged


def test_a_document_from_a_file_carries_its_repository(
    server: FakeServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = sleepy_file(tmp_path)
    assert main(profile("-f", str(path), "-o", "yaml")) == 0
    out = capsys.readouterr().out
    assert not out.startswith("#")
    doc = yaml.safe_load(out)
    assert doc["spec"]["model"]["repository"] == {"pvc": {"claimName": "models", "path": "triton"}}
    assert load_model(doc).spec.model.repository is not None


def test_dump_document_comments_only_a_batched_model_without_repository() -> None:
    base = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())
    assert dump_document(base).startswith(NO_REPOSITORY_COMMENT)
    with_repo = copy.deepcopy(base)
    with_repo["spec"]["model"]["repository"] = {"uri": "s3://bucket/models"}
    assert dump_document(with_repo) == yaml.safe_dump(with_repo, sort_keys=False)
    block = {"profile": [{"batchSize": 1, "latencyMs": 1.0}]}
    assert dump_document(block) == yaml.safe_dump(block, sort_keys=False)


# --- the fixes of the review: the URL, the -f file against the server, --shape, one-line server messages


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("localhost:abc", "--url 'localhost:abc' must be HOST:PORT of Triton's HTTP endpoint, the port in 1-65535"),
        ("localhost", "--url 'localhost' must be HOST:PORT"),
        ("h:0", "--url 'h:0' must be HOST:PORT"),
        ("h:65536", "--url 'h:65536' must be HOST:PORT"),
        ("h:8000/v2", "--url 'h:8000/v2' must be HOST:PORT"),
        ("https://h:8000", "--url 'https://h:8000' must be HOST:PORT of Triton's HTTP endpoint (e.g. localhost:8000): "
         "drop https://"),
        ("grpc://h:8001", "--url 'grpc://h:8001' must be HOST:PORT"),
    ],
)  # fmt: skip
def test_a_bad_url_exits_2_in_one_line_without_making_a_client(
    server: FakeServer, capsys: pytest.CaptureFixture[str], url: str, message: str
) -> None:
    assert main(["profile", "--url", url, "--model", "sleepy"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(message), err
    assert server.connected == 0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("127.0.0.1:8000", "127.0.0.1:8000"),
        ("http://127.0.0.1:52885/", "127.0.0.1:52885"),
        ("[::1]:8000", "[::1]:8000"),
    ],
)
def test_check_url_takes_host_port_and_drops_http(url: str, expected: str) -> None:
    assert check_url(url) == expected


def test_an_http_url_is_profiled_as_host_port(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", "--url", "http://h:1", "--model", "sleepy", "--repeats", "1", "--warmup", "0", "-o", "yaml"]
    assert main(argv) == 0
    assert server.measured == [[1, 2, 4, 8]]


def test_a_client_whose_constructor_failed_is_collected_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """tritonclient's ``__del__`` reads an attribute its ``__init__`` sets last ("Exception ignored in ...")."""
    import gc
    import sys

    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(Exception, match="scheme"):
        _client_class()("http://127.0.0.1:1")
    gc.collect()
    assert unraisable == []


def test_a_file_for_another_model_exits_2_before_connecting(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = sleepy_file(tmp_path)
    assert main(["profile", "--url", "h:1", "--model", "text_recognizer", "-f", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"-f {path}: spec.model.name=sleepy but --model text_recognizer"]
    assert server.connected == 0


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            [{"name": "x", "dataType": "TYPE_FP32", "dims": [4]}],
            "spec.model.inputs are named ['x'] but model 'sleepy' on h:1 has inputs ['INPUT0']",
        ),
        (
            [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [3, 224, 224]}],
            "spec.model.inputs[0] ('INPUT0') has dims [3, 224, 224] but model 'sleepy' on h:1 declares [4] "
            "(without the batch dimension)",
        ),
        (
            [{"name": "INPUT0", "dataType": "TYPE_INT64", "dims": [4]}],
            "spec.model.inputs[0] ('INPUT0') is TYPE_INT64 but model 'sleepy' on h:1 declares TYPE_FP32",
        ),
    ],
)
def test_a_file_whose_inputs_are_not_the_servers_exits_2_before_measuring(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], inputs: list[Any], message: str
) -> None:
    path = sleepy_file(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["model"]["inputs"] = inputs
    path.write_text(yaml.safe_dump(doc))
    assert main(profile("-f", str(path))) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"-f {path}: {message}"]
    assert captured.out == ""
    assert server.measured == []


def test_a_files_inputs_match_with_the_batch_dimension_or_variable_dims(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.info = ModelInfo(**{**SLEEPY.__dict__, "inputs": (TensorInfo("INPUT0", "FP32", (-1, 4)),)})
    path = sleepy_file(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["model"]["inputs"] = [
        {"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [-1, 16, 4], "includesBatchDim": True}
    ]
    path.write_text(yaml.safe_dump(doc))
    assert main(profile("-f", str(path), "--shape", "INPUT0=16,4", "-o", "yaml")) == 0, capsys.readouterr().err
    assert server.measured == [[1, 2, 4, 8]]


@pytest.mark.parametrize(
    ("dims", "shape", "ok"),
    [((4,), "4", True), ((4,), "5", False), ((4,), "1,2,3", False), ((-1, 4), "7,4", True), ((-1, 4), "7,5", False)],
)
def test_shape_must_fit_the_declared_dims(
    server: FakeServer, capsys: pytest.CaptureFixture[str], dims: tuple[int, ...], shape: str, ok: bool
) -> None:
    server.info = ModelInfo(**{**SLEEPY.__dict__, "inputs": (TensorInfo("INPUT0", "FP32", dims),)})
    code = main(profile("--shape", f"INPUT0={shape}", "-o", "yaml"))
    err = capsys.readouterr().err.splitlines()
    if ok:
        assert code == 0, err
        return
    assert code == 2
    assert err == [
        f"--shape INPUT0={shape} does not fit input 'INPUT0' of 'sleepy' on h:1, dims {list(dims)} (without the "
        "batch dimension): fixed dims must be given as they are, -1 takes any positive size"
    ]
    assert server.measured == []


def test_one_line_collapses_whitespace_and_cuts_long_text() -> None:
    assert one_line("a\n  b\tc\n\n") == "a b c"
    cut = one_line("x" * 500, limit=300)
    assert len(cut) == 300
    assert cut.endswith("…")


def test_an_unavailable_models_reason_is_one_line() -> None:
    """Triton's reason for a model that failed to load holds the backend's traceback, newlines and all."""
    reason = "Internal: RuntimeError: first line\n  second line\n\nAt:\n  /models/m/1/model.py(3): initialize\n"

    class Unavailable:
        def is_model_ready(self, model: str, version: str) -> bool:
            return False

        def get_model_repository_index(self) -> list[dict[str, str]]:
            return [{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": reason + "x" * 400}]

    with pytest.raises(ProfileError) as info:
        read_model_info(Unavailable(), "h:1", "m")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "model 'm' is not ready on h:1 (state UNAVAILABLE: Internal: RuntimeError: first line second line At: "
        "/models/m/1/model.py(3): initialize xxx"
    )
    assert message.endswith("…)")


def test_a_model_without_batching_plans_without_a_batch_dimension() -> None:
    """max_batch_size 0 on the server: the document says so, and the plan renders no batching at all."""
    from batchfill.cli.plan import plan_document

    info = ModelInfo(**{**SLEEPY.__dict__, "max_batch_size": 0})
    doc = document_for(info, [{"batchSize": 1, "latencyMs": 2.0}], ProfileOptions(url="h:1", model="sleepy",
                       latency_p99_ms=50.0))  # fmt: skip
    assert doc["spec"]["batching"] == {"maxBatchSize": 0}
    planned = plan_document(doc, None, 0)
    assert planned["plan"]["maxBatchSize"] == 0
    assert "max_batch_size: 0\n" in planned["config"]
    assert "dynamic_batching" not in planned["config"]
