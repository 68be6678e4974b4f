"""Ready, Progressing and kstatus' Reconciling/Stalled of a served plan, from the Deployment as its controller reports
it (controller/readiness.py): Ready is False during a rollout, while a pod fails and while the SLA is at risk."""

from __future__ import annotations

from typing import Any

from batchfill.api.errors import Problem, SpecError
from batchfill.api.reasons import ConditionReason, ConditionType, ScalingReason, SpecReason
from batchfill.controller.desired import desired_state
from batchfill.controller.readiness import rolling_out, sla_risk
from batchfill.controller.status import desired_status, rejection_status
from batchfill.policy.conditions import find
from batchfill.policy.scaling import Decision
from batchfill.render.kube import CONFIG_HASH_ANNOTATION

from .conftest import SEED_DOC
from .test_conditions_and_status import body, served_by

T0 = 1_795_000_000.0


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def _rolling(desired: Any, *, old_pods: int, new_pods: int, reason: str = "ReplicaSetUpdated") -> dict[str, Any]:
    dep = served_by(desired, replicas=new_pods, ready=new_pods + old_pods)
    dep["status"] |= {"replicas": new_pods + old_pods, "updatedReplicas": new_pods, "availableReplicas": old_pods}
    dep["status"]["conditions"][0]["reason"] = reason
    return dep


def test_a_complete_rollout_is_ready_and_not_progressing() -> None:
    b = body(SEED_DOC)
    desired = desired_state(b["spec"])
    status = desired_status(b, desired, served_by(desired, replicas=2, ready=2), now=T0)
    conds = _conditions(status)
    assert conds[ConditionType.READY] == ("True", ConditionReason.REPLICAS_READY)
    assert conds[ConditionType.PROGRESSING] == ("False", ConditionReason.ROLLOUT_COMPLETE)
    assert ConditionType.RECONCILING not in conds
    assert ConditionType.STALLED not in conds
    assert all(c["observedGeneration"] == b["metadata"]["generation"] for c in status["conditions"])


def test_a_rollout_is_progressing_and_not_ready_until_the_new_pods_are_available() -> None:
    b = body(SEED_DOC)
    desired = desired_state(b["spec"])
    status = desired_status(b, desired, _rolling(desired, old_pods=1, new_pods=1), now=T0)
    conds = _conditions(status)
    assert conds[ConditionType.READY] == ("False", ConditionReason.ROLLING_OUT)
    assert conds[ConditionType.PROGRESSING] == ("True", ConditionReason.ROLLING_OUT)
    assert conds[ConditionType.RECONCILING] == ("True", ConditionReason.ROLLING_OUT)
    progressing = find(status["conditions"], ConditionType.PROGRESSING)
    assert progressing is not None
    assert progressing["message"] == f"config {desired.config_hash}: 1/1 pods updated, 1 available"

    # the old pod gone, the new one not yet available: the Deployment's own condition still says so
    dep = _rolling(desired, old_pods=0, new_pods=1)
    assert rolling_out(dep)
    dep["status"]["conditions"][0]["reason"] = "NewReplicaSetAvailable"
    assert not rolling_out(dep)


def test_a_deployment_still_on_the_old_config_is_progressing() -> None:
    b = body(SEED_DOC)
    desired = desired_state(b["spec"])
    dep = served_by(desired, replicas=1, ready=1)
    dep["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] = "0ld"
    conds = _conditions(desired_status(b, desired, dep, now=T0))
    assert conds[ConditionType.PROGRESSING] == ("True", ConditionReason.ROLLING_OUT)
    assert conds[ConditionType.READY] == ("False", ConditionReason.ROLLING_OUT)


def test_a_scale_out_is_no_rollout() -> None:
    b = body(SEED_DOC)
    desired = desired_state(b["spec"])
    dep = served_by(desired, replicas=3, ready=1)  # two new pods Pending, of the newest template
    dep["status"] |= {"replicas": 3, "updatedReplicas": 3, "availableReplicas": 1}
    conds = _conditions(desired_status(b, desired, dep, now=T0))
    assert conds[ConditionType.PROGRESSING] == ("False", ConditionReason.ROLLOUT_COMPLETE)
    assert conds[ConditionType.READY] == ("True", ConditionReason.REPLICAS_READY)


def test_no_ready_replica_yet_is_reconciling_not_stalled() -> None:
    b = body(SEED_DOC)
    desired = desired_state(b["spec"])
    conds = _conditions(desired_status(b, desired, served_by(desired, replicas=1, ready=0), now=T0))
    assert conds[ConditionType.READY] == ("False", ConditionReason.NO_READY_REPLICAS)
    assert conds[ConditionType.RECONCILING] == ("True", ConditionReason.NO_READY_REPLICAS)
    assert ConditionType.STALLED not in conds


def test_a_failing_pod_is_not_ready_and_stalled() -> None:
    b = body(SEED_DOC)
    desired = desired_state(b["spec"])
    dep = served_by(desired, replicas=2, ready=1)
    status = desired_status(b, desired, dep, now=T0, failing=["m-1: CrashLoopBackOff (triton: Error)"])
    conds = _conditions(status)
    assert conds[ConditionType.READY] == ("False", ConditionReason.REPLICAS_FAILING)
    assert conds[ConditionType.STALLED] == ("True", ConditionReason.REPLICAS_FAILING)
    assert ConditionType.RECONCILING not in conds

    # fixed: Stalled goes (kstatus reads an absent abnormal-true condition as False)
    again = desired_status(body(SEED_DOC, status=status), desired, served_by(desired, replicas=2, ready=2), now=T0)
    conds = _conditions(again)
    assert conds[ConditionType.READY] == ("True", ConditionReason.REPLICAS_READY)
    assert ConditionType.STALLED not in conds


def _decision(**kw: Any) -> Decision:
    return Decision(3, 3, 4, ScalingReason.AT_MAX_REPLICAS, "needs 4 replicas, maxReplicas is 3", (), **kw)


def test_the_sla_at_risk_is_not_ready_and_a_handler_keeps_the_ticks_verdict() -> None:
    b = body(SEED_DOC)
    desired = desired_state(b["spec"])
    dep = served_by(desired, replicas=3, ready=3)
    risk = sla_risk(_decision(capacity_limited=True))
    assert risk == "AtMaxReplicas: needs 4 replicas, maxReplicas is 3"
    assert sla_risk(_decision()) == ""
    assert sla_risk(_decision(sla_at_risk=True)) == risk
    status = desired_status(b, desired, dep, now=T0, sla_risk=risk)
    ready = find(status["conditions"], ConditionType.READY)
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", ConditionReason.SLA_AT_RISK)
    assert ready["message"] == "3/3 Triton replicas ready; the SLA is at risk: " + risk
    assert ConditionType.STALLED not in _conditions(status), "waiting for load to fall is no stall"

    # a handler's reconcile (no decision) keeps it; the next tick's decision clears it
    handled = desired_status(body(SEED_DOC, status=status), desired, dep, now=T0)
    assert find(handled["conditions"], ConditionType.READY) == ready
    cleared = desired_status(body(SEED_DOC, status=status), desired, dep, now=T0, sla_risk="")
    assert _conditions(cleared)[ConditionType.READY] == ("True", ConditionReason.REPLICAS_READY)


def test_a_rejected_spec_is_stalled_and_not_progressing() -> None:
    err = SpecError([Problem("spec.sla.latencyP99Ms", "below l(1)")], reason=SpecReason.SLA_INFEASIBLE)
    status = rejection_status(err, {}, 3, T0)
    conds = _conditions(status)
    assert conds[ConditionType.READY] == ("False", SpecReason.SLA_INFEASIBLE)
    assert conds[ConditionType.PROGRESSING] == ("False", SpecReason.SLA_INFEASIBLE)
    assert conds[ConditionType.STALLED] == ("True", SpecReason.SLA_INFEASIBLE)
    assert ConditionType.RECONCILING not in conds
    assert status["observedGeneration"] == 3
