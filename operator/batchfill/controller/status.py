"""A BatchedModel's status as the controller writes it, and the readings of its children it is computed from (pure).

Nothing here reads or writes: the inputs are objects as the API (or the informer caches of
:mod:`batchfill.adapters.informer`) returns them, and the outputs are status fields, conditions and counts.
Status is always compared with what is stored (:func:`changed_fields`), so an idle system writes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from batchfill.api.errors import SpecError
from batchfill.api.reasons import ConditionReason, ConditionType, SpecReason
from batchfill.api.status import ConditionStatus, PlannedProfileSource
from batchfill.controller.desired import Desired, profile_hash
from batchfill.controller.readiness import (
    kstatus_conditions,
    progressing_condition,
    ready_condition,
    stored_sla_risk,
)
from batchfill.controller.rollout import rollout_in_progress, rolls_in_place
from batchfill.policy import conditions as cond
from batchfill.policy.plan import PlanWarning, significant
from batchfill.policy.scaling import Decision, Recommendation
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.render.kube import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_HASH_FIELD,
    CONFIG_NAME_INFIX,
    FIELD_MANAGER,
    REPLICAS_FIELD,
    managed_field,
    template_config_name,
)

_OBSERVED_DIGITS = 3  # significant digits of status.observed: finer noise would rewrite status every tick


def rejection_status(err: SpecError, status: Mapping[str, Any], generation: int | None, now: float) -> dict[str, Any]:
    """Conditions for a spec that cannot be served (the fields named in the message)."""
    message = "; ".join(str(p) for p in err.problems)
    infeasible = err.reason == SpecReason.SLA_INFEASIBLE
    updates = [
        cond.ConditionUpdate(
            ConditionType.CONFIG_VALID,
            ConditionStatus.TRUE if infeasible else ConditionStatus.FALSE,
            ConditionReason.VALID if infeasible else err.reason,
            "" if infeasible else message,
        ),
        cond.ConditionUpdate(
            ConditionType.SLA_FEASIBLE,
            ConditionStatus.FALSE if infeasible else ConditionStatus.UNKNOWN,
            err.reason if infeasible else SpecReason.INVALID_SPEC,
            message if infeasible else "",
        ),
        cond.ConditionUpdate(ConditionType.PLANNED, ConditionStatus.FALSE, err.reason, message),
        cond.ConditionUpdate(
            ConditionType.READY, ConditionStatus.FALSE, err.reason, "the spec cannot be served; see Planned"
        ),
        cond.ConditionUpdate(
            ConditionType.PROGRESSING, ConditionStatus.FALSE, err.reason, "the spec cannot be served; see Planned"
        ),
    ]
    extra, remove = kstatus_conditions(updates[-2], updates[-1])
    return {
        "observedGeneration": generation,
        "conditions": cond.apply_conditions(
            status.get("conditions"), [*updates, *extra], generation=generation, now=now, remove=remove
        ),
    }


def as_stored(value: Any) -> Any:
    """``value`` as the API server stores it after a merge patch: None members of objects are removed."""
    if isinstance(value, Mapping):
        return {k: as_stored(v) for k, v in value.items() if v is not None}
    return value


def changed_fields(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level status fields of ``wanted`` that differ from ``current`` (empty: write nothing).

    A None (here or inside an object) removes the field in the merge patch, so it equals an absent one.
    """
    return {k: v for k, v in wanted.items() if as_stored(current.get(k)) != as_stored(v)}


def planned_plan_warnings(desired: Desired) -> list[PlanWarning]:
    """The plan's warnings that the Planned condition carries (reason: the first one's; message: all of them),
    e.g. MaxBatchSizeCapped; BatchingEffective carries its own."""
    return [w for w in desired.plan.warnings if w.condition == ConditionType.PLANNED]


def _reconciled_conditions(
    desired: Desired,
    ready: int,
    total: int,
    failing: Sequence[str] = (),
    *,
    deployment: Mapping[str, Any] | None = None,
    sla_risk: str = "",
) -> list[cond.ConditionUpdate]:
    """ConfigValid, SLAFeasible, Planned, Ready and Progressing of a spec whose plan is served (``failing``: the
    failing pods, ``"<pod>: <reason>"`` each, which Ready names; ``deployment``: the Triton Deployment, whose
    rollout Progressing reports; ``sla_risk``: :func:`sla_risk`)."""
    rolled_back = bool(hand_rollback(deployment, desired)[0])
    progressing = progressing_condition(deployment, desired, rolled_back=rolled_back)
    rolling = progressing.message if progressing.status == ConditionStatus.TRUE else ""
    plan = desired.plan_status
    first = desired.profile_source == PlannedProfileSource.FIRST_PLAN
    planned_warnings = planned_plan_warnings(desired)
    settings = (
        f"max_batch_size {plan.maxBatchSize}, max_queue_delay_microseconds {plan.maxQueueDelayMicroseconds}, "
        f"config {desired.config_hash}"
    )
    return [
        cond.ConditionUpdate(ConditionType.CONFIG_VALID, ConditionStatus.TRUE, ConditionReason.VALID),
        cond.ConditionUpdate(
            ConditionType.SLA_FEASIBLE,
            ConditionStatus.UNKNOWN,
            ConditionReason.PROFILE_NOT_MEASURED,
            "no profile yet: measuring execution latency per batch size from Triton's statistics",
        )
        if first
        else cond.ConditionUpdate(
            ConditionType.SLA_FEASIBLE,
            ConditionStatus.TRUE,
            ConditionReason.FEASIBLE,
            f"capacity {plan.capacityPerReplicaRps:g} req/s per replica within {plan.serverBudgetMs:g} ms",
        ),
        cond.ConditionUpdate(
            ConditionType.PLANNED,
            ConditionStatus.TRUE,
            planned_warnings[0].reason
            if planned_warnings
            else (
                ConditionReason.FIRST_PLAN
                if first
                else (
                    ConditionReason.PLANNED_FROM_MEASURED_PROFILE
                    if desired.profile_source == PlannedProfileSource.MEASURED
                    else ConditionReason.PLANNED
                )
            ),
            "; ".join(
                [f"{settings}; capacity unknown until the profile is measured" if first else settings]
                + [f"warning: {w.message}" for w in planned_warnings]
            ),
        ),
        ready_condition(ready, total, failing, rolling=rolling, sla_risk=sla_risk),
        progressing,
    ]


def desired_status(
    body: Mapping[str, Any],
    desired: Desired,
    deployment: Mapping[str, Any] | None,
    *,
    now: float,
    extra: Sequence[cond.ConditionUpdate] = (),
    failing: Sequence[str] = (),
    sla_risk: str | None = None,
) -> dict[str, Any]:
    """The status a reconciled BatchedModel should have.

    Args:
        body: the BatchedModel as read (its stored status keeps the conditions' transition times).
        desired: :func:`batchfill.controller.desired.desired_state` of its spec.
        deployment: the Triton Deployment as the API returns it (its ``status`` counts replicas), or None.
        now: seconds since the epoch (new conditions' lastTransitionTime).
        extra: further conditions (the scaling tick's MetricsAvailable, CapacityLimited, BatchingEffective).
        failing: the pods that will not become Ready by waiting (``PodCounts.failing``), named by Ready.
        sla_risk: why the scaling decision puts the SLA at risk (:func:`sla_risk`, empty: it does not); None (a
            handler, no decision): what the stored Ready says.
    """
    meta = body["metadata"]
    status: Mapping[str, Any] = body.get("status") or {}
    generation = meta.get("generation")
    dep_status = (deployment or {}).get("status") or {}
    ready = int(dep_status.get("readyReplicas") or 0)
    total = int(dep_status.get("replicas") or 0)
    risk = stored_sla_risk(status) if sla_risk is None else sla_risk
    reconciled = _reconciled_conditions(desired, ready, total, failing, deployment=deployment, sla_risk=risk)
    kstatus, kstatus_removed = kstatus_conditions(reconciled[-2], reconciled[-1])
    updates = [*reconciled, *kstatus, *extra]
    batching = ConditionType.BATCHING_EFFECTIVE
    warnings = [w for w in desired.plan.warnings if w.condition == batching]
    if warnings:
        updates.append(cond.ConditionUpdate(batching, ConditionStatus.UNKNOWN, warnings[0].reason, warnings[0].message))
    applied = config_applied_condition(hand_rollback(deployment, desired), desired)
    if applied is not None:
        updates.append(applied)
    remove = [*kstatus_removed, *([] if warnings or any(u.type == batching for u in extra) else [batching])]
    conditions = cond.apply_conditions(
        status.get("conditions"),
        updates,
        generation=generation,
        now=now,
        remove=remove if applied is not None else [*remove, ConditionType.CONFIG_APPLIED],
    )
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions,
        "plan": desired.plan_status.model_dump(mode="json", exclude_none=True),
        "replicas": total,
        "readyReplicas": ready,
    }
    # a measured profile in use is written by the profiling loop
    if desired.profile_source != PlannedProfileSource.MEASURED:
        # every field, as the API server stores it (CRD defaults included): a partial object would never compare
        # equal (a no-op PATCH every pass), and a merge patch would leave an older measurement's fields behind.
        # ``since`` (the last adoption of a measurement) is kept: editing spec.profile must not restart the
        # replan interval, or each edit would let a measurement replace the new profile at once.
        out["plannedProfile"] = {
            "source": desired.profile_source,
            "points": [],
            "since": (status.get("plannedProfile") or {}).get("since"),
            "reason": "",
            "message": "",
            "declaredHash": profile_hash((body.get("spec") or {}).get("profile")),
        }
    return out


# -- readings of the children ------------------------------------------------------------------------------------


def _template(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((deployment.get("spec") or {}).get("template")) or {}


def field_managers(deployment: Mapping[str, Any], path: Sequence[str]) -> list[str]:
    """The field managers whose ``managedFields`` entry owns the field at ``path`` (a ``fieldsV1`` path such as
    ``render.kube.REPLICAS_FIELD``); empty when none does."""
    entries = (deployment.get("metadata") or {}).get("managedFields") or []
    return [str(e.get("manager") or "?") for e in entries if managed_field(e.get("fieldsV1"), path) is not None]


def config_hash_managers(deployment: Mapping[str, Any]) -> list[str]:
    """The field managers that own the pod template's config-hash annotation (its managedFields)."""
    return field_managers(deployment, CONFIG_HASH_FIELD)


def hand_rollback(deployment: Mapping[str, Any] | None, desired: Desired) -> tuple[str, str]:
    """(config hash, who) when a person rolled the Deployment back to another of the model's configs (``kubectl
    rollout undo``, field manager ``kubectl``), else ("", "").

    A rollback is a template whose config differs from the plan's, whose config-hash annotation batchfill no
    longer owns (a write by another manager took it, https://kubernetes.io/docs/reference/using-api/server-side-apply/#field-management),
    and whose config volume mounts the ConfigMap of that very hash (one batchfill rendered, not a hand edit of
    the annotation). batchfill leaves it until the next spec change: reverting it would undo the person's fix.
    """
    if deployment is None:
        return "", ""
    template = _template(deployment)
    served = str(((template.get("metadata") or {}).get("annotations") or {}).get(CONFIG_HASH_ANNOTATION) or "")
    managers = config_hash_managers(deployment)
    mounted = template_config_name(template.get("spec")) or ""
    if (
        not served
        or served == desired.config_hash
        or not managers
        or FIELD_MANAGER in managers
        or not mounted.endswith(f"{CONFIG_NAME_INFIX}{served}")
    ):
        return "", ""
    return served, ", ".join(managers)


def config_applied_condition(rollback: tuple[str, str], desired: Desired) -> cond.ConditionUpdate | None:
    """ConfigApplied=False while a hand rollback holds (None otherwise: the condition is then removed)."""
    served, who = rollback
    if not served:
        return None
    return cond.ConditionUpdate(
        ConditionType.CONFIG_APPLIED,
        ConditionStatus.FALSE,
        ConditionReason.ROLLED_BACK_BY_HAND,
        f"the pods run config {served}, set by {who} (kubectl rollout undo, or an edit), not the plan's "
        f"{desired.config_hash}; batchfill leaves it until the spec changes",
    )


def children_drift(deployment: Mapping[str, Any] | None, desired: Desired, status: Mapping[str, Any]) -> str:
    """Why the children no longer serve the handled spec (empty: they do).

    The create/update handlers apply the children once per generation; a Deployment deleted or re-templated by
    hand, or a measured profile adopted in status whose apply then failed (API down, operator killed between the
    two writes), would otherwise wait for the next spec change or operator restart: status writes start no
    handler. Only called once the current generation has been handled.
    """
    if deployment is None:
        return "the Triton Deployment is missing (deleted outside batchfill)"
    served = ((_template(deployment).get("metadata") or {}).get("annotations") or {}).get(CONFIG_HASH_ANNOTATION)
    if served != desired.config_hash and not hand_rollback(deployment, desired)[0]:
        return f"the Deployment's pods carry config {served}, the plan's is {desired.config_hash}"
    wanted = desired.plan_status.model_dump(mode="json", exclude_none=True)
    if as_stored(status.get("plan")) != as_stored(wanted):
        return "status.plan is not the plan of the adopted profile yet"
    if rolls_in_place(deployment) and not rollout_in_progress(deployment):
        return "the in-place rollout is complete: the surge strategy comes back"
    return _left_pool(deployment, status)


def on_pool_copies(placed: Mapping[str, Any]) -> bool:
    """Whether ``status.placement`` (as stored) names a pool and counts copies of the model on its pods."""
    return bool(placed.get("pool")) and bool(placed.get("podCount"))


def _left_pool(deployment: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    """Why the Service must move from the pool's copies to the model's own replicas now (empty: it need not).

    While a model leaves its GPUPool, its Service stays on the pool copies until a replica of its own is Ready
    (:func:`batchfill.controller.reconcile.reconcile`), and the pool keeps those copies until
    ``status.readyReplicas`` counts one. A status refresh alone would write that count and let the pool drop its
    copies while the Service still selects them (every request failing until some later re-apply): so the first
    tick that sees an own replica Ready re-applies the children, which moves the Service, then writes the count.
    """
    ready = int(((deployment.get("status") or {}).get("readyReplicas")) or 0)
    if on_pool_copies(status.get("placement") or {}) and ready and not status.get("readyReplicas"):
        return f"{ready} replica(s) of its own are Ready while its pool's copies serve it: its Service moves to them"
    return ""


def replicas_managers(deployment: Mapping[str, Any]) -> list[str]:
    """The field managers that own the Deployment's ``spec.replicas`` (its managedFields; empty when none does).

    Who set the count tells a hand edit (``kubectl``, ``kubectl-edit``, another controller) from batchfill's own
    scale that status recorded but the Deployment never got (the operator killed between the status write and the
    scale call, or the scale refused): then batchfill still owns the field, at its older value.
    """
    return field_managers(deployment, REPLICAS_FIELD)


# -- the scaling tick's status -----------------------------------------------------------------------------------


def _rounded(x: float | None) -> float | None:
    return None if x is None else significant(x, _OBSERVED_DIGITS)


def observed_status(signals: ModelSignals) -> dict[str, float | None] | None:
    """``status.observed``, rounded; None (the field removed) when the signals are unknown: unknown is not zero.

    Values not measured in the window are None, so a merge patch removes what an earlier tick wrote.
    """
    if signals.state == SignalState.UNKNOWN:
        return None
    return {
        "requestRate": _rounded(signals.request_rate_rps),
        "avgBatchSize": _rounded(signals.avg_batch_size),
        "batchFill": _rounded(signals.batch_fill),
        "queueTimeMs": _rounded(signals.queue_time_ms),
        "p99Ms": _rounded(signals.p99_ms),
        "rateVariability": _rounded(signals.rate_change_rms),
    }


def stored_votes(stored: Any) -> tuple[Recommendation, ...]:
    """status.scalingHistory as votes; malformed entries (a hand-edited status) are skipped."""
    out = []
    for v in stored if isinstance(stored, list) else []:
        try:
            t = cond.parse_rfc3339(v.get("time"))
            replicas, ready = int(v["replicas"]), int(v["ready"])
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
        if t is not None and math.isfinite(t) and replicas >= 0 and ready >= 0:
            out.append(Recommendation(t, replicas, ready))
    return tuple(sorted(out))


def scaling_conditions(decision: Decision, signals: ModelSignals) -> list[cond.ConditionUpdate]:
    """MetricsAvailable (first), CapacityLimited and, at low concurrency, BatchingEffective=False of one decision."""
    if decision.metrics_available:
        ok = signals.state == SignalState.IDLE
        metrics = cond.ConditionUpdate(
            ConditionType.METRICS_AVAILABLE,
            ConditionStatus.TRUE,
            ConditionReason.IDLE if ok else ConditionReason.SIGNALS_OK,
            f"{signals.pods} Ready pod(s) reporting" + (", no traffic" if ok else ""),
        )
    else:
        metrics = cond.ConditionUpdate(
            ConditionType.METRICS_AVAILABLE,
            ConditionStatus.FALSE,
            signals.reason or ConditionReason.NO_DATA,
            f"{signals.message or 'no usable signals'}; replicas are held",
        )
    if decision.pending_replicas:
        limited = cond.ConditionUpdate(
            ConditionType.CAPACITY_LIMITED,
            ConditionStatus.TRUE,
            ConditionReason.REPLICAS_PENDING,
            f"{decision.pending_replicas} replica(s) cannot be scheduled: {decision.pending_reason}",
        )
    elif decision.capacity_limited:
        limited = cond.ConditionUpdate(
            ConditionType.CAPACITY_LIMITED,
            ConditionStatus.TRUE,
            ConditionReason.AT_MAX_REPLICAS,
            "the load needs more than maxReplicas",
        )
    else:
        limited = cond.ConditionUpdate(
            ConditionType.CAPACITY_LIMITED, ConditionStatus.FALSE, ConditionReason.WITHIN_CAPACITY, ""
        )
    updates = [metrics, limited]
    # batches of about one request that wait the whole queue delay mean the clients send one request at a time:
    # more GPUs would not help, so the status says why batching does nothing (policy/scaling.py, low concurrency)
    if decision.low_concurrency:
        updates.append(
            cond.ConditionUpdate(
                ConditionType.BATCHING_EFFECTIVE,
                ConditionStatus.FALSE,
                ConditionReason.LOW_CONCURRENCY,
                "batches average under 1.5 requests and requests wait about the configured queue delay for "
                "partners: clients send one request at a time; send concurrently (async or more clients) to let "
                "Triton batch (status.observed.avgBatchSize)",
            )
        )
    return updates


def requests_failing_conditions(
    decision: Decision, stored: Sequence[Mapping[str, Any]] | None
) -> list[cond.ConditionUpdate]:
    """RequestsFailing of one decision: True while at least ``policy.scaling.FAILURE_FRACTION`` of the window's
    requests fail (the message gives the failure rate); False once they stop, if the condition is there; none
    (the stored one stays) while the signals are unknown, or when no request ever failed."""
    if not decision.metrics_available:
        return []
    return failing_conditions(
        decision.requests_failing, decision.failure_rate_rps, decision.failure_fraction, stored,
        where="", advice=": not idle, so no scale-in; see Triton's log for the cause",
    )  # fmt: skip


def failing_conditions(
    failing: bool,
    rate_rps: float | None,
    fraction: float | None,
    stored: Sequence[Mapping[str, Any]] | None,
    *,
    where: str,
    advice: str,
) -> list[cond.ConditionUpdate]:
    """RequestsFailing from known signals: True when ``failing`` (failed requests/s and their fraction of all, then
    ``where`` they failed and ``advice``), else False if the condition is stored, else none."""
    failed = f"{rate_rps or 0:.3g} failed requests/s"
    if failing:
        return [cond.ConditionUpdate(
            ConditionType.REQUESTS_FAILING,
            ConditionStatus.TRUE,
            ConditionReason.REQUESTS_FAILING,
            f"{failed}, {fraction or 0:.0%} of all requests{where} (nv_inference_request_failure){advice}",
        )]  # fmt: skip
    if cond.find(stored, ConditionType.REQUESTS_FAILING) is None:
        return []
    return [
        cond.ConditionUpdate(
            ConditionType.REQUESTS_FAILING, ConditionStatus.FALSE, ConditionReason.REQUESTS_SUCCEEDING, failed
        )
    ]
