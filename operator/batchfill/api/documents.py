"""YAML files of BatchedModels, parsed within bounds (size, documents, alias expansion, nesting), with field-named
errors.

The bounds hold while the file is parsed, not after: the composer counts every value as it builds the node graph
(an alias counts as the values it stands for) and stops at the first value over a bound, so no input makes the
parser, the constructor, validation or an error message walk more than :data:`MAX_EXPANDED_VALUES` values or
recurse deeper than :data:`MAX_NESTING`. The events come from libyaml when PyYAML has it (its C parser is some
ten times faster than the pure-Python one, which takes seconds over a 1 MiB file); the composer is PyYAML's own
Python one in both cases, because PyYAML's C composer has no hook to count values as it builds the graph.
"""

from __future__ import annotations

from typing import Any

import yaml
import yaml.reader
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent
from yaml.nodes import Node
from yaml.resolver import Resolver

from batchfill.api.errors import Problem, SpecError

#: Bounds of a file of BatchedModels: its size, how many documents it holds, and what all of them together expand
#: to. YAML aliases let a few hundred bytes stand for billions of values
#: (https://en.wikipedia.org/wiki/Billion_laughs_attack): PyYAML shares the aliased objects, but anything that walks
#: the document (validation, an error message) expands them. The largest spec the CRD admits has about 3,000
#: values (tests/unit/test_crd.py builds it), so 100,000 leaves room for a file of many models.
MAX_DOCUMENT_BYTES = 1 << 20
MAX_DOCUMENTS = 100
MAX_EXPANDED_VALUES = 100_000
MAX_NESTING = 64

_Events: type
if getattr(yaml, "__with_libyaml__", False):
    from yaml._yaml import CParser as _Events
else:  # pragma: no cover - PyYAML's wheels ship libyaml; a source build may lack it
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Events(Reader, Scanner, Parser):  # type: ignore[no-redef]
        """The pure-Python parser's parts, as PyYAML's SafeLoader combines them."""

        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


def too_big(size: int | None) -> SpecError:
    """The error for a file over :data:`MAX_DOCUMENT_BYTES` (``size``: its length in bytes, None when unknown: a
    pipe or a device, read only up to the bound)."""
    length = f"{size:,}" if size is not None else f"more than {MAX_DOCUMENT_BYTES:,}"
    bound = f"{MAX_DOCUMENT_BYTES:,} bytes a file of BatchedModels may have"
    return SpecError([Problem("(file)", f"is {length} bytes, over the {bound}")])


class _BoundedLoader(Composer, _Events, SafeConstructor, Resolver):  # type: ignore[misc]
    """PyYAML's safe loader whose composer counts values and nesting across every document of the stream.

    ``_anchored`` maps each anchor of the current document to the values and levels its node spans, so an alias
    counts as what it stands for without being walked; ``_open`` holds the anchors whose node is being composed
    (an alias to one of them is a recursive structure, which no expansion bound could ever cover).
    """

    def __init__(self, text: str) -> None:
        _Events.__init__(self, text)  # type: ignore[misc]  # (mypy knows _Events only as a type)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._values = 0
        self._depth = 0
        self._deepest = 0
        self._anchored: dict[str, tuple[int, int]] = {}
        self._open: set[str] = set()

    def _account(self, values: int, depth: int) -> None:
        self._values += values
        self._deepest = max(self._deepest, depth)
        if self._values > MAX_EXPANDED_VALUES:
            raise SpecError(
                [Problem("(document)", f"expands to more than {MAX_EXPANDED_VALUES:,} values (YAML aliases?)")]
            )
        if depth > MAX_NESTING:
            raise SpecError([Problem("(document)", f"nests deeper than {MAX_NESTING} levels")])

    def compose_document(self) -> Node | None:
        self._anchored.clear()  # anchors are per document (PyYAML's composer resets its own too)
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self._open:
                raise SpecError([Problem("(document)", f"alias *{event.anchor} refers to a value that contains it")])
            # an undefined alias is left to PyYAML's composer, which raises "found undefined alias"
            if event.anchor is not None and event.anchor in self.anchors:
                values, levels = self._anchored[event.anchor]
                self._account(values, self._depth + levels)
            return super().compose_node(parent, index)
        anchor = event.anchor if isinstance(event, NodeEvent) else None
        self._depth += 1
        self._account(1, self._depth)
        values_before, deepest_before = self._values - 1, self._deepest
        self._deepest = self._depth
        if anchor is not None and isinstance(event, CollectionStartEvent):
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open.discard(anchor)
            self._anchored[anchor] = (self._values - values_before, self._deepest - self._depth + 1)
        self._deepest = max(deepest_before, self._deepest)
        self._depth -= 1
        return node


def parse_documents(text: str) -> list[Any]:
    """All YAML documents of a file (empty documents dropped).

    Raises:
        SpecError: for YAML that does not parse, with the line and column; for a text over MAX_DOCUMENT_BYTES
            (UTF-8), more than MAX_DOCUMENTS documents, documents that together expand (aliases) to more than
            MAX_EXPANDED_VALUES values or nest deeper than MAX_NESTING, a recursive alias, or a scalar Python cannot
            convert (an integer of more than 4,300 digits).
    """
    size = len(text.encode("utf-8"))
    if size > MAX_DOCUMENT_BYTES:
        raise too_big(size)
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # the pure-Python reader checks the characters here
        docs: list[Any] = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            doc = loader.get_data()
            if doc is None:
                continue
            if len(docs) == MAX_DOCUMENTS:
                raise SpecError([Problem("(file)", f"holds more than {MAX_DOCUMENTS} YAML documents")])
            docs.append(doc)
        return docs
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        if isinstance(err, yaml.reader.ReaderError):  # no mark: a character YAML forbids, at a position
            where = f"character {err.position + 1}"
            code = ord(err.character) if isinstance(err.character, str) else err.character  # libyaml: an int
            problem: str = f"{err.reason} (#x{code:04x})" if isinstance(code, int) else str(err.reason)
        else:
            problem = getattr(err, "problem", None) or str(err)
        one_line = " ".join(problem.split())  # PyYAML's own messages span lines; an error is one line
        raise SpecError([Problem(where, f"YAML does not parse: {one_line}")]) from None
    except SpecError:
        raise
    except (ValueError, OverflowError) as err:  # int() of 5,000 digits, a date out of range, ...
        raise SpecError([Problem("(document)", f"YAML value cannot be read: {err}")]) from None
    finally:
        if loader is not None:
            loader.dispose()
