"""The BatchedModel CustomResourceDefinition, generated from the pydantic models (the single schema source).

``batchfill crd`` prints :func:`render_crd_yaml`; ``crds/batchedmodel.yaml`` is that output, committed, and a
unit test fails when the two differ. Pure: no I/O.

pydantic emits JSON Schema (draft 2020-12); the API server wants a *structural* OpenAPI v3 schema
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema):

* every ``$ref`` is inlined (no ``$defs``); the referring node's own keywords (description, default) win;
* ``X | None`` (``anyOf: [X, {type: null}]``) becomes plain ``X``: optional means "not in ``required``",
  and the API server prunes nulls of non-nullable fields, so a writer that sends ``null`` clears the field;
* no ``anyOf``/``oneOf``/``allOf`` remain; ``int | str`` marked ``x-kubernetes-int-or-string`` becomes just
  that marker (no type);
* ``title`` and ``additionalProperties: false`` are dropped (a structural schema prunes unknown fields, and
  ``additionalProperties`` may not sit next to ``properties``); ``additionalProperties: <schema>`` is a map;
* draft-2020 ``exclusiveMinimum: v`` becomes OpenAPI v3 ``minimum: v`` + ``exclusiveMinimum: true``;
* ``default: null`` is dropped; a field whose default comes from a ``default_factory`` and whose object has
  no required field gets ``default: {}``, so the API server fills its nested defaults on create;
* anything the generator does not know how to translate faithfully is an error, not a silent guess.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from batchfill.api.pool import POOL_KIND, POOL_PLURAL, POOL_SHORT_NAMES, POOL_SINGULAR, GPUPoolSpec, GPUPoolStatus
from batchfill.api.spec import GROUP, KIND, PLURAL, PRINTABLE, SHORT_NAMES, SINGULAR, VERSION, BatchedModelSpec
from batchfill.api.status import BatchedModelStatus

Schema = dict[str, Any]

CRD_NAME = f"{PLURAL}.{GROUP}"
LIST_KIND = f"{KIND}List"
CATEGORIES = ("batchfill",)
REGENERATE_COMMAND = "batchfill crd > crds/batchedmodel.yaml"

#: ``kubectl get bm`` columns. The Deployment's own ``replicas`` is what the operator scales, so the
#: numbers here are read from status (what the operator saw and decided), never from a scale subresource.
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "SLA", "type": "number", "jsonPath": ".spec.sla.latencyP99Ms", "description": "p99 SLA ms"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas", "description": "Triton replicas"},
    {
        "name": "Desired",
        "type": "integer",
        "jsonPath": ".status.desiredReplicas",
        "description": "Replicas the load calls for",
    },
    {
        "name": "Fill",
        "type": "number",
        "jsonPath": ".status.observed.batchFill",
        "description": "Average batch size / maxBatchSize",
    },
    {
        "name": "Queue ms",
        "type": "number",
        "jsonPath": ".status.observed.queueTimeMs",
        "description": "Average queue time per request, ms",
    },
    {
        "name": "Placement",
        "type": "string",
        "jsonPath": ".status.placement.mode",
        "description": "Where it is served: Dedicated or Shared (status.placement)",
    },
    {
        "name": "Pool",
        "type": "string",
        "jsonPath": ".status.placement.pool",
        "description": "The GPUPool serving it (Shared)",
        "priority": 1,
    },
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "The Ready condition",
    },
    {
        "name": "Progressing",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Progressing")].status',
        "description": "The Progressing condition: True while the pods move to the plan's config",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)

#: ``kubectl get gpupool`` columns, from the pool's status.
POOL_PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "GPU", "type": "string", "jsonPath": ".spec.gpuResource", "description": "The pods' GPU resource"},
    {"name": "Models", "type": "integer", "jsonPath": ".status.models", "description": "Models placed on it"},
    {"name": "Pods", "type": "integer", "jsonPath": ".status.pods", "description": "Pods of the pool"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyPods", "description": "Ready pods"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredPods", "description": "Pods the plan wants"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)
POOL_CRD_NAME = f"{POOL_PLURAL}.{GROUP}"
POOL_REGENERATE_COMMAND = "batchfill crd --kind GPUPool > crds/gpupool.yaml"

_SCALARS = frozenset({"string", "integer", "number", "boolean"})
#: Keywords copied as they are, in this order (after description and type). The output order is fixed
#: here, not taken from pydantic, so the YAML reads the same way at every node and diffs stay small.
_PLAIN_KEYWORDS = (
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
)
#: JSON-Schema keywords with no meaning in a CRD that are dropped.
_DROPPED = frozenset({"title", "examples", "$defs"})
#: Keywords handled structurally (not copied as they are).
_STRUCTURE = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "oneOf",
        "allOf",
    }
)


class CRDSchemaError(ValueError):
    """The pydantic schema has something a structural CRD schema cannot express."""


def _at(path: str, message: str) -> CRDSchemaError:
    return CRDSchemaError(f"{path or '<root>'}: {message}")


def _merge(inner: Schema, outer: Schema) -> Schema:
    """``inner`` overlaid with ``outer``'s keywords, except that the CEL rules of both are kept."""
    merged = {**inner, **outer}
    rules = [*inner.get("x-kubernetes-validations", []), *outer.get("x-kubernetes-validations", [])]
    if rules:
        merged["x-kubernetes-validations"] = rules
    return merged


def _deref(node: Schema, defs: Schema, path: str) -> Schema:
    """Inline ``$ref`` and single-branch ``allOf``; the referring node's own keywords win."""
    node = dict(node)
    if "allOf" in node:
        branches = node.pop("allOf")
        if len(branches) != 1:
            raise _at(path, "allOf with several branches cannot be made structural")
        node = _merge(_deref(branches[0], defs, path), node)
    if "$ref" in node:
        ref = node.pop("$ref")
        prefix = "#/$defs/"
        if not isinstance(ref, str) or not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
            raise _at(path, f"cannot resolve $ref {ref!r}")
        node = _merge(_deref(defs[ref[len(prefix) :]], defs, path), node)
    return node


def _drop_null_branch(node: Schema, defs: Schema, path: str) -> Schema:
    """``anyOf: [X, {type: null}]`` -> X merged with the outer keywords (description, default, CEL rules)."""
    for key in ("anyOf", "oneOf"):
        if key not in node:
            continue
        outer = {k: v for k, v in node.items() if k != key}
        branches = [b for b in node[key] if b != {"type": "null"}]
        if outer.get("x-kubernetes-int-or-string"):
            types = sorted(_deref(b, defs, path).get("type", "?") for b in branches)
            if types != ["integer", "string"]:
                raise _at(path, f"x-kubernetes-int-or-string over {types}, expected integer and string")
            return outer
        if len(branches) != 1:
            raise _at(path, f"{key} with {len(branches)} non-null branches cannot be made structural")
        return _drop_null_branch(_merge(_deref(branches[0], defs, path), outer), defs, path)
    return node


def _exclusive_bound(plain: Schema, exclusive: str, inclusive: str, stricter: Any) -> None:
    """Draft 2020 ``exclusiveMinimum: v`` (a number) -> OpenAPI v3 ``minimum: v, exclusiveMinimum: true``."""
    value = plain.get(exclusive)
    if value is None or isinstance(value, bool):
        return
    bound = plain.get(inclusive)
    if bound is not None and stricter(bound, value):
        del plain[exclusive]  # the inclusive bound is the stricter one and already excludes v
        return
    plain[inclusive] = value
    plain[exclusive] = True


def _key_rules(node: Schema, path: str) -> Schema:
    """A map's key bounds -> CEL rules: structural schemas have no propertyNames or patternProperties.

    ``propertyNames`` gives the key lengths; pydantic writes a key pattern as ``patternProperties`` with one entry
    (pattern -> value schema), which becomes ``additionalProperties`` plus a ``matches`` rule on the keys.
    """
    if "propertyNames" not in node and "patternProperties" not in node:
        return node
    node = dict(node)
    names = dict(node.pop("propertyNames", {}))
    by_pattern = node.pop("patternProperties", {})
    if len(by_pattern) > 1 or (by_pattern and "additionalProperties" in node):
        raise _at(path, f"patternProperties {sorted(by_pattern)} beside other value schemas: no CEL translation")
    pattern = names.pop("pattern", None)
    for key_pattern, values in by_pattern.items():
        pattern, node["additionalProperties"] = key_pattern, values
    low, high = names.pop("minLength", None), names.pop("maxLength", None)
    names.pop("type", None)
    if names:
        raise _at(path, f"propertyNames keywords with no CEL translation: {sorted(names)}")
    checks = [c for c in (f"size(k) >= {low}" if low else "", f"size(k) <= {high}" if high else "") if c]
    rules = []
    if checks:
        bounds = " and ".join(b for b in (f"at least {low}" if low else "", f"at most {high}" if high else "") if b)
        rules.append({"message": f"keys must be {bounds} characters", "rule": f"self.all(k, {' && '.join(checks)})"})
    if pattern:
        # a CEL string literal in single quotes: the pattern must not hold one (nor a backslash to escape it)
        if "'" in pattern or "\\" in pattern:
            raise _at(path, f"propertyNames pattern {pattern!r} cannot be written as a CEL string literal")
        what = "printable ASCII" if pattern == PRINTABLE else f"match {pattern}"
        rules.append({"message": f"keys must be {what}", "rule": f"self.all(k, k.matches('{pattern}'))"})
    if rules:
        node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", []), *rules]
    return node


def _plain_text(description: str) -> str:
    """Docstrings mark literals with reST double backticks; ``kubectl explain`` shows text as it is."""
    return description.replace("``", "`")


_MAX_DEPTH = 32


def _structural(raw: Schema, defs: Schema, path: str) -> Schema:  # noqa: C901 (one case per JSON-schema construct pydantic emits)
    if path.count(".") + path.count("[]") > _MAX_DEPTH:
        raise _at(path, f"nested deeper than {_MAX_DEPTH} levels (a recursive model cannot be structural)")
    node = _key_rules(_drop_null_branch(_deref(raw, defs, path), defs, path), path)

    if node.get("uniqueItems"):
        raise _at(path, "uniqueItems is not allowed in a CRD (use a CEL rule or x-kubernetes-list-type: set)")
    unknown = set(node) - _STRUCTURE - _DROPPED - set(_PLAIN_KEYWORDS) - {"const"}
    unknown = {k for k in unknown if not k.startswith("x-kubernetes-")}
    if unknown:
        raise _at(path, f"JSON-Schema keywords with no structural translation: {sorted(unknown)}")

    out: Schema = {}
    if "description" in node:
        out["description"] = _plain_text(node["description"])

    if node.get("x-kubernetes-int-or-string"):
        # IntOrString: no type, no anyOf; the API server accepts an integer or a string.
        if node.get("default") is not None:
            out["default"] = copy.deepcopy(node["default"])
        out["x-kubernetes-int-or-string"] = True
        out.update({k: v for k, v in sorted(node.items()) if k.startswith("x-kubernetes-") and k not in out})
        return out

    node_type = node.get("type")
    if node_type is None:
        if not node or node.get("x-kubernetes-preserve-unknown-fields"):
            # Any: kept as it is (structural schemas allow a type-less node only with this marker).
            out["x-kubernetes-preserve-unknown-fields"] = True
            return out
        raise _at(path, f"no type (keywords: {sorted(node)})")
    if not isinstance(node_type, str) or node_type not in _SCALARS | {"object", "array"}:
        raise _at(path, f"unsupported type {node_type!r}")
    out["type"] = node_type

    plain = {k: node[k] for k in _PLAIN_KEYWORDS if k in node}
    if "const" in node:
        plain["enum"] = [node["const"]]
    if plain.get("default", 0) is None:
        del plain["default"]  # `= None` means "absent"; null is not a valid value of a non-nullable field
    _exclusive_bound(plain, "exclusiveMinimum", "minimum", lambda bound, v: bound > v)
    _exclusive_bound(plain, "exclusiveMaximum", "maximum", lambda bound, v: bound < v)
    for key in _PLAIN_KEYWORDS:  # fixed order; copies, so the YAML has no anchors/aliases
        if key in plain:
            out[key] = copy.deepcopy(plain[key])

    if node_type == "array":
        if "items" not in node:
            raise _at(path, "array without items")
        out["items"] = _structural(node["items"], defs, f"{path}[]")
    elif node_type == "object":
        _object(out, node, defs, path)
    elif any(k in node for k in ("properties", "items", "additionalProperties")):
        raise _at(path, f"{node_type} with object/array keywords")

    for key in sorted(k for k in node if k.startswith("x-kubernetes-")):
        out[key] = copy.deepcopy(node[key])
    return out


def _object(out: Schema, node: Schema, defs: Schema, path: str) -> None:
    properties: Schema = node.get("properties", {})
    extra = node.get("additionalProperties")
    if properties and extra not in (None, False):
        raise _at(path, "properties and additionalProperties together are not structural")
    if node.get("required"):
        out["required"] = list(node["required"])
    if properties:
        converted: Schema = {}
        for name, raw in properties.items():
            prop = _structural(raw, defs, f"{path}.{name}")
            if _wants_empty_default(raw, prop, name, node):
                prop = _insert_after(prop, "type", "default", {})
            converted[name] = prop
        out["properties"] = converted
    if extra is True or extra == {}:
        out["x-kubernetes-preserve-unknown-fields"] = True  # dict[str, Any]
    elif isinstance(extra, dict):
        out["additionalProperties"] = _structural(extra, defs, f"{path}.*")


def _wants_empty_default(raw: Schema, prop: Schema, name: str, parent: Schema) -> bool:
    """A sub-object built by ``default_factory`` whose fields are all optional defaults to ``{}``.

    pydantic writes no ``default`` for a ``default_factory``; without one the API server would not fill the
    object's nested defaults when the user leaves the whole object out. ``= None`` fields (``default: null``
    in ``raw``) stay absent: ``{}`` may not even be valid for them (a repository needs exactly one source).
    """
    return (
        "default" not in raw
        and name not in parent.get("required", [])
        and prop.get("type") == "object"
        and "properties" in prop
        and not prop.get("required")
    )


def _insert_after(node: Schema, anchor: str, key: str, value: Any) -> Schema:
    out: Schema = {}
    for k, v in node.items():
        out[k] = v
        if k == anchor:
            out[key] = value
    return out


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of one pydantic model, every ``$ref`` inlined."""
    raw = model.model_json_schema()
    return _structural(raw, raw.get("$defs", {}), "")


def _crd(
    kind: str,
    names: tuple[str, str, tuple[str, ...]],
    schemas: tuple[type[BaseModel], type[BaseModel]],
    description: str,
    columns: tuple[dict[str, Any], ...],
) -> dict[str, Any]:
    """An ``apiextensions.k8s.io/v1`` CRD of ``kind`` (names: plural, singular, short names) in group batchfill.io."""
    plural, singular, short_names = names
    root: Schema = {
        "description": description,
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation of an object.",
                "type": "string",
            },
            "kind": {
                "description": f"Kind is the REST resource this object represents ({kind}).",
                "type": "string",
            },
            "metadata": {"type": "object"},
            "spec": structural_schema(schemas[0]),
            "status": structural_schema(schemas[1]),
        },
    }
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        # Only the status subresource. No scale subresource on purpose: the Deployment owns `replicas`,
        # the operator sets it from the load, and `kubectl scale bm` / an HPA on the BatchedModel would
        # fight the operator with nothing in spec to write to.
        "subresources": {"status": {}},
        "additionalPrinterColumns": [dict(c) for c in columns],
        "schema": {"openAPIV3Schema": root},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [version],
        },
    }


def build_crd() -> dict[str, Any]:
    """The ``apiextensions.k8s.io/v1`` CustomResourceDefinition of ``batchedmodels.batchfill.io``."""
    return _crd(
        KIND,
        (PLURAL, SINGULAR, SHORT_NAMES),
        (BatchedModelSpec, BatchedModelStatus),
        "BatchedModel serves a model on NVIDIA Triton under a p99 latency SLA: batchfill derives "
        "Triton's dynamic batching from the SLA and scales GPU replicas with the load.",
        PRINTER_COLUMNS,
    )


def build_pool_crd() -> dict[str, Any]:
    """The CustomResourceDefinition of ``gpupools.batchfill.io`` (:mod:`batchfill.api.pool`)."""
    return _crd(
        POOL_KIND,
        (POOL_PLURAL, POOL_SINGULAR, POOL_SHORT_NAMES),
        (GPUPoolSpec, GPUPoolStatus),
        "GPUPool is a set of shared Triton pods (explicit model control) that BatchedModels with "
        "spec.placement.mode Shared or Auto are packed onto, so models below a GPU's load share GPUs.",
        POOL_PRINTER_COLUMNS,
    )


def _header(command: str) -> str:
    return (
        "# Generated by `batchfill crd` from the pydantic models in batchfill.api. Do not edit by hand;\n"
        f"# regenerate with: {command}\n"
        "# No scale subresource on purpose: the operator owns the Deployment's replicas (see batchfill.api.crd).\n"
    )


def _yaml(crd: dict[str, Any]) -> str:
    return yaml.safe_dump(crd, sort_keys=False, allow_unicode=True, width=4096, default_flow_style=False)


def render_crd_yaml() -> str:
    """The CRD as deterministic YAML text, with a header that says how it was made."""
    return _header(REGENERATE_COMMAND) + _yaml(build_crd())


def render_pool_crd_yaml() -> str:
    """The GPUPool CRD as deterministic YAML text (crds/gpupool.yaml), with the same kind of header."""
    return _header(POOL_REGENERATE_COMMAND) + _yaml(build_pool_crd())
