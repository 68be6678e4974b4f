"""Static checks run inside the test command, so CI fails when they fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param((str(BIN / "ruff"), "check", "operator", "tests", "benchmarks"), id="ruff"),
        pytest.param((str(BIN / "mypy"),), id="mypy"),  # strict for api/policy/render/sim (pyproject)
        pytest.param((str(BIN / "lint-imports"),), id="import-linter"),
    ],
)
def test_static_check_passes(cmd: tuple[str, ...]) -> None:
    result = _run(*cmd)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
