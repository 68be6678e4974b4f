"""YAML files of BatchedModels, parsed within bounds (size, alias expansion, nesting), with field-named errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from batchfill.api.errors import Problem, SpecError

#: Bounds of a file of BatchedModels: its size, and what its documents expand to. YAML aliases let a few hundred
#: bytes stand for billions of values (https://en.wikipedia.org/wiki/Billion_laughs_attack): PyYAML shares the
#: aliased objects, but anything that walks the document (validation, an error message) expands them.
MAX_DOCUMENT_BYTES = 1 << 20
MAX_EXPANDED_VALUES = 100_000
MAX_NESTING = 64


def _check_expansion(doc: Any) -> None:
    """Raise SpecError when ``doc``, with every alias expanded, holds more than MAX_EXPANDED_VALUES values or nests
    deeper than MAX_NESTING; stops counting at the bound, so the check itself is bounded."""
    count, stack = 0, [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_EXPANDED_VALUES:
            raise SpecError(
                [Problem("(document)", f"expands to more than {MAX_EXPANDED_VALUES:,} values (YAML aliases?)")]
            )
        if depth > MAX_NESTING:
            raise SpecError([Problem("(document)", f"nests deeper than {MAX_NESTING} levels")])
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1) for kv in value.items() for v in kv)
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def parse_documents(text: str) -> list[Any]:
    """All YAML documents of a file (empty documents dropped).

    Raises:
        SpecError: for YAML that does not parse, with the line and column; for a text over MAX_DOCUMENT_BYTES, or
            documents that expand (aliases) to more than MAX_EXPANDED_VALUES values or nest deeper than MAX_NESTING.
    """
    size = len(text.encode("utf-8"))
    if size > MAX_DOCUMENT_BYTES:
        raise SpecError(
            [
                Problem(
                    "(file)",
                    f"is {size:,} bytes, over the {MAX_DOCUMENT_BYTES:,} bytes a file of BatchedModels may have",
                )
            ]
        )
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
        for doc in docs:
            _check_expansion(doc)
        return docs
    except RecursionError:
        raise SpecError([Problem("(document)", "YAML nests too deeply to be a BatchedModel")]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError([Problem(where, f"YAML does not parse: {problem}")]) from None
