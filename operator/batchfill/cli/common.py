"""What the commands share: exit codes, one-line errors, reading a BatchedModel file, naming a missing extra.

cli/main.py imports this module to build the parser, so it imports nothing beyond the standard library at module
level: rich, pydantic and numpy load only inside the functions that need them (`batchfill --help` stays fast).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from batchfill.api.errors import SpecError
    from batchfill.api.spec import BatchedModel

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

#: `batchfill simulate --trace` choices; cli/simulate.py builds each from batchfill.sim.traces.
TRACES = ("diurnal", "bursty", "spike", "step", "replay")
#: `batchfill simulate --policies` names, in batchfill.compare.run.POLICIES's order. Repeated here because that
#: module imports numpy and the simulator, which building the parser must not; tests/unit/test_cli.py checks that
#: both are equal.
POLICIES = ("batchfill", "hpa-gpu", "keda-rps", "keda-queue", "static-peak")

#: Optional dependencies (pyproject.toml, [project.optional-dependencies]) -> the top-level modules of theirs that
#: the commands needing them import (pytriton: the `nvidia-pytriton` wheel, which ships tritonserver).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "simulate": ("matplotlib",),
    "testbed": ("pytriton", "onnxruntime"),
}


def err_line(console: Console, line: str) -> None:
    """Print ``line`` as is: no rich markup, no highlighting, no wrapping (one problem, one line)."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def missing_extra(command: str, extra: str) -> str | None:
    """The one line to print when a module of ``extra`` cannot be imported, or None when all of them can.

    Looks the modules up without importing them (a module set to None in ``sys.modules`` counts as missing,
    as it does for ``import``). ``extra`` is a key of :data:`EXTRA_MODULES`; raises KeyError for another.
    """
    missing = [name for name in EXTRA_MODULES[extra] if not _importable(name)]
    if not missing:
        return None
    return f"batchfill {command} needs {', '.join(missing)} (the '{extra}' extra): pip install 'batchfill[{extra}]'"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken package, or one whose module has no __spec__
        return False


def read_text(path: str) -> str:
    """The file's text (``-``: standard input), read only up to the size a file of BatchedModels may have (so
    ``/dev/zero``, or a pipe that never ends, is refused at the bound instead of filling memory).

    Raises:
        OSError: the file cannot be read.
        SpecError: a file over batchfill.api.documents.MAX_DOCUMENT_BYTES, or bytes that are not UTF-8 (YAML is
            text).
    """
    import os
    import stat

    from batchfill.api.documents import MAX_DOCUMENT_BYTES, too_big
    from batchfill.api.errors import Problem, SpecError

    if path == "-":
        data = sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1)
        size = None
    else:
        with Path(path).open("rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
            info = os.fstat(f.fileno())
            size = info.st_size if stat.S_ISREG(info.st_mode) else None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise too_big(size if size is not None and size > MAX_DOCUMENT_BYTES else None)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError([Problem("(file)", f"is not UTF-8 text (byte {e.start}): not a YAML document")]) from None


def one_model(path: str, command: str, err: Console) -> BatchedModel | int:
    """The single BatchedModel of ``path``, or the exit code after printing why (one line per problem)."""
    from batchfill.api.documents import parse_documents
    from batchfill.api.errors import SpecError
    from batchfill.api.validate import load_model

    try:
        docs = parse_documents(read_text(path))
        if len(docs) != 1:
            err_line(err, f"{path}: `batchfill {command}` takes one BatchedModel, found {len(docs)} documents")
            return EXIT_USAGE
        return load_model(docs[0])
    except (OSError, SpecError) as e:
        return input_error(path, e, err)


def input_error(path: str, e: OSError | SpecError, err: Console) -> int:
    """Print why the input file ``path`` cannot be used (one line per problem); returns :data:`EXIT_USAGE`."""
    if isinstance(e, OSError):
        err_line(err, f"{path}: cannot read: {e.strerror or e}")
    else:
        for p in e.problems:
            err_line(err, f"{path}: {p}")
    return EXIT_USAGE
