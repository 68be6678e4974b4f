"""A BatchedModel's Ready and Progressing conditions, and kstatus' Reconciling and Stalled (pure).

The way GitOps tools read a resource's health:

* Argo CD runs the Lua health check shipped in ``deploy/argocd/health.lua`` (Ready, Progressing,
  ``observedGeneration``; https://argo-cd.readthedocs.io/en/stable/operator-manual/health/);
* Flux and kpt read kstatus: ``observedGeneration`` first, then the abnormal-true conditions
  Reconciling and Stalled (https://github.com/kubernetes-sigs/cli-utils/blob/master/pkg/kstatus/README.md).

Ready is True only when replicas serve, none is failing, every pod runs the plan's config and the SLA is not at
risk; Progressing is True while the pods move to the plan's config (Deployment-style: False, RolloutComplete, when
done). docs/operations.md ("GitOps health") states what each tool then reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from batchfill.api.reasons import ConditionReason, ConditionType, SpecReason
from batchfill.api.status import ConditionStatus
from batchfill.controller.desired import Desired
from batchfill.policy import conditions as cond
from batchfill.policy.scaling import Decision
from batchfill.render.kube import CONFIG_HASH_ANNOTATION

#: Failing pods a condition message names (the rest are counted).
NAMED_FAILING_PODS = 3


#: Ready=False reasons that waiting does not fix: kstatus' Stalled=True (the Argo CD health check in
#: deploy/argocd/health.lua reads them, and SLAAtRisk, as Degraded).
STALLED_REASONS = frozenset({*SpecReason, ConditionReason.REPLICAS_FAILING})
_SLA_AT_RISK = "; the SLA is at risk: "


def ready_condition(
    ready: int, total: int, failing: Sequence[str], *, rolling: str = "", sla_risk: str = ""
) -> cond.ConditionUpdate:
    """Ready: True only when replicas serve, none is failing, every pod runs the plan's config (``rolling``: why
    not, Progressing's message) and the SLA is not at risk (``sla_risk``: why it is)."""
    message = f"{ready}/{total} Triton replicas ready"
    reason = ConditionReason.REPLICAS_READY
    if failing:
        named = "; ".join(failing[:NAMED_FAILING_PODS])
        more = f"; and {len(failing) - NAMED_FAILING_PODS} more" if len(failing) > NAMED_FAILING_PODS else ""
        message += f"; {len(failing)} failing, no capacity until fixed: {named}{more}"
        reason = ConditionReason.REPLICAS_FAILING
    elif ready == 0:
        reason = ConditionReason.NO_READY_REPLICAS
    elif rolling:
        message += f"; {rolling}"
        reason = ConditionReason.ROLLING_OUT
    elif sla_risk:
        message += f"{_SLA_AT_RISK}{sla_risk}"
        reason = ConditionReason.SLA_AT_RISK
    ok = reason == ConditionReason.REPLICAS_READY
    return cond.ConditionUpdate(
        ConditionType.READY, ConditionStatus.TRUE if ok else ConditionStatus.FALSE, reason, message
    )


#: The reason of a Deployment's Progressing condition once its newest ReplicaSet is available: the rollout is
#: complete (https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#complete-deployment).
NEW_REPLICA_SET_AVAILABLE = "NewReplicaSetAvailable"


def rolling_out(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment controller is still rolling the pods to the newest template (the Deployment's
    ``status``): it has not observed the newest spec, pods of an older template remain, or its own Progressing
    condition does not say the newest ReplicaSet is available. A scale leaves that condition as it was, so a
    scale-out (Pending pods of the newest template) is no rollout."""
    meta, status = deployment.get("metadata") or {}, deployment.get("status") or {}
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return True
    if int(status.get("replicas") or 0) > int(status.get("updatedReplicas") or 0):
        return True
    progressing = next((c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), None)
    return progressing is not None and progressing.get("reason") != NEW_REPLICA_SET_AVAILABLE


def progressing_condition(
    deployment: Mapping[str, Any] | None, desired: Desired, *, rolled_back: bool = False
) -> cond.ConditionUpdate:
    """Progressing: True while the pods move to the plan's config (the Deployment not applied with it yet, or its
    controller still replacing pods, :func:`rolling_out`), False once every
    pod runs it. A hand rollback that holds (``rolled_back``, ``ConfigApplied=False``) is what the pods should
    run meanwhile."""
    if deployment is None:
        return cond.ConditionUpdate(
            ConditionType.PROGRESSING, ConditionStatus.TRUE, ConditionReason.ROLLING_OUT,
            f"config {desired.config_hash}: the Triton Deployment is not created yet",
        )  # fmt: skip
    template = (deployment.get("spec") or {}).get("template") or {}
    served = str(((template.get("metadata") or {}).get("annotations") or {}).get(CONFIG_HASH_ANNOTATION) or "")
    if served != desired.config_hash and not rolled_back:
        return cond.ConditionUpdate(
            ConditionType.PROGRESSING, ConditionStatus.TRUE, ConditionReason.ROLLING_OUT,
            f"config {served or '(none)'} -> {desired.config_hash}: the Deployment is applied next",
        )  # fmt: skip
    if rolling_out(deployment):
        dep_status = deployment.get("status") or {}
        wanted = int((deployment.get("spec") or {}).get("replicas") or 0)
        updated, available = (int(dep_status.get(k) or 0) for k in ("updatedReplicas", "availableReplicas"))
        return cond.ConditionUpdate(
            ConditionType.PROGRESSING, ConditionStatus.TRUE, ConditionReason.ROLLING_OUT,
            f"config {served}: {updated}/{wanted} pods updated, {available} available",
        )  # fmt: skip
    return cond.ConditionUpdate(
        ConditionType.PROGRESSING, ConditionStatus.FALSE, ConditionReason.ROLLOUT_COMPLETE,
        f"config {served} on every pod",
    )  # fmt: skip


def kstatus_conditions(
    ready: cond.ConditionUpdate, progressing: cond.ConditionUpdate
) -> tuple[list[cond.ConditionUpdate], list[str]]:
    """kstatus' abnormal-true conditions from Ready and Progressing: (the ones to set, the types to remove).

    Stalled=True while Ready is False for a reason in :data:`STALLED_REASONS`; otherwise Reconciling=True while
    Progressing is True or no replica is Ready yet. Each is removed while it would be False, which kstatus reads
    the same (https://github.com/kubernetes-sigs/cli-utils/blob/master/pkg/kstatus/README.md).
    """
    updates: list[cond.ConditionUpdate] = []
    stalled = ready.status != ConditionStatus.TRUE and ready.reason in STALLED_REASONS
    if stalled:
        updates.append(cond.ConditionUpdate(ConditionType.STALLED, ConditionStatus.TRUE, ready.reason, ready.message))
    elif progressing.status == ConditionStatus.TRUE:
        updates.append(
            cond.ConditionUpdate(
                ConditionType.RECONCILING, ConditionStatus.TRUE, progressing.reason, progressing.message
            )
        )
    elif ready.reason == ConditionReason.NO_READY_REPLICAS:
        updates.append(
            cond.ConditionUpdate(ConditionType.RECONCILING, ConditionStatus.TRUE, ready.reason, ready.message)
        )
    set_types = {u.type for u in updates}
    return updates, [t for t in (ConditionType.STALLED, ConditionType.RECONCILING) if t not in set_types]


def sla_risk(decision: Decision) -> str:
    """Why a scaling decision puts the SLA at risk (empty: it does not): the load wants more replicas than can run,
    or the observed p99 is over the server budget."""
    if decision.capacity_limited or decision.sla_at_risk:
        return f"{decision.reason}: {decision.message}"
    return ""


def stored_sla_risk(status: Mapping[str, Any]) -> str:
    """The SLA risk the stored Ready condition carries (a handler's reconcile keeps the scaling tick's verdict)."""
    ready = cond.find(status.get("conditions"), ConditionType.READY) or {}
    if ready.get("reason") != ConditionReason.SLA_AT_RISK:
        return ""
    return str(ready.get("message") or "").partition(_SLA_AT_RISK)[2] or "see the scaling condition"
