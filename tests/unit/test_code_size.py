"""Small modules with one job each: no module of the package over 500 lines and no function over 80, unless its
docstring (the module's, or the function's) says why, in a paragraph that starts "Long because"."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "batchfill"
MODULE_LINES_MAX = 500
FUNCTION_LINES_MAX = 80
MARKER = "Long because"


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "examples_data" not in p.parts)


def test_every_long_module_says_why() -> None:
    long = []
    for path in _modules():
        text = path.read_text()
        if text.count("\n") > MODULE_LINES_MAX and MARKER not in (ast.get_docstring(ast.parse(text)) or ""):
            long.append(f"{path.relative_to(PACKAGE)}: {text.count(chr(10))} lines")
    assert not long, f"modules over {MODULE_LINES_MAX} lines without '{MARKER}' in their docstring: {long}"


def test_every_long_function_says_why() -> None:
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > FUNCTION_LINES_MAX and MARKER not in (ast.get_docstring(node) or ""):
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {FUNCTION_LINES_MAX} lines without '{MARKER}' in their docstring: {long}"
