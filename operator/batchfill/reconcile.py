"""One reconcile path for create, update and resume: gather -> plan -> act. No decorators (see handlers.py).

* plan: validate the spec, derive the batching plan, render config.pbtxt and the children (pure; the plan is
  cached by spec, so a resume or a status-only event does not re-simulate);
* gather: read what exists (the Deployment's replicas, whether ServiceMonitor is served);
* act: server-side apply the children (an unchanged child is a no-op on the server), then compute the status
  and return only the fields that differ from the stored status, so an idle system writes nothing.

An invalid or infeasible spec writes its conditions, emits one Warning event per generation and raises
:class:`SpecRejectedError`; the handler turns that into ``kopf.PermanentError`` (no retry loop, CASES C18).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from batchfill.adapters.kube import Kube, KubeNotFoundError
from batchfill.api.errors import SpecError
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.status import PlanStatus
from batchfill.api.validate import load_model
from batchfill.policy import conditions as cond
from batchfill.policy.plan import PlanResult, plan_batching
from batchfill.render import config_hash, render_model_config
from batchfill.render.kube import (
    Owner,
    build_configmap,
    build_deployment,
    build_service,
    build_service_monitor,
    names,
)

#: emit(type, reason, message): posts a Kubernetes Event on the BatchedModel.
Emit = Callable[[str, str, str], None]
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")


class SpecRejectedError(Exception):
    """The spec cannot be served; ``status`` holds the conditions to write."""

    def __init__(self, message: str, status: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Desired:
    """Everything derived from the spec alone."""

    spec: BatchedModelSpec
    plan: PlanResult
    plan_status: PlanStatus
    config: str
    config_hash: str


@functools.lru_cache(maxsize=512)
def _plan_cached(spec_json: str) -> tuple[BatchedModelSpec, PlanResult, str]:
    bm = load_model({"apiVersion": "batchfill.io/v1alpha1", "kind": "BatchedModel", "spec": json.loads(spec_json)})
    result = plan_batching(bm.spec)
    return bm.spec, result, render_model_config(bm.spec, result.to_status())


def desired_state(spec: Mapping[str, Any]) -> Desired:
    """Validate, plan and render. Raises SpecError (field-named problems) for a spec that cannot be served."""
    model, result, config = _plan_cached(json.dumps(spec, sort_keys=True, default=str))
    return Desired(model, result, result.to_status(), config, config_hash(config))


def rejection_status(err: SpecError, status: Mapping[str, Any], generation: int | None, now: float) -> dict[str, Any]:
    """Conditions for a spec that cannot be served (the fields named in the message)."""
    message = "; ".join(str(p) for p in err.problems)
    infeasible = err.reason == "SLAInfeasible"
    updates = [
        cond.ConditionUpdate(
            cond.CONFIG_VALID,
            cond.TRUE if infeasible else cond.FALSE,
            "Valid" if infeasible else err.reason,
            "" if infeasible else message,
        ),
        cond.ConditionUpdate(
            cond.SLA_FEASIBLE,
            cond.FALSE if infeasible else cond.UNKNOWN,
            err.reason if infeasible else "InvalidSpec",
            message if infeasible else "",
        ),
        cond.ConditionUpdate(cond.PLANNED, cond.FALSE, err.reason, message),
        cond.ConditionUpdate(cond.READY, cond.FALSE, err.reason, "the spec cannot be served; see Planned"),
    ]
    return {
        "observedGeneration": generation,
        "conditions": cond.apply_conditions(status.get("conditions"), updates, generation=generation, now=now),
    }


def changed_fields(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level status fields of ``wanted`` that differ from ``current`` (empty: write nothing)."""
    return {k: v for k, v in wanted.items() if current.get(k) != v}


def reconcile(body: Mapping[str, Any], kube: Kube, *, now: float, emit: Emit) -> dict[str, Any]:
    """Bring the children in line with the spec; return the status fields to patch (possibly none).

    Raises:
        SpecRejectedError: invalid or infeasible spec (its conditions are in the exception).
        KubeTemporaryError / KubePermanentError: from the API (adapters.kube).
    """
    meta, spec = body["metadata"], body.get("spec") or {}
    status: Mapping[str, Any] = body.get("status") or {}
    generation = meta.get("generation")
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    try:
        desired = desired_state(spec)
    except SpecError as err:
        rejected = rejection_status(err, status, generation, now)
        previous = cond.find(status.get("conditions"), cond.PLANNED)
        message = "; ".join(str(p) for p in err.problems)
        if not (previous and previous.get("observedGeneration") == generation and previous.get("message") == message):
            emit("Warning", err.reason, message)  # once per generation, not on every resume
        raise SpecRejectedError(message, rejected) from None

    # gather
    existing = kube.get("apps/v1", "Deployment", names(owner)["deployment"], owner.namespace)
    replicas = (existing or {}).get("spec", {}).get("replicas")
    if replicas is None:
        replicas = desired.spec.scaling.minReplicas
    with_monitor = kube.has_kind(*SERVICE_MONITOR)

    # act
    kube.apply(build_configmap(owner, desired.config, desired.config_hash))
    deployment = kube.apply(build_deployment(owner, desired.spec, desired.config_hash, replicas))
    kube.apply(build_service(owner))
    if with_monitor:
        _apply_service_monitor(kube, owner)
    old_hash = ((existing or {}).get("spec", {}).get("template", {}).get("metadata", {}).get("annotations") or {}).get(
        "batchfill.io/config-hash"
    )
    if existing is None:
        emit("Normal", "Deployed", f"created Triton Deployment with config {desired.config_hash}")
    elif old_hash != desired.config_hash:
        emit("Normal", "ConfigChanged", f"config.pbtxt {old_hash} -> {desired.config_hash}: rolling the pods once")

    wanted = desired_status(body, desired, deployment, now=now)
    return changed_fields(status, wanted)


def _apply_service_monitor(kube: Kube, owner: Owner) -> None:
    try:
        kube.apply(build_service_monitor(owner))
    except KubeNotFoundError:  # the prometheus-operator CRD went away after discovery cached it
        kube.forget_kinds()


def desired_status(
    body: Mapping[str, Any], desired: Desired, deployment: Mapping[str, Any] | None, *, now: float
) -> dict[str, Any]:
    """The status a reconciled BatchedModel should have."""
    meta = body["metadata"]
    status: Mapping[str, Any] = body.get("status") or {}
    generation = meta.get("generation")
    dep_status = (deployment or {}).get("status") or {}
    ready = int(dep_status.get("readyReplicas") or 0)
    total = int(dep_status.get("replicas") or 0)
    plan = desired.plan_status
    updates = [
        cond.ConditionUpdate(cond.CONFIG_VALID, cond.TRUE, "Valid"),
        cond.ConditionUpdate(
            cond.SLA_FEASIBLE,
            cond.TRUE,
            "Feasible",
            f"capacity {plan.capacityPerReplicaRps:g} req/s per replica within {plan.serverBudgetMs:g} ms",
        ),
        cond.ConditionUpdate(
            cond.PLANNED,
            cond.TRUE,
            "Planned",
            f"max_batch_size {plan.maxBatchSize}, max_queue_delay_microseconds "
            f"{plan.maxQueueDelayMicroseconds}, config {desired.config_hash}",
        ),
        cond.ConditionUpdate(
            cond.READY,
            cond.TRUE if ready > 0 else cond.FALSE,
            "ReplicasReady" if ready > 0 else "NoReadyReplicas",
            f"{ready}/{total} Triton replicas ready",
        ),
    ]
    warnings = [w for w in desired.plan.warnings if w.condition == cond.BATCHING_EFFECTIVE]
    if warnings:
        updates.append(
            cond.ConditionUpdate(cond.BATCHING_EFFECTIVE, cond.UNKNOWN, warnings[0].reason, warnings[0].message)
        )
    conditions = cond.apply_conditions(
        status.get("conditions"),
        updates,
        generation=generation,
        now=now,
        remove=() if warnings else (cond.BATCHING_EFFECTIVE,),
    )
    return {
        "observedGeneration": generation,
        "conditions": conditions,
        "plan": plan.model_dump(mode="json", exclude_none=True),
        "replicas": total,
        "readyReplicas": ready,
    }


def refresh_status(body: Mapping[str, Any], kube: Kube, *, now: float) -> dict[str, Any]:
    """Periodic status refresh (replica counts, Ready) without touching the children.

    Only for a BatchedModel whose current generation was planned; returns the fields to patch (often none).
    """
    meta = body["metadata"]
    status: Mapping[str, Any] = body.get("status") or {}
    planned = cond.find(status.get("conditions"), cond.PLANNED)
    if not planned or planned.get("status") != cond.TRUE or status.get("observedGeneration") != meta.get("generation"):
        return {}
    try:
        desired = desired_state(body.get("spec") or {})
    except SpecError:
        return {}
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    # prometheus-operator installed after the BatchedModel: its ServiceMonitor appears on the next ticks
    if (
        kube.has_kind(*SERVICE_MONITOR)
        and kube.get(*SERVICE_MONITOR, names(owner)["servicemonitor"], owner.namespace) is None
    ):
        _apply_service_monitor(kube, owner)
    deployment = kube.get("apps/v1", "Deployment", names(owner)["deployment"], owner.namespace)
    return changed_fields(status, desired_status(body, desired, deployment, now=now))
