"""Checks of the Kubernetes fields batchfill copies into a Triton pod template, each problem named by its field.

The API server validates the Deployment only when the operator applies it; a value it refuses there would leave
the BatchedModel or GPUPool with no condition. So the pod rules that the CRD schema cannot express are checked
here (k8s.io/apimachinery validation: IsQualifiedName, IsValidLabelValue, ParseQuantity; k8s.io/kubernetes core
validation: ValidateTolerations, ValidateResourceRequirements). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation

from batchfill.api.errors import Problem, describe_value
from batchfill.api.spec import ResourceRequirements, TaintEffect, Toleration, TolerationOperator

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_SUFFIXES = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9), ("T", 12))},
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
}
_STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def qualified_name_error(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes qualified name (label key, resource name); None when it is one."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "the prefix before '/' must be a DNS subdomain (lower case, at most 253 characters)"
    if not name or len(name) > 63 or not re.fullmatch(_NAME, name):
        return "the name must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


def label_value_error(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value; None when it is one."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return "must be empty or 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


def parse_quantity(q: int | str) -> Decimal | None:
    """A resource quantity's value ("500m" -> 0.5, "1Gi" -> 1073741824, 2 -> 2); None when it does not parse."""
    if isinstance(q, int):
        return Decimal(q)
    m = _QUANTITY.match(q)
    if m is None:
        return None
    suffix = m["suffix"] or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(m["num"]) * Decimal(10) ** int(suffix[1:])
        return Decimal(m["num"]) * _SUFFIXES.get(suffix, Decimal(1))
    except (InvalidOperation, ValueError, OverflowError):
        return None


def pod_field_problems(  # noqa: C901 (a flat list of independent field checks)
    root: str,
    resources: ResourceRequirements,
    node_selector: Mapping[str, str],
    tolerations: Sequence[Toleration],
    gpu_resource: str,
) -> list[Problem]:
    """The problems of a Triton container's pod fields under field path ``root`` (``spec.triton``): node selector
    keys and values, tolerations, resource names and quantities, requests against limits (``gpu_resource`` is
    left to the caller, whose GPU rule differs)."""
    p: list[Problem] = []
    for key, value in node_selector.items():
        where = f"{root}.nodeSelector[{key}]"
        if why := qualified_name_error(key):
            p.append(Problem(where, f"is not a valid label key: {why}"))
        if why := label_value_error(value):
            p.append(Problem(where, f"={describe_value(value)} is not a valid label value: {why}"))
    for i, tol in enumerate(tolerations):
        base = f"{root}.tolerations[{i}]"
        exists = tol.operator is TolerationOperator.EXISTS
        if tol.key and (why := qualified_name_error(tol.key)):
            p.append(Problem(f"{base}.key", f"={describe_value(tol.key)} is not a valid label key: {why}"))
        if not tol.key and not exists:
            p.append(Problem(f"{base}.operator", "must be Exists when key is empty (match every taint)"))
        if exists and tol.value:
            p.append(Problem(f"{base}.value", "must be empty when operator is Exists"))
        if not exists and tol.value and (why := label_value_error(tol.value)):
            p.append(Problem(f"{base}.value", f"={describe_value(tol.value)} is not a valid label value: {why}"))
        if tol.tolerationSeconds is not None and tol.effect is not TaintEffect.NO_EXECUTE:
            p.append(Problem(f"{base}.tolerationSeconds", "needs effect NoExecute"))
    values: dict[str, dict[str, Decimal]] = {}
    for group, quantities in (("requests", resources.requests), ("limits", resources.limits)):
        for name, q in quantities.items():
            where = f"{root}.resources.{group}[{name}]"
            extended = "/" in name and "kubernetes.io/" not in name
            if why := qualified_name_error(name):
                p.append(Problem(where, f"is not a valid resource name: {why}"))
                continue
            if "/" not in name and name not in _STANDARD_RESOURCES and not name.startswith("hugepages-"):
                why = "use cpu, memory, ephemeral-storage, hugepages-<size> or a name with a domain (example.com/dev)"
                p.append(Problem(where, f"is not a container resource: {why}"))
                continue
            n = parse_quantity(q)
            if n is None:
                p.append(Problem(where, f"={describe_value(q)} is not a quantity (e.g. 500m, 2, 1Gi)"))
            elif n < 0:
                p.append(Problem(where, f"={describe_value(q)} must not be negative"))
            elif extended and n != n.to_integral_value():
                p.append(Problem(where, f"={describe_value(q)} must be a whole number (an extended resource)"))
            else:
                values.setdefault(group, {})[name] = n
    requests, limits = values.get("requests", {}), values.get("limits", {})
    for name in sorted(set(requests) & set(limits)):
        if name == gpu_resource:
            continue  # _check_resources names the GPU rule
        where = f"{root}.resources.requests[{name}]"
        if "/" in name and "kubernetes.io/" not in name and requests[name] != limits[name]:
            p.append(Problem(where, "must equal its limit (extended resources cannot be overcommitted)"))
        elif requests[name] > limits[name]:
            p.append(Problem(where, f"must be less than or equal to {root}.resources.limits[{name}]"))
    return p
