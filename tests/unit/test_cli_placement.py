"""`batchfill plan` with several BatchedModels and their rates: the shared placement, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from batchfill.cli.main import main

from .fleet_docs import fleet_file, named

ROOT = Path(__file__).resolve().parents[2]
RATES = {"big": 300.0, "mid": 60.0, "small": 20.0, "tiny": 2.0, "idle": 0.0}


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    return fleet_file(tmp_path / "fleet.yaml", RATES)


def rate_flags() -> list[str]:
    return [x for n, r in RATES.items() for x in ("--rate", f"{n}={r:g}")]


def test_placement_json_puts_every_model_somewhere_on_fewer_gpus(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(fleet), *rate_flags(), "--memory", "big=4096", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    models = {m["name"]: m for m in out["models"]}
    assert set(models) == set(RATES)
    # the seed example's capacity is 110 req/s: big is 300 / 0.85 = 352.9 -> 3 dedicated GPUs and a residual
    assert models["big"]["dedicatedGpus"] == 3
    assert models["big"]["sharedRateRps"] == pytest.approx(300 / 0.85 - 3 * models["big"]["capacityRps"], abs=0.01)
    assert models["big"]["memoryMiB"] == 4096
    assert all(m["dedicatedGpus"] or m["sharedGpu"] is not None for m in models.values())
    assert all(m["p99Ms"] <= m["targetMs"] and m["headroomMs"] >= 0 for m in models.values())
    assert out["oneModelPerGpu"] == 4 + 1 + 1 + 1 + 1  # ceil(300 / (0.85 x 110)) = 4, one each for the rest
    assert out["gpus"] == out["dedicatedGpus"] + out["sharedGpus"] < out["oneModelPerGpu"]
    assert out["fractionalBound"] == pytest.approx(sum(RATES.values()) / models["big"]["capacityRps"], abs=1e-3)
    assert out["gpus"] >= out["fractionalBound"]
    on_shared = sorted(m["name"] for s in out["shared"] for m in s["models"])
    assert on_shared == sorted(n for n, m in models.items() if m["sharedGpu"] is not None)
    assert all(s["memoryMiB"] <= out["gpuMemoryMiB"] for s in out["shared"])


def test_a_folder_and_a_rates_file_give_the_same_placement(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(fleet), *rate_flags(), "-o", "json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    folder = tmp_path / "models"
    folder.mkdir()
    for n in RATES:
        (folder / f"{n}.yaml").write_text(yaml.safe_dump(named(n)))
    (folder / "README.txt").write_text("not a model")
    rates = tmp_path / "rates.yaml"
    rates.write_text(yaml.safe_dump(RATES))
    assert main(["plan", str(folder), "--rates", str(rates), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == from_file


def test_the_table_shows_gpus_models_and_the_comparison(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(fleet), *rate_flags()]) == 0
    out = capsys.readouterr().out
    assert "3 dedicated" in out
    assert "shared 0" in out
    assert "with one model per GPU" in out
    assert "fractional bound" in out


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--rate", "big=300"], "mid: has no rate"),
        ([*rate_flags(), "--rate", "nobody=1"], "--rate/--rates: nobody: no such model"),
        ([*rate_flags(), "--rate", "big=1e300"], "--rate: big=1e+300 is over the 1e+07 req/s a model may have"),
        ([*rate_flags(), "--rate", "big=fast"], "--rate: 'big=fast' must be NAME=RPS"),
        ([*rate_flags(), "--memory", "big=99999"], "big: memory=99999 MiB must be > 0 and fit"),
        ([*rate_flags(), "--gpu-memory-mib", "256"], "--gpu-memory-mib=256 must be finite and over the server's own"),
        ([*rate_flags(), "--gpu-memory-mib", "inf"], "--gpu-memory-mib=inf must be finite"),
        ([*rate_flags(), "--memory", "nosuch=4096"], "--memory: nosuch: no such model in"),
    ],
)
def test_bad_input_exits_2_with_one_line_per_problem(
    fleet: Path, capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    assert main(["plan", str(fleet), *flags]) == 2
    captured = capsys.readouterr()
    assert line in captured.err
    assert captured.out == ""
    assert "Traceback" not in captured.err


def test_a_folder_without_rates_plans_each_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for n in ("a", "b"):
        (tmp_path / f"{n}.yml").write_text(yaml.safe_dump(named(n)))
    assert main(["plan", str(tmp_path), "-o", "json"]) == 0
    assert [o["name"] for o in json.loads(capsys.readouterr().out)] == ["a", "b"]


def test_a_folder_of_too_many_files_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import batchfill.cli.placement as placement

    monkeypatch.setattr(placement, "MAX_FOLDER_FILES", 2)
    for n in ("a", "b", "c"):
        (tmp_path / f"{n}.yaml").write_text(yaml.safe_dump(named(n)))
    assert main(["plan", str(tmp_path)]) == 2
    assert "holds 3 model files, over the 2 a folder may" in capsys.readouterr().err


def test_spec_placement_memory_is_the_models_figure_unless_memory_flags_override_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's order (controller/pool_sync.py): spec.placement.memoryMiB is what the plan packs by."""
    docs = [named(n) for n in RATES]
    docs[0]["spec"]["placement"] = {"mode": "Dedicated", "memoryMiB": 99999}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["plan", str(path), *rate_flags()]) == 2
    assert "big: memory=99999 MiB must be > 0 and fit" in capsys.readouterr().err
    assert main(["plan", str(path), *rate_flags(), "--memory", "big=4096", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert next(m for m in out["models"] if m["name"] == "big")["memoryMiB"] == 4096
    docs[0]["spec"]["placement"]["memoryMiB"] = 4096  # from the spec (an integer there), not from a flag
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["plan", str(path), *rate_flags(), "-o", "json"]) == 0
    figures = [m["memoryMiB"] for m in json.loads(capsys.readouterr().out)["models"]]
    assert 4096.0 in figures
    assert all(type(f) is float for f in figures), "one JSON type whatever the source"


def test_the_shared_example_folder_checks_its_pool_and_places_its_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, rates = ROOT / "examples" / "shared", ROOT / "examples" / "shared-rates.yaml"
    assert main(["plan", str(folder), "--rates", str(rates), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {m["name"] for m in out["models"]} == {"resnet50", "text-classifier", "detector"}
    assert out["gpus"] < out["oneModelPerGpu"]
    assert main(["plan", str(folder)]) == 0
    assert "GPUPool small-models: accepted" in capsys.readouterr().out


def test_a_pool_in_the_folder_that_the_operator_would_refuse_is_named_by_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = yaml.safe_load((ROOT / "examples" / "shared" / "pool.yaml").read_text())
    pool["spec"]["minPods"], pool["spec"]["maxPods"] = 6, 2
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(named("big")))
    for flags in ([], ["--rate", "big=10"]):
        assert main(["plan", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err
        assert "pool.yaml: spec.minPods=6 must be <= spec.maxPods=2" in err
        assert "Traceback" not in err


def test_a_rates_file_is_bounded_and_its_values_never_rendered(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rates = tmp_path / "rates.yaml"
    # nested aliases: a few hundred bytes that render to gigabytes (issue 15 item 10)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, n in zip("abcdefgh", "bcdefghi", strict=True)
    )
    rates.write_text(bomb + "big: *i\n")
    assert main(["plan", str(fleet), "--rates", str(rates)]) == 2
    err = capsys.readouterr().err
    assert "--rates" in err
    assert len(err) < 2000
    rates.write_text("big: [1, 2]\nmid: 60\n")
    assert main(["plan", str(fleet), "--rates", str(rates)]) == 2
    assert "big: must be a number of req/s" in capsys.readouterr().err
