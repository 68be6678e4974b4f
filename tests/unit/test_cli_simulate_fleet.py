"""`batchfill simulate --fleet` as a user runs it: a small fleet on shared GPUs for an hour, its figures, their
determinism, and one-line field-named refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from batchfill.api.validate import load_model
from batchfill.cli import simulate_fleet
from batchfill.cli.main import main
from batchfill.compare.shared_fleet import FleetModels, attainment, diurnal_rates, replan_fleet
from batchfill.policy.plan import plan_batching

from .fleet_docs import SEED, fleet_file, named

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("big", "mid", "small", "tiny")
#: the seed example's capacity at SLA alone on one GPU, req/s (about 110)
CAPACITY_RPS = plan_batching(load_model(SEED).spec).chosen.capacity_rps
FAST = ["--duration", "1h", "--replan-minutes", "30", "--sample-seconds", "15"]


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    return fleet_file(tmp_path / "fleet.yaml", NAMES)


def run_json(argv: list[str], path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["simulate", *argv, "--json", str(path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    for row in ("one model per GPU", "shared (joint plan)", "fractional bound"):
        assert row in out
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_diurnal_fleet_hour_reports_gpu_hours_attainment_and_moves(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_json([str(fleet), "--fleet-trace", "diurnal", "--seed", "3", *FAST], tmp_path / "a.json", capsys)
    assert doc["models"] == list(NAMES)
    assert doc["durationSeconds"] == 3600.0
    assert [p["startSeconds"] for p in doc["periods"]] == [0.0, 1800.0]
    g = doc["gpuHours"]
    assert g["shared"] == sum(p["sharedGpus"] for p in doc["periods"]) * 0.5
    assert g["oneModelPerGpu"] == sum(p["oneModelPerGpuGpus"] for p in doc["periods"]) * 0.5
    assert g["oneModelPerGpu"] >= len(NAMES) * 1.0  # at least one GPU per model for the hour
    assert g["fractionalBound"] == pytest.approx(sum(p["fractionalBound"] for p in doc["periods"]) * 0.5, abs=1e-5)
    assert g["fractionalBound"] <= g["shared"] <= g["oneModelPerGpu"]
    for key in ("shared", "oneModelPerGpu"):
        a = doc["sloAttainment"][key]
        assert 0.9 <= a["worstModel"] <= a["allRequests"] <= 1.0
        per = {m["name"]: m[f"sloAttainment{key[0].upper()}{key[1:]}"] for m in doc["perModel"]}
        assert a["worstModel"] == min(per.values())
        assert per[a["worstModelName"]] == a["worstModel"]
    assert doc["moves"] == sum(p["moves"] for p in doc["periods"])
    assert doc["movesPerDay"] == doc["moves"] * 24
    # default mean: half of each model's capacity, times a diurnal shape of mean ~1 over a day (an hour: within 3x)
    for m in doc["perModel"]:
        assert CAPACITY_RPS * 0.5 / 3 < m["meanRps"] < CAPACITY_RPS * 0.5 * 3


def test_same_seed_same_figures_other_seed_other_rates(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(fleet), "--fleet", *FAST]
    first = run_json([*argv, "--seed", "5"], tmp_path / "1.json", capsys)
    again = run_json([*argv, "--seed", "5"], tmp_path / "2.json", capsys)
    other = run_json([*argv, "--seed", "6"], tmp_path / "3.json", capsys)
    assert first == again
    assert [m["meanRps"] for m in first["perModel"]] != [m["meanRps"] for m in other["perModel"]]


def test_rates_file_sets_each_models_series_and_the_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    for n in NAMES[:3]:
        (folder / f"{n}.yaml").write_text(yaml.safe_dump(named(n)))
    rates = {"big": [150.0] * 60, "mid": [40.0] * 30 + [80.0] * 30, "small": [5] * 60}
    (tmp_path / "rates.yaml").write_text(yaml.safe_dump(rates))
    argv = [str(folder), "--fleet", "--rates", str(tmp_path / "rates.yaml"), "--sample-seconds", "15"]
    doc = run_json(argv, tmp_path / "r.json", capsys)
    assert doc["durationSeconds"] == 3600.0  # the series' length
    assert {m["name"]: m["meanRps"] for m in doc["perModel"]} == {"big": 150.0, "mid": 60.0, "small": 5.0}
    assert [p["fractionalBound"] for p in doc["periods"]] == pytest.approx(
        [(150 + 40 + 5) / CAPACITY_RPS, (150 + 80 + 5) / CAPACITY_RPS], abs=1e-5
    )
    # one model per GPU sizes the second period on the first's rates (what the operator measured)
    u = SEED["spec"].get("scaling", {}).get("targetUtilization", 0.85)
    first = sum(max(1, math.ceil(r / (u * CAPACITY_RPS))) for r in (150, 40, 5))
    assert [p["oneModelPerGpuGpus"] for p in doc["periods"]] == [first, first]


def _rates_file(tmp_path: Path, content: Any) -> str:
    f = tmp_path / "rates.yaml"
    f.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return str(f)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--replan-minutes", "0"], "--replan-minutes"),
        (["--replan-minutes", "2000"], "--replan-minutes"),
        (["--sample-seconds", "0"], "--sample-seconds"),
        (["--sample-seconds", "601"], "--sample-seconds"),
        (["--duration", "45m"], "--duration"),
        (["--duration", "8d"], "--duration"),
        (["--duration", "soon"], "--duration"),
        (["--mean-rps", "0"], "--mean-rps"),
        (["--peak-to-trough", "0.5"], "--peak-to-trough"),
        (["--seed", "-1"], "--seed"),
        (["--gpu-memory-mib", "0"], "--gpu-memory-mib"),
        (["--gpu-memory-mib", "100"], "--gpu-memory-mib"),  # no room beside the server's own memory
        (["--memory", "nosuch=100"], "--memory"),
        (["--memory", "big=lots"], "--memory"),
        (["--memory", "big=20000"], "big: memory=20000 MiB"),  # more than a GPU holds
        (["--duration", "7d", "--replan-minutes", "1"], "--replan-minutes"),  # 10,080 periods
        (["--fleet-trace", "diurnal", "--rates", "r.yaml"], "--fleet-trace=diurnal and --rates"),
        (["--mean-rps", "1e7", "--sample-seconds", "600"], "simulated requests (both placements, 600 s per period)"),
    ],
)
def test_bad_flags_exit_2_with_one_line_naming_the_flag(
    fleet: Path, extra: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", str(fleet), "--fleet", *FAST, *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert field in lines[0]


@pytest.mark.parametrize(
    ("rates", "field"),
    [
        ({n: [10.0] * 60 for n in NAMES[:3]}, "tiny: has no rates"),
        ({**{n: [10.0] * 60 for n in NAMES}, "ghost": [1.0]}, "ghost: no such model"),
        ({**{n: [10.0] * 60 for n in NAMES}, "big": [10.0, -1.0]}, "big[1]"),
        ({**{n: [10.0] * 60 for n in NAMES}, "mid": "fast"}, "mid: must be a non-empty list"),
        ({n: [10.0] * 30 for n in NAMES}, "--duration"),  # 30 min of rates, an hour asked for
        ([1, 2, 3], "must hold one mapping"),
        ("a: [1, 2\n", "--rates"),  # YAML that does not parse
    ],
)
def test_bad_rates_file_exits_2_with_one_line_naming_the_field(
    fleet: Path, tmp_path: Path, rates: Any, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _rates_file(tmp_path, rates)
    assert main(["simulate", str(fleet), "--fleet", *FAST, "--rates", f]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert field in lines[0]


def test_bad_fleets_exit_2_naming_the_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    twice = tmp_path / "twice.yaml"
    twice.write_text(yaml.safe_dump_all([named("a"), named("a")]))
    assert main(["simulate", str(twice), "--fleet", *FAST]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"{twice} (document 2): metadata.name='a' appears twice: names must be unique"
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["simulate", str(empty), "--fleet", *FAST]) == 2
    assert capsys.readouterr().err.strip() == f"{empty}: no YAML documents"
    monkeypatch.setattr(simulate_fleet, "MAX_FLEET_MODELS", 2)
    three = tmp_path / "three.yaml"
    three.write_text(yaml.safe_dump_all([named(n) for n in NAMES[:3]]))
    assert main(["simulate", str(three), "--fleet", *FAST]) == 2
    assert capsys.readouterr().err.strip() == f"{three}: holds 3 models, over the 2 a fleet may"


def test_without_fleet_several_documents_are_still_refused(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(fleet), "--plot", ""]) == 2
    assert "takes one BatchedModel, found 4 documents" in capsys.readouterr().err


def test_replan_fleet_refuses_rates_of_another_shape_and_attainment_names_the_worst() -> None:
    spec = load_model(named("a")).spec
    models = FleetModels(("a",), {"a": spec}, {"a": plan_batching(spec)}, {"a": 1024.0})
    rates = np.full((2, 1), 10.0)
    with pytest.raises(ValueError, match="must both be"):
        replan_fleet(models, rates, np.full((3, 1), 10.0), period_s=60, sample_s=5, gpu_memory_mib=16384, seed=0)
    assert attainment({"a": [100, 99], "b": [10, 5], "c": [0, 0]}) == (104 / 110, 0.5, "b")
    with pytest.raises(ValueError, match=r"peak_to_trough=0\.5 must be >= 1"):
        diurnal_rates([1.0], 2, 60.0, peak_to_trough=0.5, noise_sigma=0.1, rng=np.random.default_rng(0))


def test_replanning_within_the_period_serves_its_first_seconds_on_the_old_placement() -> None:
    """``replan_after_s`` (the operator's pool re-plans once a member's rate rose): a period whose rate jumped is
    served by the old placement for its first seconds only, then by one planned on the period's rates; GPUs and
    requests count each part for its share of the period, so the jump costs the model less than a period on the old
    placement and more than none."""
    spec = load_model(named("a")).spec
    plan = plan_batching(spec)
    models = FleetModels(("a", "b"), {"a": spec, "b": spec}, {"a": plan, "b": plan}, {"a": 1024.0, "b": 1024.0})
    true = np.array([[5.0, 5.0], [6.0 * CAPACITY_RPS, 5.0]])  # period 1: "a" needs several GPUs of its own
    before = np.array([[5.0, 5.0], [5.0, 5.0]])
    common = {"period_s": 600.0, "sample_s": 30.0, "gpu_memory_mib": 16384.0, "seed": 0}
    runs = {
        "old": replan_fleet(models, true, before, **common),  # type: ignore[arg-type]
        "replanned": replan_fleet(models, true, true, replan_after_s=60.0, **common),  # type: ignore[arg-type]
        "oracle": replan_fleet(models, true, true, **common),  # type: ignore[arg-type]
    }
    met = {k: r.attainment_shared["a"][1] / r.attainment_shared["a"][0] for k, r in runs.items()}
    assert met["old"] < 0.8 < met["replanned"] < met["oracle"], met
    replanned = runs["replanned"]
    first, second = replanned.placements
    old_gpus = len(first.shared) + first.dedicated_gpus
    assert old_gpus < replanned.shared_gpus[1] < runs["oracle"].shared_gpus[1] + 1e-9
    assert replanned.shared_gpus[1] != round(replanned.shared_gpus[1]), "a mean over the period's two parts"
    assert second.model("a").dedicated_gpus >= 5
    for bad in (0.0, 600.0):
        with pytest.raises(ValueError, match="replan_after_s"):
            replan_fleet(models, true, true, replan_after_s=bad, **common)  # type: ignore[arg-type]


def test_the_examples_minute_rates_run_as_the_readme_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README's `simulate examples/shared/ --fleet --rates examples/shared-minute-rates.yaml ...`: the example file
    is the format --fleet --rates takes (two hours, one rate a minute), and its three models share fewer GPUs."""
    rates = ROOT / "examples" / "shared-minute-rates.yaml"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "--fleet --rates examples/shared-minute-rates.yaml --replan-minutes 15" in readme
    argv = [str(ROOT / "examples" / "shared"), "--fleet", "--rates", str(rates), "--replan-minutes", "15"]
    doc = run_json([*argv, "--memory", "detector=4096", "--sample-seconds", "15"], tmp_path / "a.json", capsys)
    assert doc["durationSeconds"] == 7200.0
    assert len(doc["periods"]) == 8
    assert sorted(doc["models"]) == ["detector", "resnet50", "text-classifier"]
    series = yaml.safe_load(rates.read_text())
    for m in doc["perModel"]:
        assert m["meanRps"] == pytest.approx(sum(series[m["name"]]) / 120, rel=1e-6)
    g = doc["gpuHours"]
    assert g["fractionalBound"] < g["shared"] < g["oneModelPerGpu"], "the example shows the saving it documents"
