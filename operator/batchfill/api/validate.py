"""Load and check BatchedModel documents; every problem names its field path and numbers.

Pure: takes already-parsed documents (dicts), never reads files. The checks here are the rules that span
fields and do not depend on the plan; the CRD's CEL rules enforce the same ones in the API server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from batchfill.api.errors import Problem, SpecError, describe_value, field_path
from batchfill.api.pod_fields import pod_field_problems
from batchfill.api.pool import GPUPool, GPUPoolSpec
from batchfill.api.reasons import SpecReason
from batchfill.api.spec import GPU_RESOURCE as SPEC_GPU_RESOURCE
from batchfill.api.spec import (
    KIND,
    MIN_REPLICAS_ZERO,
    BatchedModel,
    BatchedModelSpec,
    DataType,
    ModelSpec,
    PlacementMode,
    SequenceStrategy,
)

GPU_RESOURCE = SPEC_GPU_RESOURCE  # re-exported: the default spec.triton.gpuResource
#: Domain of NVIDIA's device-plugin resources (whole GPUs, MIG slices, time-sliced GPUs): a resource of it other
#: than spec.triton.gpuResource is a GPU the plan, the instance groups and the GPU-hours would not count.
NVIDIA_DOMAIN = "nvidia.com/"
#: Backends/platforms that cannot run without a GPU.
GPU_ONLY = frozenset({"tensorrt", "tensorrt_plan", "tensorrtllm"})


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
            msg = f"{e['msg']} (got {describe_value(given)})"
        out.append(Problem(path, msg))
    return out


def check_spec(spec: BatchedModelSpec) -> list[Problem]:  # noqa: C901 (a flat list of independent field checks)
    """Cross-field rules of a type-valid spec. Returns every problem (empty list: fine).

    Long because it is a flat list of independent field checks.
    """
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

    if spec.scaling.minReplicas < 1:
        p.append(Problem("spec.scaling.minReplicas", f"={spec.scaling.minReplicas}: {MIN_REPLICAS_ZERO}"))
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
    if len(profile) == 1 and profile[0].batchSize > 1:
        # One point says nothing about how latency grows with the batch: every smaller batch would be planned at
        # this batch's latency, which makes batching look useless and the capacity nonsense (< 1 req/s).
        p.append(
            Problem(
                "spec.profile",
                f"has one point (batchSize {profile[0].batchSize}): at least two batch sizes are needed, one of "
                "them 1, to know how latency grows with the batch (measure them: batchfill profile)",
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
    p.extend(
        warmup_problems(spec.model, [_sample_dims(t.dims, t.includesBatchDim, batching_off) for t in spec.model.inputs])
    )
    p.extend(_check_resources(spec))
    if spec.placement.mode is not PlacementMode.DEDICATED and spec.placement.pool is None:
        p.append(
            Problem("spec.placement.pool", f"is required when mode is {spec.placement.mode} (the GPUPool to share)")
        )
    p.extend(_check_pod_fields(spec))

    if spec.scaling.minReplicas > spec.scaling.maxReplicas:
        p.append(
            Problem(
                "spec.scaling.minReplicas",
                f"={spec.scaling.minReplicas} exceeds spec.scaling.maxReplicas={spec.scaling.maxReplicas}",
            )
        )
    return p


def _sample_dims(dims: Sequence[int], includes_batch_dim: bool, batching_off: bool) -> list[int]:
    """The dims Triton's config gets: without the batch axis when batching is on, the full shape when off."""
    return list(dims[1:] if includes_batch_dim and not batching_off else dims)


def warmup_problems(model: ModelSpec, sample_dims: Sequence[Sequence[int]]) -> list[Problem]:
    """What keeps ``model.warmup`` from being rendered: no ``inputs`` (a warm-up request needs their names and
    shapes), or an input whose config dims ``sample_dims`` (one list per input, in order) hold a variable -1."""
    if model.warmup is None:
        return []
    if not model.inputs:
        return [
            Problem("spec.model.warmup", "warm-up requests need the inputs' names and shapes: set spec.model.inputs")
        ]
    return [
        Problem(f"spec.model.inputs[{i}].dims", f"={list(t.dims)} has a variable (-1) dim; warm-up needs fixed dims")
        for i, (t, dims) in enumerate(zip(model.inputs, sample_dims, strict=True))
        if any(d < 1 for d in dims)
    ]


def _check_tensors(spec: BatchedModelSpec, batching_off: bool) -> list[Problem]:  # noqa: C901 (a flat list of independent field checks)
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
    try:
        return float(q)
    except (ValueError, OverflowError):  # OverflowError: an int beyond float range (10**400)
        return None


def _check_resources(spec: BatchedModelSpec) -> list[Problem]:
    p: list[Problem] = []
    t = spec.triton
    gpu = t.gpuResource
    req, lim = t.resources.requests.get(gpu), t.resources.limits.get(gpu)
    r_path = f"spec.triton.resources.requests[{gpu}]"
    l_path = f"spec.triton.resources.limits[{gpu}]"
    for group, quantities in (("requests", t.resources.requests), ("limits", t.resources.limits)):
        for name in sorted(n for n in quantities if n.startswith(NVIDIA_DOMAIN) and n != gpu):
            p.append(
                Problem(
                    f"spec.triton.resources.{group}[{name}]",
                    f"is a GPU resource but spec.triton.gpuResource={gpu}: set gpuResource={name} and count it "
                    "in gpusPerReplica (else the instance groups run KIND_CPU and no GPU-hours are counted)",
                )
            )
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
        got = describe_value(doc)
        raise SpecError([Problem("(document)", f"must be a mapping (a BatchedModel object), got {got}")])
    if doc.get("kind", KIND) != KIND:
        raise SpecError([Problem("kind", f"must be {KIND}, got {doc.get('kind')!r}")])
    try:
        bm = BatchedModel.model_validate(doc)
    except ValidationError as err:
        raise SpecError(problems_from_validation_error(err, root="")) from None
    problems = check_spec(bm.spec)
    if problems:
        batching = any(q.path.startswith("spec.batching") for q in problems)
        reason = SpecReason.INVALID_BATCHING if batching else SpecReason.INVALID_SPEC
        raise SpecError(problems, reason=reason)
    return bm


def load_pool(doc: Mapping[str, Any]) -> GPUPool:
    """Validate one parsed GPUPool document (its schema, then :func:`pool_problems`).

    Raises:
        SpecError: with one problem per bad field.
    """
    try:
        pool = GPUPool.model_validate(doc)
    except ValidationError as err:
        raise SpecError(problems_from_validation_error(err, root="")) from None
    problems = pool_problems(pool.spec)
    if problems:
        raise SpecError(problems)
    return pool


def _check_pod_fields(spec: BatchedModelSpec) -> list[Problem]:
    t = spec.triton
    return pod_field_problems("spec.triton", t.resources, t.nodeSelector, t.tolerations, t.gpuResource)


def pool_problems(spec: GPUPoolSpec) -> list[Problem]:
    """What is wrong with a GPUPool's spec beyond its schema: the rules its CRD states in CEL (checked again for
    an object stored before them), the pod fields the API server would refuse only on the pool's Deployment (a
    request above its limit, a malformed quantity or label), each named by its field; [] when it can be served."""
    p: list[Problem] = []
    if spec.minPods > spec.maxPods:
        p.append(Problem("spec.minPods", f"={spec.minPods} must be <= spec.maxPods={spec.maxPods}"))
    r = spec.repository
    if sum(x is not None for x in (r.pvc, r.image, r.uri)) != 1:
        p.append(Problem("spec.repository", "exactly one of pvc, image or uri must be set"))
    t = spec.triton
    for group, quantities in (("requests", t.resources.requests), ("limits", t.resources.limits)):
        for name in quantities:
            if name.startswith(NVIDIA_DOMAIN) or name == spec.gpuResource:
                why = "the pool's GPU is spec.gpuResource and spec.gpusPerPod, not triton.resources"
                p.append(Problem(f"spec.triton.resources.{group}[{name}]", why))
    p.extend(pod_field_problems("spec.triton", t.resources, t.nodeSelector, t.tolerations, spec.gpuResource))
    return p
