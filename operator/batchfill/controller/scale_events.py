"""The Events of one scaling decision (pure): what :func:`batchfill.controller.scaling.decide_scale` posts.

* a scale action, and a decision reason different from ``status.lastScaleReason`` (Warnings for the reasons in
  :data:`WARNING_REASONS`);
* a replica count set by hand and restored in Auto, or a recorded scale that never reached the Deployment;
* ``HoldMetricsUnknown`` once per change of the MetricsAvailable=False reason (a Warning for Prometheus trouble,
  Normal when a model that had metrics loses them, none for a new model's pods not scraped yet);
* RequestsFailing turning True; a hand rollback beginning to hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchfill.api.reasons import ConditionType, EventReason, ScalingReason, SignalsReason
from batchfill.api.status import ConditionStatus, PlannedProfileSource
from batchfill.controller.desired import Desired
from batchfill.controller.reconcile import Event
from batchfill.controller.served_config import ServedNumbers
from batchfill.controller.status import (
    config_applied_condition,
    hand_rollback,
    replicas_managers,
    requests_failing_conditions,
    scaling_conditions,
)
from batchfill.policy import conditions as cond
from batchfill.policy.scaling import Decision
from batchfill.policy.signals import ModelSignals
from batchfill.render.kube import FIELD_MANAGER

#: Decision reasons that are posted as Warning events (the rest are Normal).
#: (HoldMetricsUnknown has its own rule: once per MetricsAvailable=False reason, see scale_events.)
WARNING_REASONS = frozenset(
    {
        ScalingReason.HOLD_REPLICAS_PENDING,
        ScalingReason.HOLD_REPLICAS_FAILING,
        ScalingReason.AT_MAX_REPLICAS,
        ScalingReason.HOLD_NO_CAPACITY,
    }
)


def rollback_events(
    status: Mapping[str, Any], deployment: Mapping[str, Any], desired: Desired, served: ServedNumbers
) -> list[Event]:
    """A Warning once a hand rollback begins to hold (the stored ConfigApplied does not say so yet), saying which
    capacity scaling uses meanwhile (``served``)."""
    applied = config_applied_condition(hand_rollback(deployment, desired), desired)
    stored = cond.find(status.get("conditions"), ConditionType.CONFIG_APPLIED)
    if applied is None or (stored is not None and stored.get("message") == applied.message):
        return []
    message = applied.message
    if served.note:
        message += f"; {served.note}"
    else:
        message += (f"; scaling uses that config's capacity, {served.numbers.capacity_rps:.4g} req/s per replica "
                    f"(the plan's: {desired.plan_status.capacityPerReplicaRps:.4g})")  # fmt: skip
    return [("Warning", EventReason.ROLLED_BACK_BY_HAND, message)]


def scale_events(
    status: Mapping[str, Any],
    deployment: Mapping[str, Any],
    signals: ModelSignals,
    desired: Desired,
    decision: Decision,
    current: int,
    target: int,
    restored: int | None,
) -> tuple[Event, ...]:
    """The events of one decision (see :func:`decide_scale`); ``restored``: the hand-set count being replaced."""
    events: list[Event] = []
    if restored is not None:
        applied = status.get("appliedReplicas")
        managers = replicas_managers(deployment)
        others = sorted(set(managers) - {FIELD_MANAGER})
        if others or not managers:
            by = f" by {', '.join(others)}" if others else ""
            events.append(("Normal", EventReason.MANUAL_SCALE_REVERTED, f"Deployment replicas {restored} were set "
                           f"outside batchfill{by}; scaling.mode Auto owns them: set {target} (use scaling.mode "
                           "Off to scale by hand)"))  # fmt: skip
        else:  # batchfill's own last count: its scale to `applied` was recorded in status but never reached it
            events.append(("Normal", EventReason.SCALE_RESUMED, f"{restored} -> {target}: status recorded a scale "
                           f"to {applied} that had not reached the Deployment (the operator stopped, or the API "
                           "refused it, between the two writes)"))  # fmt: skip
    if decision.apply:
        events.append(("Normal", decision.reason, f"{current} -> {decision.desired_replicas}: {decision.message}"))
    elif decision.reason != status.get("lastScaleReason") and decision.reason != ScalingReason.HOLD_METRICS_UNKNOWN:
        # a first plan has no capacity by design: holding is expected there, not a warning
        expected = (
            decision.reason == ScalingReason.HOLD_NO_CAPACITY
            and desired.profile_source == PlannedProfileSource.FIRST_PLAN
        )
        kind = "Warning" if decision.reason in WARNING_REASONS and not expected else "Normal"
        events.append((kind, decision.reason, decision.message))
    metrics = scaling_conditions(decision, signals)[0]
    before = cond.find(status.get("conditions"), ConditionType.METRICS_AVAILABLE) or {}
    outage = (ConditionStatus.FALSE, metrics.reason)
    if metrics.status == ConditionStatus.FALSE and (before.get("status"), before.get("reason")) != outage:
        # once per outage: Prometheus trouble is a Warning; pods not scraped yet are expected: a Normal event when
        # a model that had metrics loses them, none for a new model whose first pods are still starting (the
        # condition says so; at 1,000 new models one such Event each was a tenth of the creation's API requests)
        expected_gap = signals.reason in (
            SignalsReason.NO_SERIES,
            SignalsReason.NO_READY_PODS,
            SignalsReason.REQUESTS_IN_FLIGHT,
        )
        if not expected_gap:
            events.append(("Warning", ScalingReason.HOLD_METRICS_UNKNOWN, decision.message))
        elif before.get("status") == ConditionStatus.TRUE:
            events.append(("Normal", ScalingReason.HOLD_METRICS_UNKNOWN, decision.message))
    # a Warning once RequestsFailing turns True (the stored condition is not True yet)
    stored = cond.find(status.get("conditions"), ConditionType.REQUESTS_FAILING) or {}
    for failing in requests_failing_conditions(decision, status.get("conditions")):
        if failing.status == ConditionStatus.TRUE and stored.get("status") != ConditionStatus.TRUE:
            events.append(("Warning", EventReason.REQUESTS_FAILING, failing.message))
    return tuple(events)
