"""Hypothesis strategies for bad BatchedModel input ("Bad input"): near-valid specs with a few mutations.

Every spec starts from a valid one (``examples/seed-example.yaml``'s spec, or a richer variant of it with every
optional section filled in) and gets zero to four mutations: a value of the wrong type, a negative, zero, huge or
tiny number (1e308, -0.0, 2**63, 5e-324), a missing field, an unknown field, a very long string (up to 1 MB, at
most one per spec), a list emptied, reversed, with an entry duplicated or dropped, a section replaced by junk.
So most specs are one or two steps from a valid one, where the operator's checks have to be exact.

``json_only=True`` (the API path) draws only what JSON can carry: no NaN or infinities, string keys. Without it,
NaN and infinities appear too (YAML's ``.nan``/``.inf`` reach ``batchfill plan``).

:func:`sample_specs` gives a fixed list of specs from the same strategy for tests that cannot be ``@given``
(one real API server and operator for all of them).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
SEED_SPEC: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())["spec"]

#: The seed spec with every optional section filled in with valid values (it plans too).
RICH_SPEC: dict[str, Any] = {
    **copy.deepcopy(SEED_SPEC),
    "model": {
        **copy.deepcopy(SEED_SPEC["model"]),
        "stateful": False,
        "sequenceStrategy": "Oldest",
        "repository": {"pvc": {"claimName": "models", "path": "repo"}},
    },
    "batching": {
        "maxBatchSize": 8,
        "preferredBatchSizes": [4, 8],
        "maxQueueDelayMicroseconds": 5000,
        "instancesPerGpu": 1,
        "safetyMarginPercent": 5,
    },
    "profiling": {"source": "Declared", "tolerancePercent": 15, "replanIntervalSeconds": 900, "minExecutions": 100},
    "scaling": {
        "minReplicas": 1,
        "maxReplicas": 2,
        "targetUtilization": 0.85,
        "scaleDownStabilizationSeconds": 300,
        "mode": "Advise",
    },
    "triton": {
        "gpusPerReplica": 1,
        "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "args": ["--log-verbose=0"],
    },
}

#: Lengths of long strings. 1 MiB is the largest: the API server's request limit is 3 MiB, etcd's 1.5 MiB.
LONG = (128, 129, 253, 254, 4096, 4097, 70_000, 1 << 20)
MIB = 1 << 20
#: Numbers around the schema's bounds and far beyond them. All JSON-representable.
NUMBERS: tuple[int | float, ...] = (
    0,
    -0.0,
    -1,
    -0.001,
    0.5,
    1,
    1.5,
    7,
    16,
    60,
    100,
    5e-324,
    1e-300,
    1e308,
    -1e308,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    2**64,
    10**30,
    65_536,
    65_537,
    10_000,
    10_001,
    3_600_000,
    3_600_000.5,
    3_600_000_001,
)
STRINGS = ("", " ", "abc", "100", "1e3", "-5", "NaN", "Infinity", "ü名", "a b/c", "../..", "s3://", "TYPE_FP32", "Auto")
JUNK: tuple[Any, ...] = (None, True, False, [], {}, [1, 2], {"a": 1}, [None], [{}])
UNKNOWN_KEYS = ("description", "extra", "latencyp99ms", "Name", "batch_size", "spec", "x-y.z", "status", "")
NON_FINITE = (math.nan, math.inf, -math.inf)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every location in ``node`` (dict keys and list indices), parents before children; the root excluded."""
    items: Any = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def scalars(json_only: bool) -> st.SearchStrategy[Any]:
    """Any leaf value a sloppy or hostile spec might hold."""
    numbers = st.one_of(
        st.sampled_from(NUMBERS),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=not json_only, allow_infinity=not json_only),
    )
    options = [numbers, st.sampled_from(STRINGS), st.sampled_from(JUNK), st.text(max_size=8)]
    if not json_only:
        options.append(st.sampled_from(NON_FINITE))
    return st.one_of(*options)


def _scalar(draw: st.DrawFn, json_only: bool) -> Any:
    return copy.deepcopy(draw(scalars(json_only)))  # a copy: later mutations must not edit JUNK itself


def long_string(draw: st.DrawFn, budget: list[int]) -> str:
    """A long string; only one 1 MiB string per spec (``budget`` holds the MiB strings still allowed)."""
    n: int = draw(st.sampled_from(LONG if budget[0] > 0 else LONG[:-1]))
    if n >= MIB:
        budget[0] -= 1
    char: str = draw(st.sampled_from("abX-_."))
    return char * n


def _pick(draw: st.DrawFn, spec: dict[str, Any], paths: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A location: a section of the spec first (each equally likely), then a place in it."""
    section = draw(st.sampled_from(sorted(spec, key=str)))
    return draw(st.sampled_from([p for p in paths if p[0] == section]))


@st.composite
def _mutate(draw: st.DrawFn, spec: dict[str, Any], json_only: bool, budget: list[int]) -> None:
    """One mutation of ``spec`` in place."""
    paths = list(_paths(spec))
    op = draw(st.sampled_from(("replace", "replace", "delete", "unknown", "list", "long", "swap")))
    if not paths:
        op = "unknown"
    if op == "unknown":  # an unknown field in some object
        objects = [()] + [p for p in paths if isinstance(_parent(spec, (*p, None)), dict)]
        where = draw(st.sampled_from(objects))
        target = _parent(spec, (*where, None))
        key = draw(st.sampled_from(UNKNOWN_KEYS))
        target[key] = long_string(draw, budget) if draw(st.integers(0, 4)) == 0 else _scalar(draw, json_only)
        return
    if op == "list":
        lists = [p for p in paths if isinstance(_parent(spec, (*p, None)), list)]
        if lists:
            items: list[Any] = _parent(spec, (*draw(st.sampled_from(lists)), None))
            how = draw(st.sampled_from(("empty", "reverse", "dup-first", "dup-last", "drop", "many")))
            if how == "empty":
                items.clear()
            elif how == "reverse":
                items.reverse()
            elif how == "dup-first" and items:
                items.insert(1, copy.deepcopy(items[0]))
            elif how == "dup-last" and items:
                items.append(copy.deepcopy(items[-1]))
            elif how == "drop" and items:
                del items[draw(st.integers(0, len(items) - 1))]
            elif how == "many" and items:
                items.extend(copy.deepcopy(items[-1]) for _ in range(draw(st.sampled_from((16, 64, 65)))))
            return
        op = "replace"
    path = _pick(draw, spec, paths)
    parent, key = _parent(spec, path), path[-1]
    if op == "delete":
        del parent[key]
    elif op == "long":
        parent[key] = long_string(draw, budget)
    elif op == "swap":  # another field's (valid) value: a plausible-looking wrong type or range
        other = _pick(draw, spec, paths)
        parent[key] = copy.deepcopy(_parent(spec, other)[other[-1]])
    else:
        parent[key] = _scalar(draw, json_only)


@st.composite
def fuzzed_specs(
    draw: st.DrawFn, json_only: bool = True, max_mutations: int = 4, deployable: bool = False
) -> dict[str, Any]:
    """A BatchedModel ``spec``: a valid base and 0..``max_mutations`` mutations (mostly 1 or 2; none 1 in 10).

    ``deployable``: the spec keeps a model repository (a PVC ``models``) whatever the mutations did to it, as a
    spec needs one to be deployed (examples/seed-example.yaml has none: it is meant for ``batchfill plan``).
    """
    spec: dict[str, Any] = copy.deepcopy(draw(st.sampled_from((SEED_SPEC, RICH_SPEC))))
    if deployable or draw(st.booleans()):
        spec["model"].setdefault("repository", {"pvc": {"claimName": "models"}})
    n = min(max_mutations, draw(st.sampled_from((1, 1, 1, 1, 2, 2, 2, 3, 4, 0))))
    budget = [1]  # at most one 1 MiB string per spec
    for _ in range(n):
        draw(_mutate(spec, json_only, budget))
    if deployable and isinstance(spec.get("model"), dict) and "repository" not in spec["model"]:
        spec["model"]["repository"] = {"pvc": {"claimName": "models"}}
    return spec


def sample_specs(
    n: int, *, json_only: bool = True, deployable: bool = False, max_mutations: int = 4
) -> list[dict[str, Any]]:
    """``n`` distinct specs from :func:`fuzzed_specs`, the same ones on every run (derandomized)."""
    out: dict[str, dict[str, Any]] = {}

    @settings(
        max_examples=n * 4,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzzed_specs(json_only=json_only, deployable=deployable, max_mutations=max_mutations))
    def collect(spec: dict[str, Any]) -> None:
        if len(out) < n:
            out.setdefault(repr(spec), spec)

    collect()
    return list(out.values())


def numbers(value: Any) -> Iterator[float]:
    """Every number inside a JSON-like value (booleans are not numbers here)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from numbers(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from numbers(v)
