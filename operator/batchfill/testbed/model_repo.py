"""Lay out a Triton model repository on local disk from the example models shipped in the package.

A Triton model repository is ``<repo>/<model name>/config.pbtxt`` plus
``<repo>/<model name>/<version>/model.py`` for the Python backend. The ``config.pbtxt`` text comes from the
caller (normally ``batchfill.render.render_model_config``); the ``model.py`` is copied from
``batchfill/examples_data/models``.
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
from pathlib import Path

#: Example Python-backend models shipped in ``batchfill/examples_data/models/<name>/model.py``.
EXAMPLE_MODELS = ("sleep_model", "ocr_model", "ocr_recognizer")


def example_model_file(example: str) -> Path:
    """Path of the shipped ``model.py`` of ``example`` (one of :data:`EXAMPLE_MODELS`)."""
    if example not in EXAMPLE_MODELS:
        raise ValueError(f"unknown example model {example!r}; known: {', '.join(EXAMPLE_MODELS)}")
    res = importlib.resources.files("batchfill").joinpath("examples_data", "models", example, "model.py")
    path = Path(str(res))
    if not path.is_file():  # a zipped install would need as_file(); batchfill installs as files
        raise FileNotFoundError(f"{path} is missing: is batchfill installed with its package data?")
    return path


def write_model(
    repository: str | os.PathLike[str],
    model_name: str,
    config_pbtxt: str,
    example: str,
    *,
    version: int = 1,
    replace: bool = True,
) -> Path:
    """Write ``<repository>/<model_name>/config.pbtxt`` and ``<.../<version>/model.py`` (from ``example``).

    Returns the model directory. With ``replace`` an existing model directory is removed first, so a stale
    version directory cannot survive; otherwise an existing directory is an error.
    """
    if not model_name or "/" in model_name or model_name in (".", ".."):
        raise ValueError(f"invalid model name {model_name!r}")
    if version < 1:
        raise ValueError(f"model version must be >= 1, got {version}")
    src = example_model_file(example)
    model_dir = Path(repository) / model_name
    if model_dir.exists():
        if not replace:
            raise FileExistsError(f"{model_dir} already exists")
        shutil.rmtree(model_dir)
    (model_dir / str(version)).mkdir(parents=True)
    text = config_pbtxt if config_pbtxt.endswith("\n") else config_pbtxt + "\n"
    (model_dir / "config.pbtxt").write_text(text)
    shutil.copyfile(src, model_dir / str(version) / "model.py")
    return model_dir
