"""What a command imports before it runs, and what a command whose optional dependencies are missing says.

Building the parser imports only the standard library (cli/main.py), so `batchfill --help` and `batchfill plan`
never load matplotlib (the `simulate` extra) or the test bed; each command loads its own modules when it runs.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from batchfill.cli import common
from batchfill.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed-example.yaml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: What no command may import before it runs, and `batchfill plan` not at all.
NEVER_BEFORE_RUNNING = ("matplotlib", "batchfill.testbed", "batchfill.compare.report")


def imported_modules(*args: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules ``python -X importtime -m batchfill.cli ARGS`` imports (its stderr lists each once)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "batchfill.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    names = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return names - {"imported package"}, done  # the header line's last column


def _is_under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.fixture(scope="module")
def interpreter_start_up() -> set[str]:
    """What the interpreter imports with no command at all (site, the venv's .pth files)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, timeout=60, check=True
    )
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


COMMANDS = ["plan", "serve", "demo", "run", "dev-cluster", "profile", "simulate", "crd"]


@pytest.mark.parametrize("args", [["--help"], *([c, "--help"] for c in COMMANDS)], ids=" ".join)
def test_help_imports_only_the_standard_library_and_the_parser(args: list[str], interpreter_start_up: set[str]) -> None:
    names, done = imported_modules(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: batchfill")
    third_party = {
        n
        for n in names - interpreter_start_up
        if n.partition(".")[0] not in sys.stdlib_module_names and n.partition(".")[0] != "batchfill"
    }
    assert third_party == set(), "building the parser must not import these"
    ours = {n for n in names if _is_under(n, "batchfill")}
    assert ours == {
        "batchfill",
        "batchfill.cli",
        "batchfill.cli.common",
        "batchfill.cli.main",
    }


def test_plan_imports_neither_matplotlib_nor_the_test_bed_nor_the_operator() -> None:
    names, done = imported_modules("plan", str(SEED), "-o", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"maxBatchSize": 7' in done.stdout
    forbidden = (*NEVER_BEFORE_RUNNING, "kopf", "kubernetes", "batchfill.controller", "batchfill.adapters")
    assert sorted(n for n in names if any(_is_under(n, f) for f in forbidden)) == []
    assert "batchfill.cli.plan" in names  # the command ran in this interpreter


def test_run_help_imports_neither_matplotlib_nor_the_test_bed_nor_kopf() -> None:
    names, done = imported_modules("run", "--help")
    assert done.returncode == 0
    assert "--prometheus-url" in done.stdout
    forbidden = (*NEVER_BEFORE_RUNNING, "kopf", "batchfill.cli.run")
    assert sorted(n for n in names if any(_is_under(n, f) for f in forbidden)) == []


def test_every_command_is_dispatched_to_its_own_module() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    assert sorted(sub.choices) == sorted(COMMANDS)
    for name in COMMANDS:
        func = sub.choices[name].get_default("func")
        assert func.__module__ == "batchfill.cli.main"
        assert func.__name__ == "cmd_" + name.replace("-", "_")


# --- a command without its extra -----------------------------------------------------------------------------------
def _block(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import MODULE`` fail as for a package that is not installed."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_simulate_without_matplotlib_exits_2_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _block(monkeypatch, "matplotlib")
    assert main(["simulate", str(SEED), "--plot", ""]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "batchfill simulate needs matplotlib (the 'simulate' extra): pip install 'batchfill[simulate]'"
    ]
    assert captured.out == ""


@pytest.mark.parametrize("command", [["serve", str(ROOT / "examples" / "ocr-recognizer.yaml")], ["demo"]], ids=str)
def test_test_bed_commands_without_tritonserver_exit_2_naming_the_extra(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _block(monkeypatch, "pytriton", "onnxruntime")
    assert main([*command]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"batchfill {command[0]} needs pytriton, onnxruntime (the 'testbed' extra): pip install 'batchfill[testbed]'"
    ]
    assert captured.out == ""


def test_only_the_missing_module_is_named(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _block(monkeypatch, "onnxruntime")
    assert main(["serve", str(ROOT / "examples" / "ocr-recognizer.yaml")]) == 2
    assert capsys.readouterr().err == (
        "batchfill serve needs onnxruntime (the 'testbed' extra): pip install 'batchfill[testbed]'\n"
    )


def test_the_base_commands_need_no_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _block(monkeypatch, "matplotlib", "pytriton", "onnxruntime")
    assert main(["plan", str(SEED), "-o", "json"]) == 0
    assert main(["crd"]) == 0
    assert "CustomResourceDefinition" in capsys.readouterr().out


def test_installed_extras_are_not_reported_missing() -> None:
    assert common.missing_extra("simulate", "simulate") is None
    assert common.missing_extra("serve", "testbed") is None


def test_extra_modules_come_from_the_distributions_the_extra_installs() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    distributions = packages_distributions()
    for extra, modules in common.EXTRA_MODULES.items():
        required = {Requirement(r).name.lower() for r in extras[extra]}
        for module in modules:
            assert {d.lower() for d in distributions[module]} & required, f"{module} is not from [{extra}]"
    base = {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}
    assert base.isdisjoint({"matplotlib", "nvidia-pytriton", "onnxruntime"})


def test_the_parsers_policy_names_are_the_simulators() -> None:
    from batchfill.compare.run import POLICIES

    assert common.POLICIES == POLICIES
