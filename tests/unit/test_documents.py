"""Bounded YAML files (batchfill.api.documents): every bound holds while the file is parsed, with libyaml's parser
and with PyYAML's pure-Python one (a PyYAML built without libyaml)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from types import ModuleType

import pytest
import yaml

from batchfill.api import documents
from batchfill.api.errors import SpecError


@pytest.fixture(params=["libyaml", "python"])
def docs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    if request.param == "python":
        monkeypatch.setattr(yaml, "__with_libyaml__", False)
    elif not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml")
    module = importlib.reload(documents)
    try:
        yield module
    finally:
        monkeypatch.undo()
        importlib.reload(documents)


def _refusal(module: ModuleType, text: str) -> str:
    with pytest.raises(SpecError) as info:
        module.parse_documents(text)
    assert len(info.value.problems) == 1
    return str(info.value.problems[0])


def _bomb(width: int, levels: int) -> str:
    lines = [f"a0: &a0 [{','.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_the_parser_in_use(docs: ModuleType) -> None:
    names = {cls.__module__ for cls in docs._BoundedLoader.__mro__}
    assert ("yaml._yaml" in names) == bool(yaml.__with_libyaml__)


def test_documents_parse_as_pyyamls_safe_loader_reads_them(docs: ModuleType) -> None:
    text = (
        "a: &x {b: [1, 2.5, .nan, null, true, '3']}\nc: *x\n<<: {d: 1}\n---\n---\n- 2001-12-14\n- !!binary aGk=\n"
        "---\n? [1, 2]\n"
    )
    with pytest.raises(SpecError, match="YAML does not parse: found unhashable key"):
        docs.parse_documents(text)
    text = text[: text.index("---\n? ")]
    got, want = docs.parse_documents(text), [d for d in yaml.safe_load_all(text) if d is not None]
    assert repr(got) == repr(want)  # repr: NaN != NaN
    assert got[0]["c"] is got[0]["a"]  # an alias is the same object, as PyYAML makes it


def test_values_are_counted_across_the_documents_of_a_file(docs: ModuleType) -> None:
    """Each document expands to under the bound, the two together to over it (6,000 such documents took 200 s when
    each was counted alone, after the whole file was built)."""
    one = _bomb(9, 5)  # 1 + 5 keys + 9**5 + ... + 9 values: 66,436
    assert len(docs.parse_documents(one)) == 1
    assert "expands to more than 100,000 values" in _refusal(docs, one + "---\n" + one)


@pytest.mark.parametrize(("aliases", "accepted"), [(98, True), (99, False)])
def test_an_alias_counts_exactly_the_values_it_stands_for(docs: ModuleType, aliases: int, accepted: bool) -> None:
    # the mapping, its two keys and two lists, 999 scalars under a, and each alias of a: 4 + 1,000 x (1 + aliases)
    text = "a: &a [" + ",".join(["1"] * 999) + "]\nb: [" + ",".join(["*a"] * aliases) + "]"
    if accepted:
        assert len(docs.parse_documents(text)[0]["b"]) == aliases  # 99,004 values
    else:
        assert "expands to more than 100,000 values" in _refusal(docs, text)  # 100,004


def test_an_alias_counts_the_levels_it_stands_for(docs: ModuleType) -> None:
    deep = "a: &a " + "[" * 40 + "1" + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30
    assert "nests deeper than 64 levels" in _refusal(docs, deep)
    assert docs.parse_documents(deep.replace("[" * 30, "[" * 20).replace("]" * 30, "]" * 20))


def test_a_recursive_alias_is_refused_by_name(docs: ModuleType) -> None:
    assert _refusal(docs, "a: &a [1, *a]") == "(document): alias *a refers to a value that contains it"
    assert _refusal(docs, "a: &r {b: {c: *r}}") == "(document): alias *r refers to a value that contains it"
    assert docs.parse_documents("a: &a [1]\nb: [*a, *a]") == [{"a": [1], "b": [[1], [1]]}]


def test_a_big_flat_file_is_refused_at_the_bound(docs: ModuleType) -> None:
    """A 1 MiB list of 500,000 values: the composer stops at the bound (the whole list took 13 s to build before it
    was refused). CPU time, and bounds far above the 0.9 s (libyaml) and 4.7 s (pure Python) it takes on an idle
    machine: on a shared one a busy neighbour slows even CPU time (over 2 s seen with libyaml), and the bound is there
    to tell "stopped at the bound" from "built the whole list", not to time the parser."""
    start = time.process_time()
    assert "expands to more than 100,000 values" in _refusal(docs, "[" + "1," * 500_000 + "1]")
    assert time.process_time() - start < (6 if docs._Events.__module__ == "yaml._yaml" else 30)


def test_at_most_max_documents(docs: ModuleType) -> None:
    assert len(docs.parse_documents("--- {a: 1}\n" * docs.MAX_DOCUMENTS + "---\n" * 50)) == docs.MAX_DOCUMENTS
    assert _refusal(docs, "--- {a: 1}\n" * (docs.MAX_DOCUMENTS + 1)) == "(file): holds more than 100 YAML documents"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: " + "1" * 5000, "(document): YAML value cannot be read: Exceeds the limit (4300 digits)"),
        ("a: 2001-13-45", "(document): YAML value cannot be read: month must be in 1..12"),
        ("a: \x07", "characters are not allowed (#x0007)"),
        ("a: *nowhere", "line 1, column 4: YAML does not parse: found undefined alias"),
        ("a: !!python/object/apply:os.system [true]", "YAML does not parse: could not determine a constructor"),
    ],
    ids=["big-int", "bad-date", "control-char", "undefined-alias", "python-tag"],
)
def test_values_python_cannot_read_are_one_line_problems(docs: ModuleType, text: str, expected: str) -> None:
    problem = _refusal(docs, text)
    assert expected in problem
    assert "\n" not in problem


def test_the_size_bound_counts_utf8_bytes(docs: ModuleType) -> None:
    text = "# " + "é" * (docs.MAX_DOCUMENT_BYTES // 2)
    assert _refusal(docs, text) == (
        "(file): is 1,048,578 bytes, over the 1,048,576 bytes a file of BatchedModels may have"
    )
    assert str(docs.too_big(None).problems[0]).startswith("(file): is more than 1,048,576 bytes, over the")
