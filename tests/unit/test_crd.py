"""The generated BatchedModel CRD: structural, committed YAML up to date, in agreement with pydantic."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml
from pydantic import BaseModel, Field

from batchfill.api import crd as crd_module
from batchfill.api.crd import (
    REGENERATE_COMMAND,
    CRDSchemaError,
    build_crd,
    render_crd_yaml,
    structural_schema,
)
from batchfill.api.spec import (
    DEFAULT_TRITON_IMAGE,
    PRINTABLE,
    QUALIFIED_NAME_MAX,
    QUANTITY_MAX,
    SPEC_BYTES_MAX,
    BatchedModelSpec,
)
from batchfill.api.status import BatchedModelStatus, Condition, ObservedStatus, PlanStatus, SeedRule

from .conftest import CASES_DOC, SEED_DOC

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / "batchedmodel.yaml"

Schema = dict[str, Any]


# --------------------------------------------------------------------------------------------- helpers


def root_schema() -> Schema:
    schema: Schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def node_at(path: str) -> Schema:
    """``spec.model.inputs[].dims`` -> that node of the CRD schema (``[]`` steps into items)."""
    node = root_schema()
    for part in re.findall(r"[^.\[\]]+|\[\]", path):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def walk(node: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node with its path (``.*`` for map values, ``[]`` for list items)."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


def apply_defaults(value: Any, schema: Schema) -> Any:
    """The API server's defaulting: missing properties get their default, then defaulting recurses."""
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
        for name, child in value.items():
            if name in schema.get("properties", {}):
                apply_defaults(child, schema["properties"][name])
            elif isinstance(schema.get("additionalProperties"), dict):
                apply_defaults(child, schema["additionalProperties"])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            apply_defaults(item, schema["items"])
    return value


def errors(value: Any, schema: Schema, path: str = "") -> list[str]:  # noqa: C901 (a flat list of independent schema checks)
    """A small OpenAPI v3 validator for the subset the CRD uses (CEL rules are not evaluated)."""
    here = path or "<root>"
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, int | str) and not isinstance(value, bool)
        return [] if ok else [f"{here}: {value!r} is neither integer nor string"]
    type_ok = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
    }
    kind = schema.get("type")
    if kind is None:
        return []  # preserve-unknown-fields without a type: anything goes
    if not type_ok[kind](value):
        return [f"{here}: {value!r} is not of type {kind}"]
    out: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{here}: {value!r} not in {schema['enum']}")
    if "minimum" in schema:
        low = schema["minimum"]
        if value < low or (schema.get("exclusiveMinimum") and value == low):
            out.append(f"{here}: {value!r} below minimum {low}")
    if "maximum" in schema:
        high = schema["maximum"]
        if value > high or (schema.get("exclusiveMaximum") and value == high):
            out.append(f"{here}: {value!r} above maximum {high}")
    if kind == "string":
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            out.append(f"{here}: length {len(value)} out of bounds")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{here}: {value!r} does not match {schema['pattern']}")
    if kind == "array":
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            out.append(f"{here}: {len(value)} items out of bounds")
        for i, item in enumerate(value):
            out += errors(item, schema["items"], f"{path}[{i}]")
    if kind == "object":
        props = schema.get("properties", {})
        out += [f"{here}.{name}: required" for name in schema.get("required", []) if name not in value]
        for name, child in value.items():
            where = f"{path}.{name}" if path else name
            if name in props:
                out += errors(child, props[name], where)
            elif isinstance(schema.get("additionalProperties"), dict):
                out += errors(child, schema["additionalProperties"], where)
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and path != "metadata":
                # (the API server validates ObjectMeta itself and never prunes it)
                out.append(f"{where}: unknown field (the API server would prune it)")
    return out


def crd_accepts(doc: dict[str, Any]) -> list[str]:
    return errors(apply_defaults(copy.deepcopy(doc), root_schema()), root_schema())


# ------------------------------------------------------------------------------------ the committed file


def test_committed_crd_matches_the_generator() -> None:
    assert COMMITTED.exists(), f"crds/batchedmodel.yaml is missing; generate it with: {REGENERATE_COMMAND}"
    committed = COMMITTED.read_text(encoding="utf-8")
    assert committed.rstrip("\n") == render_crd_yaml().rstrip("\n"), (
        f"crds/batchedmodel.yaml is out of date with batchfill.api; regenerate it with: {REGENERATE_COMMAND}"
    )


def test_generator_is_deterministic_and_the_yaml_is_the_dict() -> None:
    text = render_crd_yaml()
    assert text == render_crd_yaml()
    assert build_crd() == build_crd()
    assert yaml.safe_load(text) == build_crd()
    assert text.startswith("# Generated by `batchfill crd`")
    assert "&id" not in text, "no YAML anchors/aliases: every node is spelled out"
    assert "*id" not in text


def test_build_crd_returns_fresh_objects() -> None:
    first = build_crd()
    first["spec"]["versions"][0]["additionalPrinterColumns"].clear()
    first["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].clear()
    assert build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert node_at("spec.sla")["properties"]


# ------------------------------------------------------------------------------------- CRD metadata


def test_names_scope_and_version() -> None:
    crd = build_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "batchedmodels.batchfill.io"
    spec = crd["spec"]
    assert spec["group"] == "batchfill.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "BatchedModel",
        "listKind": "BatchedModelList",
        "plural": "batchedmodels",
        "singular": "batchedmodel",
        "shortNames": ["bm"],
        "categories": ["batchfill"],
    }
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)


def test_status_subresource_and_no_scale_subresource() -> None:
    # The Deployment owns replicas; a scale subresource would let `kubectl scale`/an HPA fight the operator.
    assert build_crd()["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"], c["type"]) for c in columns] == [
        ("SLA", ".spec.sla.latencyP99Ms", "number"),
        ("Replicas", ".status.replicas", "integer"),
        ("Desired", ".status.desiredReplicas", "integer"),
        ("Fill", ".status.observed.batchFill", "number"),
        ("Queue ms", ".status.observed.queueTimeMs", "number"),
        ("Placement", ".status.placement.mode", "string"),
        ("Pool", ".status.placement.pool", "string"),
        ("Ready", '.status.conditions[?(@.type=="Ready")].status', "string"),
        ("Progressing", '.status.conditions[?(@.type=="Progressing")].status', "string"),
        ("Age", ".metadata.creationTimestamp", "date"),
    ]
    assert columns[0]["description"] == "p99 SLA ms"
    # Every column's path exists in the schema with the column's type.
    for column, node in [
        (columns[0], node_at("spec.sla.latencyP99Ms")),
        (columns[1], node_at("status.replicas")),
        (columns[2], node_at("status.desiredReplicas")),
        (columns[3], node_at("status.observed.batchFill")),
        (columns[4], node_at("status.observed.queueTimeMs")),
        (columns[5], node_at("status.placement.mode")),
        (columns[6], node_at("status.placement.pool")),
        (columns[7], node_at("status.conditions[].status")),
    ]:
        assert node["type"] == column["type"], column["name"]


# --------------------------------------------------------------------------------- structural schema


def test_top_level_schema() -> None:
    root = root_schema()
    assert root["type"] == "object"
    assert root["required"] == ["spec"]
    assert list(root["properties"]) == ["apiVersion", "kind", "metadata", "spec", "status"]
    assert root["properties"]["metadata"] == {"type": "object"}
    assert root["properties"]["apiVersion"]["type"] == root["properties"]["kind"]["type"] == "string"
    assert root["properties"]["spec"]["required"] == ["model", "sla"]
    assert "required" not in root["properties"]["status"]


FORBIDDEN = ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "nullable", "uniqueItems", "const")


def test_schema_is_structural() -> None:
    nodes = list(walk(root_schema()))
    assert len(nodes) > 100
    for path, node in nodes:
        for key in FORBIDDEN:
            assert key not in node, f"{path}: {key} is not allowed in a structural schema"
        marked = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        assert "type" in node or marked, f"{path}: no type"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
        if "additionalProperties" in node:
            assert isinstance(node["additionalProperties"], dict), f"{path}: additionalProperties must be a schema"
            assert "properties" not in node, f"{path}: properties and additionalProperties together"
        if "default" in node:
            assert node["default"] is not None, f"{path}: null default"
        if node.get("type") == "array":
            assert "items" in node, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True, f"{path}: OpenAPI v3 form"
            assert "minimum" in node, path
        for name in node.get("required", []):
            assert name in node["properties"], f"{path}: required {name} is not a property"


def test_types_translated() -> None:
    assert node_at("spec.sla.latencyP99Ms") == {
        "description": "End-to-end p99 latency the service promises, in milliseconds.",
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 3_600_000,
    }
    assert node_at("spec.scaling.targetUtilization")["exclusiveMinimum"] is True
    assert node_at("spec.scaling.minReplicas")["type"] == "integer"
    # `X | None` is a plain X, optional because it is not required.
    assert node_at("spec.batching.maxBatchSize")["type"] == "integer"
    assert "maxBatchSize" not in node_at("spec.batching").get("required", [])
    assert node_at("status.replicas") == {"type": "integer", "minimum": 0}
    # Enums come through $defs.
    assert node_at("spec.scaling.mode")["enum"] == ["Auto", "Advise", "Off"]
    assert node_at("spec.scaling.mode")["default"] == "Auto"
    assert "TYPE_FP32" in node_at("spec.model.inputs[].dataType")["enum"]
    assert node_at("status.conditions[].status")["enum"] == ["True", "False", "Unknown"]
    # Maps (bounded: their key lengths as CEL rules), int-or-string quantities, typed tolerations.
    key_rule = {
        "message": "keys must be at least 1 and at most 317 characters",
        "rule": "self.all(k, size(k) >= 1 && size(k) <= 317)",
    }
    ascii_keys = {"message": "keys must be printable ASCII", "rule": "self.all(k, k.matches('^[ -~]*$'))"}
    assert node_at("spec.triton.nodeSelector") == {
        "description": "Node labels the Triton pods must run on.",
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": "^[ -~]*$"},
        "x-kubernetes-validations": [key_rule, ascii_keys],
    }
    for field in ("requests", "limits"):
        node = node_at(f"spec.triton.resources.{field}")
        assert node["additionalProperties"] == {"x-kubernetes-int-or-string": True}
        assert node["maxProperties"] == 16
        assert key_rule in node["x-kubernetes-validations"]
        assert ascii_keys in node["x-kubernetes-validations"]
    tolerations = node_at("spec.triton.tolerations[]")
    assert set(tolerations["properties"]) == {"key", "operator", "value", "effect", "tolerationSeconds"}
    assert "x-kubernetes-preserve-unknown-fields" not in tolerations


def test_descriptions_for_kubectl_explain() -> None:
    for name in ("latencyP99Ms", "networkOverheadMs"):
        assert node_at(f"spec.sla.{name}").get("description"), f"spec.sla.{name} has no description"
    for name in ("model", "sla", "profile", "batching", "scaling", "triton"):
        assert node_at(f"spec.{name}").get("description"), f"spec.{name} has no description"
    for path, node in walk(root_schema()):
        assert "``" not in node.get("description", ""), f"{path}: reST markup in a description"


# --------------------------------------------------------------------------------------------- CEL


EXPECTED_RULES: dict[str, list[str]] = {
    "spec.model": ["has(self.backend) != has(self.platform)"],
    "spec.model.repository": ["(has(self.pvc) ? 1 : 0) + (has(self.image) ? 1 : 0) + (has(self.uri) ? 1 : 0) == 1"],
    "spec.sla": ["!has(self.networkOverheadMs) || self.networkOverheadMs < self.latencyP99Ms"],
    "spec.profile": [
        "self.map(p, p.batchSize).isSorted() && self.all(p, self.exists_one(q, q.batchSize == p.batchSize))"
    ],
    "spec.batching": [
        "!has(self.preferredBatchSizes) || !has(self.maxBatchSize) || "
        "self.preferredBatchSizes.all(p, p <= self.maxBatchSize)",
        "!has(self.preferredBatchSizes) || size(self.preferredBatchSizes) == 0 || "
        "!has(self.maxBatchSize) || self.maxBatchSize > 0",
    ],
    "spec.scaling": [
        "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
        "!has(self.minReplicas) || self.minReplicas >= 1",
    ],
    "spec.placement": ["!has(self.mode) || self.mode == 'Dedicated' || has(self.pool)"],
    "spec.triton": [
        "!has(self.resources) || ((!has(self.resources.requests) || self.resources.requests.all(k, "
        "!k.startsWith('nvidia.com/') || k == (has(self.gpuResource) ? self.gpuResource : 'nvidia.com/gpu'))) && "
        "(!has(self.resources.limits) || self.resources.limits.all(k, !k.startsWith('nvidia.com/') || "
        "k == (has(self.gpuResource) ? self.gpuResource : 'nvidia.com/gpu'))))"
    ],
    # maps: the lengths of their keys (and of quantity strings), which a structural schema cannot bound otherwise,
    # and their keys' characters (printable ASCII, so kopf's escaped copy of the spec stays within its budget)
    "spec.triton.resources.requests": [
        "self.all(k, type(self[k]) != string || size(self[k]) <= 64)",
        "self.all(k, size(k) >= 1 && size(k) <= 317)",
        "self.all(k, k.matches('^[ -~]*$'))",
    ],
    "spec.triton.resources.limits": [
        "self.all(k, type(self[k]) != string || size(self[k]) <= 64)",
        "self.all(k, size(k) >= 1 && size(k) <= 317)",
        "self.all(k, k.matches('^[ -~]*$'))",
    ],
    "spec.triton.nodeSelector": [
        "self.all(k, size(k) >= 1 && size(k) <= 317)",
        "self.all(k, k.matches('^[ -~]*$'))",
    ],
}


def all_rules() -> dict[str, list[dict[str, Any]]]:
    return {
        path: node["x-kubernetes-validations"]
        for path, node in walk(root_schema())
        if "x-kubernetes-validations" in node
    }


def test_each_cel_rule_sits_at_its_node() -> None:
    found = {path: [r["rule"] for r in rules] for path, rules in all_rules().items()}
    assert found == EXPECTED_RULES
    for rules in all_rules().values():
        for rule in rules:
            assert set(rule) <= {"rule", "message", "fieldPath", "reason", "messageExpression"}
            assert rule["message"]


def test_cel_rules_name_only_fields_of_their_node() -> None:
    for path, rules in all_rules().items():
        node = node_at(path)
        for rule in rules:
            if "additionalProperties" in node:  # a map: rules range over its keys
                assert rule["rule"].startswith("self.all(k, "), rule
                continue
            if node["type"] == "array":
                # `self` is the list; fields are read from its items (`p.batchSize`).
                fields = set(re.findall(r"\b[pq]\.(\w+)", rule["rule"]))
                known = set(node["items"]["properties"])
            else:
                fields = set(re.findall(r"self\.(\w+)", rule["rule"]))
                known = set(node["properties"])
            assert fields, rule
            assert fields <= known, f"{path}: {rule['rule']!r} names {sorted(fields - known)}"
            if "fieldPath" in rule:
                assert rule["fieldPath"].lstrip(".") in node["properties"], f"{path}: {rule['fieldPath']}"


def _defaulted_nodes_with_rules(node: Any, path: str = "") -> Iterator[tuple[str, Any, list[str]]]:
    if isinstance(node, dict):
        if "default" in node and node.get("x-kubernetes-validations"):
            yield path, node["default"], [r["rule"] for r in node["x-kubernetes-validations"]]
        for key, value in node.items():
            yield from _defaulted_nodes_with_rules(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _defaulted_nodes_with_rules(value, f"{path}[{i}]")


@pytest.mark.parametrize("build", [build_crd, crd_module.build_pool_crd], ids=["BatchedModel", "GPUPool"])
def test_cel_rules_on_a_defaulted_object_guard_what_its_default_lacks(build: Any) -> None:
    """The API server evaluates each rule against the node's default as written, nested defaults not filled in.

    A rule on a ``default: {}`` object that reads ``self.mode`` unguarded makes the whole CRD invalid
    ("no such key: mode evaluating rule"), which only a real API server reports; so every field a rule reads
    that the default does not hold is read behind ``has(self.<field>)``.
    """
    found = list(_defaulted_nodes_with_rules(build()))
    assert found, "no defaulted object has a rule: the check checks nothing"
    for path, default, rules in found:
        for rule in rules:
            for name in set(re.findall(r"self\.(\w+)", rule)) - set(default):
                guard = rule.find(f"has(self.{name})")
                assert 0 <= guard <= rule.find(f"self.{name}"), (
                    f"{path}: {rule!r} reads self.{name}, which its default {default!r} lacks, without has()"
                )


def test_cel_cost_is_bounded() -> None:
    """The API server estimates a rule's cost from maxItems/maxLength; unbounded inputs get rejected."""
    for path, rules in all_rules().items():
        node = node_at(path)
        if node["type"] == "array":
            assert "maxItems" in node, f"{path}: a list with a CEL rule needs maxItems"
            continue
        if "additionalProperties" in node:
            assert "maxProperties" in node, f"{path}: a map with a CEL rule needs maxProperties"
            continue
        for rule in rules:
            text = re.sub(r"has\(self\.\w+\)", "", rule["rule"])  # has() is O(1) whatever the field
            for name in re.findall(r"self\.(\w+)", text):
                field = node["properties"][name]
                if field["type"] == "array":
                    assert "maxItems" in field, f"{path}.{name}: used in CEL, needs maxItems"
                if field["type"] == "string":
                    assert "maxLength" in field, f"{path}.{name}: used in CEL, needs maxLength"


# ----------------------------------------------------------------------------------------- defaults


def test_defaults_are_valid_under_their_own_schema() -> None:
    defaulted = [(path, node) for path, node in walk(root_schema()) if "default" in node]
    assert {path for path, node in defaulted if node["default"] == {}} == {
        "spec.batching",
        "spec.placement",
        "spec.profiling",
        "spec.scaling",
        "spec.triton",
        "spec.triton.resources",
    }
    for path, node in defaulted:
        value = apply_defaults(copy.deepcopy(node["default"]), node)
        assert errors(value, node, path) == [], path


def test_optional_objects_without_all_defaults_have_no_default() -> None:
    # `repository: {}` would break "exactly one source"; `plan`/`observed` are written by the operator.
    for path in ("spec.model.repository", "status.plan", "status.observed", "spec.profile"):
        assert "default" not in node_at(path), path


def test_crd_defaults_agree_with_pydantic_defaults() -> None:
    minimal = {"model": {"name": "m", "backend": "python"}, "sla": {"latencyP99Ms": 100}}
    by_crd = apply_defaults(copy.deepcopy(minimal), node_at("spec"))
    assert by_crd["scaling"]["maxReplicas"] == 16
    assert by_crd["triton"]["image"] == DEFAULT_TRITON_IMAGE
    assert BatchedModelSpec.model_validate(by_crd) == BatchedModelSpec.model_validate(minimal)


# ---------------------------------------------------------------- what users and the operator write


@pytest.mark.parametrize("doc", [SEED_DOC, CASES_DOC], ids=["seed", "cases"])
def test_example_documents_are_accepted(doc: dict[str, Any]) -> None:
    full = {"apiVersion": "batchfill.io/v1alpha1", "kind": "BatchedModel", **copy.deepcopy(doc)}
    assert crd_accepts(full) == []


def test_committed_examples_are_accepted() -> None:
    docs = [d for p in sorted((ROOT / "examples").rglob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    docs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "BatchedModel"]
    assert docs
    for doc in docs:
        assert crd_accepts(doc) == [], doc["metadata"]["name"]


def test_pydantic_dump_of_a_full_spec_is_accepted() -> None:
    spec = BatchedModelSpec.model_validate(
        {
            "model": {
                "name": "ocr",
                "backend": "python",
                "stateful": True,
                "sequenceStrategy": "Direct",
                "inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [-1, 3], "rank": 3}],
                "outputs": [{"name": "y", "dataType": "TYPE_FP32", "dims": [10]}],
                "batchInputs": [
                    {
                        "kind": "BATCH_ELEMENT_COUNT",
                        "targetName": "n",
                        "dataType": "TYPE_INT32",
                        "sourceInputs": ["x"],
                    }
                ],
                "repository": {"image": {"reference": "registry.example/models:1", "path": "/models"}},
            },
            "sla": {"latencyP99Ms": 50.5, "networkOverheadMs": 5},
            "profile": [{"batchSize": 1, "latencyMs": 3.5}, {"batchSize": 8, "latencyMs": 12}],
            "batching": {"maxBatchSize": 8, "preferredBatchSizes": [4, 8], "maxQueueDelayMicroseconds": 1000},
            "scaling": {"minReplicas": 1, "maxReplicas": 4, "targetUtilization": 0.7, "mode": "Advise"},
            "triton": {
                "gpusPerReplica": 0,
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": 2}},
                "nodeSelector": {"pool": "cpu"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "args": ["--log-verbose=1"],
            },
        }
    )
    dumped = spec.model_dump(mode="json", exclude_none=True)
    assert errors(apply_defaults(dumped, node_at("spec")), node_at("spec"), "spec") == []


def test_status_the_operator_writes_is_accepted() -> None:
    status = BatchedModelStatus(
        observedGeneration=2,
        conditions=[
            Condition(type="Ready", status="True", reason="Serving", lastTransitionTime="2025-01-01T00:00:00Z")
        ],
        plan=PlanStatus(
            maxBatchSize=8,
            preferredBatchSizes=[4, 8],
            maxQueueDelayMicroseconds=20_000,
            instanceCount=1,
            serverBudgetMs=90,
            capacityPerReplicaRps=140.5,
            predictedP99Ms=88.2,
            minClientTimeoutMs=80,
            rule="highest capacity at SLA",
            seedRule=SeedRule(maxBatchSize=8, maxQueueDelayMicroseconds=40_000, capacityPerReplicaRps=95.0),
        ),
        replicas=2,
        readyReplicas=1,
        desiredReplicas=3,
        lastScaleTime="2025-01-01T00:00:00Z",
        lastScaleReason="queue time near its budget",
        observed=ObservedStatus(requestRate=210.0, avgBatchSize=6.2, batchFill=0.78, queueTimeMs=11.0, p99Ms=70.1),
    )
    dumped = status.model_dump(mode="json", exclude_none=True)
    assert errors(apply_defaults(dumped, node_at("status")), node_at("status"), "status") == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.sla.latencyP99Ms", 0),
        ("spec.scaling.targetUtilization", 0),
        ("spec.scaling.mode", "Sometimes"),
        ("spec.model.name", "bad name"),
        ("spec.model.repository.uri", "http://x"),
        ("spec.batching.preferredBatchSizes", list(range(1, 40))),
        ("spec.triton.resources.limits.cpu", 1.5),
    ],
)
def test_schema_rejects(path: str, value: Any) -> None:
    doc: dict[str, Any] = {
        "apiVersion": "batchfill.io/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": "m"},
        "spec": {"model": {"name": "m", "backend": "python"}, "sla": {"latencyP99Ms": 100}},
    }
    *parents, leaf = path.split(".")
    target = doc
    for part in parents:
        target = target.setdefault(part, {})
    target[leaf] = value
    assert crd_accepts(doc), f"{path}={value!r} should be rejected"


# ---------------------------------------------------------------------------- the generator itself


class _Color(StrEnum):
    RED = "red"


class _Inner(BaseModel):
    level: int = Field(default=1, gt=0, lt=10)


class _Good(BaseModel):
    """Doc."""

    color: _Color | None = None
    inner: _Inner = Field(default_factory=_Inner)
    anything: dict[str, Any] = Field(default_factory=dict)
    quantity: Annotated[int | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})] = 1


def test_generator_on_a_small_model() -> None:
    assert structural_schema(_Good) == {
        "description": "Doc.",
        "type": "object",
        "properties": {
            "color": {"type": "string", "enum": ["red"]},
            "inner": {
                "type": "object",
                "default": {},
                "properties": {
                    "level": {
                        "type": "integer",
                        "default": 1,
                        "minimum": 0,
                        "exclusiveMinimum": True,
                        "maximum": 10,
                        "exclusiveMaximum": True,
                    }
                },
            },
            "anything": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "quantity": {"default": 1, "x-kubernetes-int-or-string": True},
        },
    }


class _Rules(BaseModel):
    model_config = {"json_schema_extra": {"x-kubernetes-validations": [{"rule": "inner", "message": "m"}]}}

    a: int = 0


class _RuleUser(BaseModel):
    rules: _Rules | None = Field(
        default=None, json_schema_extra={"x-kubernetes-validations": [{"rule": "outer", "message": "m"}]}
    )
    plain: _Rules = Field(
        default_factory=_Rules,
        json_schema_extra={"x-kubernetes-validations": [{"rule": "field", "message": "m"}]},
    )


def test_generator_keeps_the_rules_of_the_field_and_of_its_model() -> None:
    schema = structural_schema(_RuleUser)["properties"]
    assert [r["rule"] for r in schema["rules"]["x-kubernetes-validations"]] == ["inner", "outer"]
    assert [r["rule"] for r in schema["plain"]["x-kubernetes-validations"]] == ["inner", "field"]
    assert "default" not in schema["rules"]
    assert schema["plain"]["default"] == {}


class _Tree(BaseModel):
    children: list[_Tree] = Field(default_factory=list)


class _Union(BaseModel):
    value: int | str


class _Set(BaseModel):
    values: set[int]


@pytest.mark.parametrize(
    ("model", "message"),
    [(_Union, "non-null branches"), (_Set, "uniqueItems"), (_Tree, "recursive")],
)
def test_generator_refuses_what_a_crd_cannot_express(model: type[BaseModel], message: str) -> None:
    with pytest.raises(CRDSchemaError, match=message):
        structural_schema(model)


def test_crd_module_is_pure() -> None:
    source = Path(crd_module.__file__).read_text(encoding="utf-8")
    imports = set(re.findall(r"^(?:from|import) ([\w.]+)", source, flags=re.MULTILINE))
    assert imports <= {
        "__future__",
        "copy",
        "typing",
        "yaml",
        "pydantic",
        "batchfill.api.pool",
        "batchfill.api.spec",
        "batchfill.api.status",
    }, imports
    assert "open(" not in source


# ------------------------------------------------------------------------------- the largest spec fits kopf's copy


def _largest(node: Schema, path: str) -> Any:
    """The value of ``node`` whose JSON is longest: every list at maxItems, string at maxLength (of ``"``, escaped to
    two bytes, where the pattern admits it), map at maxProperties, number at its widest. Fails naming an unbounded
    node or free text that admits characters kopf would escape to more (non-ASCII)."""
    if node.get("x-kubernetes-int-or-string"):
        return "9" * QUANTITY_MAX
    if "enum" in node:
        return max(node["enum"], key=lambda v: len(json.dumps(v)))
    kind = node.get("type")
    if kind == "string":
        assert "maxLength" in node, f"{path}: a string without maxLength"
        assert "pattern" in node, f"{path}: free text without a pattern (printable ASCII at most)"
        return ('"' if node["pattern"] == PRINTABLE else "x") * node["maxLength"]
    if kind == "integer":
        return -(2**63)
    if kind == "number":
        return -1.7976931348623157e308
    if kind == "boolean":
        return False
    if kind == "array":
        assert "maxItems" in node, f"{path}: a list without maxItems"
        return [_largest(node["items"], f"{path}[]") for _ in range(node["maxItems"])]
    assert kind == "object", f"{path}: type {kind}"
    assert not node.get("x-kubernetes-preserve-unknown-fields"), f"{path}: unbounded free-form object"
    values = node.get("additionalProperties")
    if isinstance(values, dict):
        assert "maxProperties" in node, f"{path}: a map without maxProperties"
        rules = [r["rule"] for r in node.get("x-kubernetes-validations", [])]
        assert f"self.all(k, k.matches('{PRINTABLE}'))" in rules, f"{path}: keys that may be non-ASCII"
        width = len(str(node["maxProperties"]))
        return {
            '"' * (QUALIFIED_NAME_MAX - width) + f"{i:0{width}d}": _largest(values, f"{path}.*")
            for i in range(node["maxProperties"])
        }
    return {name: _largest(child, f"{path}.{name}") for name, child in node.get("properties", {}).items()}


def test_the_largest_spec_the_crd_admits_fits_kopfs_copy() -> None:
    # kopf keeps the handled spec in an annotation; the API server allows 256 KiB of annotations in total, so a spec
    # it accepts but whose copy does not fit would be refused on every write kopf makes to it (it once retried for
    # ever). Compact JSON with kopf's escaping (json.dumps: ASCII only), every character escaped where it can be.
    largest = _largest(node_at("spec"), "spec")
    copy_bytes = len(json.dumps(largest, separators=(",", ":")))
    assert 0.5 * SPEC_BYTES_MAX < copy_bytes <= SPEC_BYTES_MAX, copy_bytes
    assert SPEC_BYTES_MAX <= 256 * 1024 - 32 * 1024  # room for the user's own annotations and kopf's progress
    assert len(largest["triton"]["args"]) == 16
    assert len(largest["triton"]["args"][0]) == 1024
