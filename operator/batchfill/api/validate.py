"""Load and check BatchedModel documents; every problem names its field path and numbers.

Pure: takes already-parsed documents (dicts), never reads files. The checks here are the rules that span
fields and do not depend on the plan; the CRD's CEL rules enforce the same ones in the API server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from batchfill.api.errors import Problem, SpecError, field_path
from batchfill.api.spec import BatchedModel, BatchedModelSpec, DataType, SequenceStrategy

GPU_RESOURCE = "nvidia.com/gpu"
#: Backends/platforms that cannot run without a GPU.
GPU_ONLY = frozenset({"tensorrt", "tensorrt_plan", "tensorrtllm"})


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def problems_from_validation_error(err: ValidationError, root: str = "spec") -> list[Problem]:
    """Translate pydantic errors into field-named problems with short, user-facing messages."""
    out: list[Problem] = []
    for e in err.errors(include_url=False):
        # drop pydantic's own location parts: validator wrappers and the member names of `int | str` unions
        loc = [p for p in e["loc"] if not (isinstance(p, str) and (p.startswith("function-") or p in ("int", "str")))]
        path = field_path(loc, root)
        kind, ctx, given = e["type"], e.get("ctx") or {}, e.get("input")
        if kind == "int_from_float":
            msg = f"must be a whole number, got {given}"
        elif (kind == "greater_than" and ctx.get("gt") == 0) or (kind == "greater_than_equal" and ctx.get("ge") == 1):
            msg = f"must be positive, got {given}"
        elif kind == "greater_than_equal":
            msg = f"must be >= {ctx['ge']}, got {given}"
        elif kind == "greater_than":
            msg = f"must be > {ctx['gt']}, got {given}"
        elif kind == "less_than_equal":
            msg = f"must be <= {ctx['le']}, got {given}"
        elif kind == "missing":
            msg = "is required"
        elif kind == "extra_forbidden":
            msg = "unknown field"
        elif kind == "finite_number":
            msg = f"must be a finite number, got {given}"
        elif kind in ("too_short", "too_long"):
            msg = e["msg"].replace("List", "list").replace("Value", "value")
        else:
            msg = f"{e['msg']} (got {_describe(given)})"
        out.append(Problem(path, msg))
    return out


def check_spec(spec: BatchedModelSpec) -> list[Problem]:
    """Cross-field rules of a type-valid spec. Returns every problem (empty list: fine)."""
    p: list[Problem] = []
    sla, b, model = spec.sla, spec.batching, spec.model

    for name, value in (("latencyP99Ms", sla.latencyP99Ms), ("networkOverheadMs", sla.networkOverheadMs)):
        if not math.isfinite(value):
            p.append(Problem(f"spec.sla.{name}", f"must be a finite number, got {value}"))
    if sla.networkOverheadMs >= sla.latencyP99Ms:
        p.append(
            Problem(
                "spec.sla.networkOverheadMs",
                f"={sla.networkOverheadMs:g} ms leaves no server budget: it must be less than "
                f"spec.sla.latencyP99Ms={sla.latencyP99Ms:g}",
            )
        )

    profile = spec.profile or []
    for i in range(1, len(profile)):
        if profile[i].batchSize <= profile[i - 1].batchSize:
            p.append(
                Problem(
                    f"spec.profile[{i}].batchSize",
                    f"={profile[i].batchSize} must be greater than spec.profile[{i - 1}].batchSize="
                    f"{profile[i - 1].batchSize} (batch sizes strictly increasing)",
                )
            )
    largest = max((q.batchSize for q in profile), default=None)

    batching_off = b.maxBatchSize == 0
    pref = b.preferredBatchSizes or []
    for i, size in enumerate(pref):
        where = f"spec.batching.preferredBatchSizes[{i}]"
        if size < 1:
            p.append(Problem(where, f"must be positive, got {size}"))
        elif batching_off:
            p.append(Problem(where, f"={size} needs batching enabled: spec.batching.maxBatchSize must be > 0, got 0"))
        elif b.maxBatchSize is not None and size > b.maxBatchSize:
            p.append(Problem(where, f"={size} exceeds spec.batching.maxBatchSize={b.maxBatchSize}"))
        elif largest is not None and size > largest:
            p.append(
                Problem(
                    where,
                    f"={size} exceeds the largest profiled batch size {largest} (spec.profile[{len(profile) - 1}]"
                    ".batchSize); the profile is never extrapolated",
                )
            )
        if size in pref[:i]:
            p.append(Problem(where, f"={size} is listed twice"))

    if b.maxQueueDelayMicroseconds is not None:
        budget_us = sla.latencyP99Ms * 1000
        if b.maxQueueDelayMicroseconds >= budget_us:
            p.append(
                Problem(
                    "spec.batching.maxQueueDelayMicroseconds",
                    f"={b.maxQueueDelayMicroseconds} µs ({b.maxQueueDelayMicroseconds / 1000:g} ms) exceeds the "
                    f"whole latency budget spec.sla.latencyP99Ms={sla.latencyP99Ms:g}",
                )
            )
        if batching_off:
            p.append(
                Problem(
                    "spec.batching.maxQueueDelayMicroseconds",
                    "needs batching enabled: spec.batching.maxBatchSize must be > 0, got 0",
                )
            )

    if (model.backend is None) == (model.platform is None):
        # The CRD's CEL rule on ModelSpec, checked again here for `batchfill plan` (no API server there).
        p.append(Problem("spec.model.backend", "exactly one of backend or spec.model.platform must be set"))

    if model.stateful and model.sequenceStrategy is SequenceStrategy.DIRECT and pref:
        p.append(
            Problem(
                "spec.batching.preferredBatchSizes",
                "preferred batch sizes are not supported by the Direct sequence strategy "
                "(spec.model.sequenceStrategy=Direct); remove them or use Oldest",
            )
        )

    p.extend(_check_tensors(spec, batching_off))
    p.extend(_check_resources(spec))

    if spec.scaling.minReplicas > spec.scaling.maxReplicas:
        p.append(
            Problem(
                "spec.scaling.minReplicas",
                f"={spec.scaling.minReplicas} exceeds spec.scaling.maxReplicas={spec.scaling.maxReplicas}",
            )
        )
    return p


def _check_tensors(spec: BatchedModelSpec, batching_off: bool) -> list[Problem]:
    p: list[Problem] = []
    model = spec.model
    input_names = {t.name for t in model.inputs}
    for group, tensors in (("inputs", model.inputs), ("outputs", model.outputs)):
        seen: set[str] = set()
        for i, t in enumerate(tensors):
            base = f"spec.model.{group}[{i}]"
            if t.name in seen:
                p.append(Problem(f"{base}.name", f"={t.name!r} is used twice in spec.model.{group}"))
            seen.add(t.name)
            if any(d == 0 for d in t.dims):
                p.append(Problem(f"{base}.dims", f"={t.dims}: every entry must be -1 (variable) or >= 1"))
            if t.includesBatchDim and len(t.dims) < 2 and not batching_off:
                p.append(
                    Problem(
                        f"{base}.dims",
                        f"={t.dims} holds only the batch axis; give the per-sample dims too (at least one)",
                    )
                )
            if t.rank is not None:
                sample_rank = t.rank - 1
                given = len(t.dims) - (1 if t.includesBatchDim else 0)
                if not batching_off and given != sample_rank:
                    hint = (
                        "; remove the leading batch dimension or set includesBatchDim: true" if given == t.rank else ""
                    )
                    p.append(
                        Problem(
                            f"{base}.dims",
                            f"dims has {len(t.dims)} entries but model rank is {t.rank} and batching is enabled{hint}",
                        )
                    )
                if batching_off and len(t.dims) != t.rank:
                    p.append(
                        Problem(
                            f"{base}.dims",
                            f"dims has {len(t.dims)} entries but model rank is {t.rank} and batching is off "
                            "(spec.batching.maxBatchSize=0): give the full shape",
                        )
                    )
            if t.allowRaggedBatch:
                where = f"{base}.allowRaggedBatch"
                if group == "outputs":
                    p.append(Problem(where, "applies to inputs only"))
                elif batching_off:
                    p.append(Problem(where, "needs batching enabled: spec.batching.maxBatchSize must be > 0"))
                elif not model.batchInputs:
                    p.append(
                        Problem(
                            where,
                            "ragged batching requires batch_input entries and model support; none declared "
                            "(add spec.model.batchInputs)",
                        )
                    )
    for j, bi in enumerate(model.batchInputs):
        # Triton's ValidateBatchIO (model_config_utils.cc): one source input, TYPE_INT32 or TYPE_FP32.
        if len(bi.sourceInputs) != 1:
            p.append(
                Problem(
                    f"spec.model.batchInputs[{j}].sourceInputs",
                    f"={bi.sourceInputs}: Triton expects exactly 1 source input for kind {bi.kind.value}",
                )
            )
        if bi.dataType not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
            p.append(
                Problem(
                    f"spec.model.batchInputs[{j}].dataType",
                    f"={bi.dataType.value} must be TYPE_INT32 or TYPE_FP32",
                )
            )
        for k, src in enumerate(bi.sourceInputs):
            if src not in input_names:
                p.append(
                    Problem(
                        f"spec.model.batchInputs[{j}].sourceInputs[{k}]",
                        f"={src!r} is not an input in spec.model.inputs",
                    )
                )
    return p


def _quantity_to_number(q: int | str) -> float | None:
    """Whole-number quantity of an extended resource ("2", 2); None when it is not a plain number."""
    if isinstance(q, int):
        return float(q)
    try:
        return float(q)
    except ValueError:
        return None


def _check_resources(spec: BatchedModelSpec) -> list[Problem]:
    p: list[Problem] = []
    t = spec.triton
    req, lim = t.resources.requests.get(GPU_RESOURCE), t.resources.limits.get(GPU_RESOURCE)
    r_path = f"spec.triton.resources.requests[{GPU_RESOURCE}]"
    l_path = f"spec.triton.resources.limits[{GPU_RESOURCE}]"
    for path, q in ((r_path, req), (l_path, lim)):
        if q is None:
            continue
        n = _quantity_to_number(q)
        if n is None or not n.is_integer() or n < 0:
            p.append(Problem(path, f"={q} must be a whole number of GPUs"))
        elif int(n) != t.gpusPerReplica:
            p.append(
                Problem(
                    path,
                    f"={q} must equal spec.triton.gpusPerReplica={t.gpusPerReplica} (set GPUs there only)",
                )
            )
    if req is not None and lim is not None and _quantity_to_number(req) != _quantity_to_number(lim):
        p.append(
            Problem(
                r_path,
                f"={req} must equal {l_path}={lim} (extended resources cannot be overcommitted)",
            )
        )
    engine = (spec.model.backend or spec.model.platform or "").lower()
    if t.gpusPerReplica == 0 and engine in GPU_ONLY:
        p.append(
            Problem(
                "spec.triton.gpusPerReplica",
                f"=0 but {engine} runs only on GPUs; give at least 1",
            )
        )
    return p


def load_model(doc: Mapping[str, Any]) -> BatchedModel:
    """Validate one parsed BatchedModel document.

    Raises:
        SpecError: with one problem per bad field (type errors first, then cross-field rules).
    """
    if not isinstance(doc, Mapping):
        raise SpecError([Problem("(document)", f"must be a mapping (a BatchedModel object), got {_describe(doc)}")])
    if doc.get("kind", "BatchedModel") != "BatchedModel":
        raise SpecError([Problem("kind", f"must be BatchedModel, got {doc.get('kind')!r}")])
    try:
        bm = BatchedModel.model_validate(doc)
    except ValidationError as err:
        raise SpecError(problems_from_validation_error(err, root="")) from None
    problems = check_spec(bm.spec)
    if problems:
        reason = "InvalidBatching" if any(q.path.startswith("spec.batching") for q in problems) else "InvalidSpec"
        raise SpecError(problems, reason=reason)
    return bm


def parse_documents(text: str) -> list[Any]:
    """All YAML documents of a file (empty documents dropped).

    Raises:
        SpecError: for YAML that does not parse, with the line and column.
    """
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except RecursionError:
        raise SpecError([Problem("(document)", "YAML nests too deeply to be a BatchedModel")]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError([Problem(where, f"YAML does not parse: {problem}")]) from None
