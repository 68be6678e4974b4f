"""The operator image installs the base dependencies only, from a build context that .dockerignore lets in.

Installing that set into a fresh venv and running the operator's commands there takes one to two minutes, so it
is a script (scripts/check_operator_image.py, `make image-check`); these tests check, fast, what it reads.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def image() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_operator_image", ROOT / "scripts" / "check_operator_image.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_image_installs_the_package_without_extras(image: ModuleType) -> None:
    recipe = image.read_recipe(ROOT / "Dockerfile")
    assert recipe.pip_install == ("pip", "install", ".")  # '.[simulate]' or '.[testbed]' would bring them in
    assert recipe.copies == ((("pyproject.toml", "README.md"), "./"), (("operator",), "./operator"))
    assert recipe.env["PIP_NO_CACHE_DIR"] == "1"


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        ("pyproject.toml", False),
        ("README.md", False),
        ("operator/batchfill/cli/main.py", False),
        ("operator/batchfill/examples_data/models/sleep_model/model.py", False),
        ("operator/batchfill/cli/__pycache__/main.cpython-311.pyc", True),
        ("operator/batchfill.egg-info/PKG-INFO", True),
        ("tests/unit/test_cli.py", True),
        (".venv/bin/python", True),
        ("Dockerfile", True),
    ],
)
def test_dockerignore_lets_in_only_what_pip_install_needs(image: ModuleType, path: str, ignored: bool) -> None:
    rules = image.dockerignore_rules(ROOT / ".dockerignore")
    assert image.ignored(path, rules) is ignored


def test_the_build_context_holds_the_package_and_no_bytecode(image: ModuleType, tmp_path: Path) -> None:
    recipe = image.read_recipe(ROOT / "Dockerfile")
    assert image.build_context(recipe, tmp_path) == []
    files = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {"pyproject.toml", "README.md", "operator/batchfill/cli/main.py", "operator/batchfill/py.typed"} <= files
    assert not [f for f in files if "__pycache__" in f or ".egg-info" in f]
    assert {f.split("/")[0] for f in files} == {"pyproject.toml", "README.md", "operator"}
