"""What a BatchedModel's spec asks for: its batching plan and rendered config.pbtxt (pure, cached by spec).

Every flow of the controller (the create/update/resume reconcile, the scaling and the profiling ticks) starts
from :func:`desired_state`; the plan is cached by spec and measured profile, so a resume, a status-only event or
a loop's pass does not simulate again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchfill.api.errors import Problem, SpecError
from batchfill.api.spec import API_VERSION, KIND, BatchedModelSpec, ProfilePoint, ProfileSource
from batchfill.api.status import PlannedProfileSource, PlanStatus
from batchfill.api.validate import load_model
from batchfill.policy.plan import PlanResult, first_plan, plan_batching
from batchfill.render import config_hash, render_model_config

#: A measured profile: ((batch size, latency ms), ...).
Measured = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Desired:
    """Everything derived from the spec (and the measured profile the plan uses, if any).

    ``profile_source``: Declared (spec.profile), Measured (status.plannedProfile.points) or FirstPlan (no
    profile yet: capacity unknown).
    """

    spec: BatchedModelSpec
    plan: PlanResult
    plan_status: PlanStatus
    config: str
    config_hash: str
    profile_source: PlannedProfileSource = PlannedProfileSource.DECLARED


def profile_hash(profile: Any) -> str:
    """A short hash of spec.profile as stored (``none`` when absent): adoption of a measured profile holds only
    while the declared one is unchanged, so a user's new profile wins over an older measurement."""
    if not profile:
        return "none"
    return hashlib.sha256(json.dumps(profile, sort_keys=True, default=str).encode()).hexdigest()[:12]


def adopted_profile(spec: Mapping[str, Any], status: Mapping[str, Any]) -> Measured | None:
    """The measured points status.plannedProfile says the plan uses, if they still apply to this spec."""
    planned = status.get("plannedProfile") or {}
    points = planned.get("points") or []
    if (
        planned.get("source") != PlannedProfileSource.MEASURED
        or not points
        or planned.get("declaredHash") != profile_hash(spec.get("profile"))
    ):
        return None
    try:
        out = tuple((int(p["batchSize"]), float(p["latencyMs"])) for p in points)
    except (KeyError, TypeError, ValueError):
        return None  # a hand-edited status: plan from the spec
    sizes = [b for b, _ in out]
    if sizes != sorted(set(sizes)) or any(b < 1 or not (math.isfinite(ms) and ms > 0) for b, ms in out):
        return None  # unsorted, duplicate or non-positive points (hand-edited): plan from the spec
    return out


#: The Triton image of a cluster without GPUs (``BATCHFILL_TRITON_CPU_IMAGE``, batchfill.controller.settings), set
#: once at operator startup by :func:`render_on_cpu`; "" renders for production. One operator process serves one
#: kind of cluster, and every flow (reconcile, scaling, profiling) must render the same children, or each would
#: see the other's Deployment as drift: hence one process-wide value rather than a parameter of each flow.
_cpu_image = ""


def render_on_cpu(image: str) -> None:
    """Render every model for a cluster whose nodes have no GPU Triton can use (dev and test clusters).

    With ``image`` set, the Triton pods run ``image`` instead of ``spec.triton.image``, and config.pbtxt's instance
    groups are ``KIND_CPU`` (``count = instanceCount x gpusPerReplica``, :func:`batchfill.render.build_model_config`).
    Everything else, the ``nvidia.com/gpu`` requests included, stays as production renders it. ``""``: production.
    """
    global _cpu_image
    _cpu_image = image


#: Plans kept (one per distinct spec and measured profile). Both loops ask for every model's plan each pass, and
#: a plan costs 0.01-0.1 s of simulation (benchmarks/plan_speed.py): the cache must hold the whole fleet, or a
#: pass replans every model (benchmarks/scale.py: 600 distinct specs, 0 hits in 1,200 lookups with 512).
PLAN_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def plan_cache(
    spec_json: str, measured: Measured | None, cpu_image: str = ""
) -> tuple[BatchedModelSpec, PlanResult, str, PlannedProfileSource]:
    """The plan cache: (validated spec, plan, config.pbtxt, profile source) of a spec given as sorted JSON.

    ``measured`` points, when given, replace spec.profile. ``cpu_image``: see :func:`render_on_cpu` (the returned
    spec carries it as ``triton.image``). ``plan_cache.cache_info()`` reports its use (benchmarks/scale.py).
    Raises :class:`SpecError` (not cached: the next call validates again).
    """
    bm = load_model({"apiVersion": API_VERSION, "kind": KIND, "spec": json.loads(spec_json)})
    spec = bm.spec
    if spec.profiling.source == ProfileSource.DECLARED and not spec.profile:
        raise SpecError([Problem("spec.profiling.source", "=Declared needs spec.profile (or use Measured)")])
    if measured:
        points = [ProfilePoint(batchSize=b, latencyMs=ms) for b, ms in measured]
        result, source = plan_batching(spec.model_copy(update={"profile": points})), PlannedProfileSource.MEASURED
    elif spec.profile:
        result, source = plan_batching(spec), PlannedProfileSource.DECLARED
    else:
        result, source = first_plan(spec), PlannedProfileSource.FIRST_PLAN
    if not cpu_image:
        return spec, result, render_model_config(spec, result.to_status()), source
    spec = spec.model_copy(update={"triton": spec.triton.model_copy(update={"image": cpu_image})})
    return spec, result, render_model_config(spec, result.to_status(), instance_kind="KIND_CPU"), source


def desired_state(spec: Mapping[str, Any], measured: Measured | None = None) -> Desired:
    """Validate, plan (from ``measured`` points when given, else spec.profile, else the first plan) and render
    (for production, or for a cluster without GPUs after :func:`render_on_cpu`).

    Raises:
        SpecError: field-named problems of a spec that cannot be served.
    """
    model, result, config, source = plan_cache(json.dumps(spec, sort_keys=True, default=str), measured, _cpu_image)
    return Desired(model, result, result.to_status(), config, config_hash(config), source)
