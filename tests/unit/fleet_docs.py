"""Fleets of seed-example BatchedModels for the placement and fleet-simulation CLI tests."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SEED: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())


def named(name: str) -> dict[str, Any]:
    """The seed example as a BatchedModel and a Triton model both called ``name``."""
    doc = copy.deepcopy(SEED)
    doc["metadata"]["name"] = name
    doc["spec"]["model"]["name"] = name
    return doc


def fleet_file(path: Path, names: Iterable[str]) -> Path:
    """``path`` written as one multi-document YAML file of :func:`named` models."""
    path.write_text(yaml.safe_dump_all([named(n) for n in names]))
    return path
