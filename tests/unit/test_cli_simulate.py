"""`batchfill simulate` as a user runs it: the table, the PNG and JSON it writes, and one-line usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from batchfill.cli import simulate as simulate_cli
from batchfill.cli.main import main
from batchfill.cli.simulate import parse_duration
from batchfill.compare.run import POLICIES

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed-example.yaml"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_spike_run_prints_the_table_and_writes_png_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png, js = tmp_path / "p.png", tmp_path / "out" / "s.json"
    argv = ["simulate", str(SEED), "--trace", "spike", "--duration", "20m", "--mean-rps", "200"]
    assert main([*argv, "--plot", str(png), "--json", str(js)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "Traceback" not in captured.out + captured.err
    assert "spike: Poisson 200 -> 400 req/s at 400 s for 200 s, 1200 s, seed 0" in out
    table_lines = [line.strip() for line in out.splitlines()]
    for name in [*POLICIES, "lower bound", "lower bound, fractional"]:
        assert any(line.startswith(f"{name} ") for line in table_lines), f"no table row for {name}"
    assert "capacity at SLA C = 110 req/s per replica" in out
    assert f"plot: {png}" in out
    assert f"json: {js}" in out

    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000, f"PNG of {len(data)} bytes"

    doc = json.loads(js.read_text())
    assert doc["durationSeconds"] == 1200.0
    assert doc["staticReplicas"] >= 1
    assert doc["serverBudgetMs"] == 90.0
    policies = [r["policy"] for r in doc["rows"]]
    assert policies == [*POLICIES, "lower bound", "lower bound, fractional"]
    ours = doc["rows"][0]
    assert ours["policy"] == "batchfill"
    assert 0.0 <= ours["slo_attainment"] <= 1.0
    assert ours["gpu_hours"] > 0
    assert doc["checks"] == [], "the cost targets are set for a diurnal day, not for a spike"


def test_empty_plot_writes_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["simulate", str(SEED), "--trace", "step", "--duration", "2m", "--mean-rps", "50", "--policies"]
    assert main([*argv, "batchfill,static-peak", "--plot", ""]) == 0
    out = capsys.readouterr().out
    assert "plot:" not in out
    assert list(tmp_path.iterdir()) == [], "nothing written, not even the default batchfill-simulate.png"
    assert "batchfill " in out
    assert not any(line.strip().startswith("hpa-gpu ") for line in out.splitlines()), "only the policies asked for"


def test_diurnal_run_prints_the_benchmark_targets(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", str(SEED), "--duration", "20m", "--mean-rps", "150", "--policies", "batchfill,static-peak"]
    assert main([*argv, "--plot", ""]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    marks = [line for line in lines if line.startswith(("met ", "missed "))]
    assert any("SLO attainment >= 99.9%" in line for line in marks), lines


def test_replay_reads_the_rate_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rates = tmp_path / "day.csv"
    rates.write_text("minute,rps\n0,50\n1,80\n2,120\n")
    argv = ["simulate", str(SEED), "--trace", "replay", "--rates", str(rates), "--policies", "static-peak"]
    assert main([*argv, "--plot", ""]) == 0
    out = capsys.readouterr().out
    assert "day: 3 per-minute rates" in out


def _write(tmp_path: Path, name: str, text: str) -> str:
    f = tmp_path / name
    f.write_text(text)
    return str(f)


def _no_profile(tmp_path: Path) -> str:
    doc = yaml.safe_load(SEED.read_text())
    del doc["spec"]["profile"]
    return _write(tmp_path, "noprofile.yaml", yaml.safe_dump(doc))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--duration", "0"], "--duration '0' must be positive"),
        (["--duration", "5x"], "--duration '5x' is not a number with an optional unit s, m, h or d"),
        (["--trace", "replay"], "--trace replay needs --rates FILE"),
        (["--trace", "replay", "--rates", "{bad_rates}"], "--rates {bad_rates}: line 3: 'x' is not a rate in req/s"),
        (["--trace", "replay", "--rates", "{missing}"], "--rates {missing}: cannot read"),
        (["--policies", "nope"], "unknown policy 'nope'; choose from batchfill, hpa-gpu, keda-rps, keda-queue"),
        (["--mean-rps", "-1"], "--mean-rps=-1.0 must be a finite number >= 0"),
        (["--mean-rps", "nan"], "--mean-rps=nan must be a finite number >= 0"),
        (["--peak-rps", "inf", "--trace", "spike"], "--peak-rps=inf must be a finite number >= 0"),
        (["--startup", "-5"], "--startup=-5.0 must be a finite number >= 0"),
        (["--mean-rps", "1e6", "--duration", "1d"], "--mean-rps/--duration: the trace holds about 8.64e+10 requests"),
        (["--trace", "replay", "--rates", "{big_rates}"], "--rates {big_rates}: is over the 0 MiB a rate file may"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str
) -> None:
    monkeypatch.setattr(simulate_cli, "MAX_RATE_FILE_BYTES", 64)  # the bound's check, without a 32 MiB file
    paths = {"bad_rates": _write(tmp_path, "bad.txt", "1\n2\nx\n"), "missing": str(tmp_path / "missing.txt"),
             "big_rates": _write(tmp_path, "big.txt", "100\n" * 17)}  # fmt: skip
    argv = [a.format(**paths) for a in args]
    expected = expected.format(**paths)
    assert main(["simulate", str(SEED), "--duration", "2m", *argv, "--plot", str(tmp_path / "p.png")]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{SEED}: {expected}"), lines
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "p.png").exists()


def test_spec_without_profile_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _no_profile(tmp_path)
    assert main(["simulate", f, "--plot", ""]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"{f}: spec.profile is required to simulate a fleet (measure it with `batchfill profile`)"
    ]


def test_infeasible_sla_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _write(tmp_path, "tight.yaml", SEED.read_text().replace("latencyP99Ms: 100", "latencyP99Ms: 15"))
    assert main(["simulate", f, "--plot", ""]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"{f}: spec.profile[0].latencyMs: latency at batch 1 is 10 ms, budget is 5 ms")


def test_several_documents_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = SEED.read_text()
    f = _write(tmp_path, "two.yaml", text + "\n---\n" + text)
    assert main(["simulate", f, "--plot", ""]) == 2
    assert "takes one BatchedModel, found 2 documents" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--trace", "spike", "--start", "5x"], "--start"),
        (["--seed", "-1"], "--seed"),
        (["--hpa-gpu-target", "150"], "--hpa-gpu-target"),
    ],
)
def test_bad_flag_is_named_in_the_message(capsys: pytest.CaptureFixture[str], args: list[str], flag: str) -> None:
    assert main(["simulate", str(SEED), "--duration", "2m", *args, "--plot", ""]) == 2
    assert flag in capsys.readouterr().err


def test_unknown_policy_is_exactly_one_line_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(SEED), "--duration", "2m", "--policies", "nope", "--plot", ""]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"{SEED}: unknown policy 'nope'; choose from batchfill, hpa-gpu, keda-rps, keda-queue, static-peak"
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("15m", 900.0),
        ("1.5h", 5400.0),
        ("2d", 172_800.0),
        (" 20m ", 1200.0),
        (".5m", 30.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "0m", "5x", "", "m", "-5", "1e3", "1h30m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "bursty", "--cv", "0"], "--cv=0.0 must be finite"),
        (["--trace", "diurnal", "--peak-to-trough", "0.5"], "--peak-to-trough=0.5 must be finite"),
        (["--trace", "spike", "--start", "3h"], "--start=10800.0 must be finite"),
    ],
)
def test_trace_errors_name_the_flag(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["simulate", str(SEED), "--duration", "2m", *args, "--plot", ""]) == 2
    assert message in capsys.readouterr().err


def test_a_peak_above_max_replicas_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", str(SEED), "--trace", "spike", "--duration", "10m", "--mean-rps", "300", "--peak-rps", "1000"]
    assert main([*argv, "--policies", "static-peak", "--plot", ""]) == 0
    out = capsys.readouterr().out
    assert "needs 10 replicas at capacity; spec.scaling.maxReplicas=8 caps every autoscaler" in out


def test_hpa_targets_can_be_named_in_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", str(SEED), "--trace", "spike", "--duration", "5m", "--mean-rps", "100"]
    assert main([*argv, "--policies", "hpa-gpu@90,hpa-gpu", "--plot", ""]) == 0
    out = capsys.readouterr().out
    assert "hpa-gpu@90 " in out
    assert main([*argv, "--policies", "hpa-gpu@0", "--plot", ""]) == 2
    assert "policy 'hpa-gpu@0': the target after '@' must be a percentage in (0, 100]" in capsys.readouterr().err


def test_baselines_lead_with_the_end_to_end_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    js = tmp_path / "e2e.json"
    argv = ["simulate", str(SEED), "--trace", "step", "--duration", "4m", "--mean-rps", "200", "--peak-rps", "200"]
    policies = "batchfill,batching-off/static-peak,seed-rule/hpa-gpu@90"
    assert main([*argv, "--policies", policies, "--balancing", "random", "--plot", "", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert out.index("end to end: batchfill against what teams run today") < out.index("capacity at SLA C = 110")
    lines = [line.split() for line in out.splitlines()]
    assert next(w[:2] for w in lines if w[:1] == ["plan"]) == ["plan", "batchfill"]
    assert any(w[:3] == ["batching-off", "static", "peak"] for w in lines)
    assert any(w[:5] == ["seed-rule", "HPA", "GPU", "util", "90%"] for w in lines)
    assert "batching-off: no dynamic_batching (batch 1 per execution); C = " in out
    doc = json.loads(js.read_text())
    assert doc["balancing"] == "random"
    assert doc["endToEnd"][0]["autoscaler"] == "batchfill"
    assert [r["Triton batching"] for r in doc["endToEnd"]] == ["plan", "batching-off", "seed-rule"]
    assert main([*argv, "--policies", "batching-on/hpa-gpu", "--plot", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "unknown batching configuration 'batching-on'" in err[0]


def test_a_baseline_peak_above_max_replicas_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", str(SEED), "--trace", "step", "--duration", "2m", "--mean-rps", "700", "--peak-rps", "700"]
    assert main([*argv, "--policies", "batchfill,batching-off/static-peak", "--plot", ""]) == 0
    out = capsys.readouterr().out
    # the plan's C = 110 req/s needs 7 <= 8 replicas; batching off (one request at a time, 10 ms) needs more than 8
    assert "note: the peak minute" not in out
    assert "note: batching-off needs " in out
    assert "spec.scaling.maxReplicas=8 caps its HPA runs (its static-peak is not capped)" in out
