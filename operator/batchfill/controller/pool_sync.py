"""What a pool tick writes besides the loads and labels (pure): the pool's Deployment, each member's status, the
GPUPool's status (:class:`batchfill.controller.pool_loop.PoolModelsLoop` gathers and acts).

* The Deployment is applied when the cache has none, its replicas differ from what the tick wants, or its pod
  template was rendered from another pool spec (the template's :data:`POOL_HASH_ANNOTATION`). The pool shrinks
  only to the number of pods that still serve some model, so the models leave a pod (unlabel, drain, unload) before
  the pool gives it up; the ReplicaSet picks the pod to delete by the pods' deletion cost, which the label patches
  keep at the number of models each pod serves (:class:`batchfill.controller.pool_models.PodPatch`).
* Each member's status is :func:`batchfill.controller.shared_status.shared_status` with ``status.placement`` from
  :func:`batchfill.policy.placement_status.placement_status`, written only where it changed; a member whose
  copies appear (a Dedicated -> Shared move: its own replicas may scale to 0) or whose placement mode changes is
  reconciled again so that its Service follows. A member leaving the pool (Shared -> Dedicated) has its replica
  counts (its copies' until then) written 0 with the new placement, in the same patch: the pool keeps its copies
  until ``status.readyReplicas`` counts a replica of its own, so an operator killed before the re-apply must not
  leave the copies' count to be read as that.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from batchfill.api.errors import SpecError
from batchfill.api.pool import GPUPoolSpec
from batchfill.api.reasons import ConditionReason, ConditionType
from batchfill.api.spec import BatchedModelSpec, PlacementSpec, ProfilePoint
from batchfill.api.status import ConditionStatus
from batchfill.controller.desired import Desired, adopted_profile, desired_state
from batchfill.controller.pool_plan import Member, PoolPlan
from batchfill.controller.shared_status import pooled_conditions, shared_status
from batchfill.controller.status import changed_fields, observed_status
from batchfill.policy import conditions as cond
from batchfill.policy.conditions import rfc3339
from batchfill.policy.placement import DEFAULT_MODEL_MEMORY_MIB
from batchfill.policy.placement_status import placement_status
from batchfill.policy.signals import ModelSignals
from batchfill.render.kube import Owner
from batchfill.render.pool import LOADED, LOADED_LABEL_PREFIX, build_pool_deployment, loaded_label

POOL_HASH_ANNOTATION = "batchfill.io/pool-spec-hash"


def member(body: Mapping[str, Any], rate_rps: float | None) -> tuple[Member, Desired] | str:
    """A pool member from its BatchedModel (the spec with the measured profile its plan uses), or why not."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    try:
        desired = desired_state(spec, adopted_profile(spec, status))
        placement = PlacementSpec.model_validate(spec.get("placement") or {})
    except (SpecError, ValidationError) as err:
        return f"its spec cannot be planned: {err}"
    planned: BatchedModelSpec = desired.spec
    measured = adopted_profile(spec, status)
    if measured:
        points = [ProfilePoint(batchSize=b, latencyMs=ms) for b, ms in measured]
        planned = planned.model_copy(update={"profile": points})
    solo = None if planned.profile is None else desired.plan
    memory = float(placement.memoryMiB or DEFAULT_MODEL_MEMORY_MIB)
    return Member(body["metadata"]["name"], planned, placement.mode, memory, rate_rps, solo), desired


def labelled(pods: Sequence[Mapping[str, Any]], name: str) -> list[str]:
    """The Ready pods labelled as serving BatchedModel ``name``."""
    key = loaded_label(name)
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        if _ready(p) and not meta.get("deletionTimestamp") and _labels(p).get(key) == LOADED:
            out.append(str(meta.get("name")))
    return sorted(out)


def _spec_hash(spec: GPUPoolSpec, image: str) -> str:
    text = json.dumps([spec.model_dump(mode="json"), image], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pool_deployment(
    owner: Owner,
    spec: GPUPoolSpec,
    cached: Mapping[str, Any] | None,
    wanted: int,
    pods: Sequence[Mapping[str, Any]],
    *,
    cpu_image: str = "",
) -> dict[str, Any] | None:
    """The pool's Deployment to apply this tick, or None when the cached one is right (module docstring).

    Args:
        owner: the GPUPool (:func:`batchfill.render.pool.PoolOwner`).
        spec: its spec.
        cached: its Deployment as cached, or None.
        wanted: the pods the plan wants (within [minPods, maxPods]).
        pods: the pool's pods as cached.
        cpu_image: ``BATCHFILL_TRITON_CPU_IMAGE`` (a cluster without GPUs runs that image), or "".
    """
    serving = sum(1 for p in pods if any(k.startswith(LOADED_LABEL_PREFIX) for k in _labels(p)))
    current = None if cached is None else int(((cached.get("spec") or {}).get("replicas")) or 0)
    replicas = wanted if current is None or wanted >= current else max(wanted, min(current, serving))
    replicas = min(replicas, spec.maxPods)
    digest = _spec_hash(spec, cpu_image)
    template = ((cached or {}).get("spec") or {}).get("template") or {}
    rendered = ((template.get("metadata") or {}).get("annotations") or {}).get(POOL_HASH_ANNOTATION)
    if cached is not None and current == replicas and rendered == digest:
        return None
    served = spec
    if cpu_image:
        served = spec.model_copy(update={"triton": spec.triton.model_copy(update={"image": cpu_image})})
    out = build_pool_deployment(owner, served, replicas)
    out["spec"]["template"]["metadata"]["annotations"][POOL_HASH_ANNOTATION] = digest
    return out


@dataclass(frozen=True)
class MemberWrite:
    """A member's status fields to patch (possibly none) and whether to reconcile it again afterwards."""

    body: Mapping[str, Any]
    status: Mapping[str, Any]
    reapply: bool


def member_writes(
    members: Sequence[tuple[Mapping[str, Any], Member, Desired]],
    plan: PoolPlan,
    pods: Sequence[Mapping[str, Any]],
    *,
    now: float,
    signals: Mapping[str, ModelSignals] | None = None,
) -> list[MemberWrite]:
    """Each member's status write under ``plan`` (module docstring).

    ``signals``: by member name, its signals over its pool copies this tick; a shared model's ``status.observed``
    is written from them (removed when unknown or absent: it has no copy), since it has no scaling loop of its own
    to write it. None: ``status.observed`` is left as stored (no signal source)."""
    out = []
    for body, m, desired in members:
        stored = (body.get("status") or {}).get("placement") or {}
        spec = PlacementSpec.model_validate((body.get("spec") or {}).get("placement") or {})
        since = stored.get("since")
        where = placement_status(m.name, spec, plan.placement, labelled(pods, m.name), since)
        if m.name in plan.notes:
            where = where.model_copy(update={"message": plan.notes[m.name][:1024]})
        placed = where.model_dump(mode="json", exclude_none=True)
        if placed.get("mode") != stored.get("mode"):
            placed["since"] = rfc3339(now)
        shared = placed["mode"] == "Shared"
        wanted: dict[str, Any] = shared_status(body, desired, placed, now=now) if shared else {"placement": placed}
        if shared and signals is not None:
            pooled = signals.get(m.name)
            wanted["observed"] = observed_status(pooled) if pooled is not None else None
            wanted["conditions"] = cond.apply_conditions(
                wanted.get("conditions"), pooled_conditions(pooled, wanted.get("conditions")),
                generation=body["metadata"].get("generation"), now=now,
            )  # fmt: skip
        if not shared and stored.get("mode") == "Shared":
            # its replica counts were its pool copies': the pool keeps a copy until readyReplicas counts one of its
            # own Ready, so a stale count must not outlive the move (the re-apply below writes the real one)
            wanted |= {"replicas": 0, "readyReplicas": 0}
        changed = changed_fields(body.get("status") or {}, wanted)
        appeared = shared and bool(placed.get("podCount")) and not stored.get("podCount")
        out.append(MemberWrite(body, changed, appeared or placed.get("mode") != stored.get("mode")))
    return out


def pool_status(
    body: Mapping[str, Any], plan: PoolPlan, pods: Sequence[Mapping[str, Any]], members: int
) -> dict[str, Any]:
    """The GPUPool's status fields that differ from the stored ones."""
    ready = sum(1 for p in pods if _ready(p))
    headroom = None
    if plan.placement is not None and plan.placement.shared:
        loads = []
        for g in plan.placement.shared:
            load = sum(r / plan.placement.model(n).capacity_rps for n, r in zip(g.tenants, g.rates_rps, strict=True)
                       if plan.placement.model(n).capacity_rps > 0)  # fmt: skip
            loads.append(load)
        headroom = round(min(1.0, max(0.0, 1.0 - max(loads))), 4) if all(math.isfinite(x) for x in loads) else None
    wanted = {
        "observedGeneration": body["metadata"].get("generation"),
        "pods": len(pods),
        "readyPods": ready,
        "desiredPods": plan.pods,
        "models": members,
        "planHeadroom": headroom,
    }
    # a None removes the stored field (no plan now: no headroom; a stale figure would describe a plan gone)
    return changed_fields(body.get("status") or {}, wanted)


#: Longest ConfigValid message written to a GPUPool's status, characters (a pool's problems are a few fields).
POOL_MESSAGE_MAX = 2048


def pool_validity(body: Mapping[str, Any], why: str | None, reason: str, now: float) -> dict[str, Any]:
    """The GPUPool's ConfigValid condition, as the status fields that differ from the stored ones (empty: write
    nothing).

    Args:
        body: the GPUPool as read.
        why: None when the pool can be served (True, ``Valid``), else what is wrong, naming the fields.
        reason: the condition's reason while ``why`` is set (a :class:`batchfill.api.reasons.SpecReason`).
        now: seconds since the epoch (``lastTransitionTime`` of a flip).
    """
    stored = (body.get("status") or {}).get("conditions") or []
    if why is None:
        update = cond.ConditionUpdate(ConditionType.CONFIG_VALID, ConditionStatus.TRUE, ConditionReason.VALID)
    else:
        message = why if len(why) <= POOL_MESSAGE_MAX else why[: POOL_MESSAGE_MAX - 3] + "..."
        update = cond.ConditionUpdate(ConditionType.CONFIG_VALID, ConditionStatus.FALSE, reason, message)
    generation = body["metadata"].get("generation")
    wanted = cond.apply_conditions(stored, [update], generation=generation, now=now)
    out = changed_fields({"conditions": stored}, {"conditions": wanted})
    if out and why is not None:
        out["observedGeneration"] = generation
    return out


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
