"""The wire values of batchfill's condition types and reasons: API, so this test spells every one out.

Every other test uses the constants of batchfill.api.reasons; this is the one place a renamed member or a changed
value must be noticed (users alert on these strings, kubectl wait and dashboards match them).
"""

from __future__ import annotations

import json
from enum import StrEnum

import pytest
import yaml

from batchfill.api.reasons import (
    ConditionReason,
    ConditionType,
    CostSplitReason,
    EventReason,
    PlacementReason,
    PlanWarningReason,
    PoolModelReason,
    ReplanReason,
    ScalingReason,
    SignalsReason,
    SpecReason,
)
from batchfill.api.spec import ProfileSource
from batchfill.api.status import ConditionStatus, PlannedProfileSource
from batchfill.compare.autoscalers import HpaReason
from batchfill.policy.signals import SignalState

WIRE: dict[type[StrEnum], dict[str, str]] = {
    ConditionType: {
        "READY": "Ready",
        "CONFIG_VALID": "ConfigValid",
        "PLANNED": "Planned",
        "SLA_FEASIBLE": "SLAFeasible",
        "BATCHING_EFFECTIVE": "BatchingEffective",
        "METRICS_AVAILABLE": "MetricsAvailable",
        "CAPACITY_LIMITED": "CapacityLimited",
        "CONFIG_APPLIED": "ConfigApplied",
        "PROGRESSING": "Progressing",
        "RECONCILING": "Reconciling",
        "STALLED": "Stalled",
        "REQUESTS_FAILING": "RequestsFailing",
    },
    ConditionStatus: {"TRUE": "True", "FALSE": "False", "UNKNOWN": "Unknown"},
    SpecReason: {
        "INVALID_SPEC": "InvalidSpec",
        "INVALID_BATCHING": "InvalidBatching",
        "SLA_INFEASIBLE": "SLAInfeasible",
        "APPLY_REJECTED": "ApplyRejected",
    },
    ScalingReason: {
        "ABOVE_MAX_REPLICAS": "AboveMaxReplicas",
        "BELOW_MIN_REPLICAS": "BelowMinReplicas",
        "HOLD_SCALED_TO_ZERO": "HoldScaledToZero",
        "HOLD_METRICS_UNKNOWN": "HoldMetricsUnknown",
        "HOLD_NO_CAPACITY": "HoldNoCapacity",
        "SCALE_OUT_FROM_ZERO": "ScaleOutFromZero",
        "HOLD_IDLE": "HoldIdle",
        "HOLD_REPLICAS_PENDING": "HoldReplicasPending",
        "HOLD_REPLICAS_FAILING": "HoldReplicasFailing",
        "HOLD_CAPACITY_ON_THE_WAY": "HoldCapacityOnTheWay",
        "HOLD_SETTLING": "HoldSettling",
        "AT_MAX_REPLICAS": "AtMaxReplicas",
        "SCALE_OUT_SATURATED": "ScaleOutSaturated",
        "SCALE_OUT_SLA_AT_RISK": "ScaleOutSLAAtRisk",
        "SCALE_OUT_LOW_HEADROOM": "ScaleOutLowHeadroom",
        "HOLD_NOT_SATURATED": "HoldNotSaturated",
        "SCALE_IN_IDLE": "ScaleInIdle",
        "SCALE_IN_LOAD_FITS": "ScaleInLoadFits",
        "HOLD_STABILIZING": "HoldStabilizing",
        "HOLD_WITHIN_TOLERANCE": "HoldWithinTolerance",
        "SCALING_OFF": "ScalingOff",
        "HOLD_REQUESTS_FAILING": "HoldRequestsFailing",
        "HOLD_SCALE_IN_WOULD_SATURATE": "HoldScaleInWouldSaturate",
    },
    ReplanReason: {
        "AWAITING_MEASUREMENT": "AwaitingMeasurement",
        "REPLAN_INTERVAL_NOT_ELAPSED": "ReplanIntervalNotElapsed",
        "PROFILE_MEASURED": "ProfileMeasured",
        "PROFILE_NOT_COMPARABLE": "ProfileNotComparable",
        "PROFILE_DISAGREES": "ProfileDisagrees",
        "PROFILE_AGREES": "ProfileAgrees",
        "MEASURED_PROFILE_INFEASIBLE": "MeasuredProfileInfeasible",
    },
    SignalsReason: {
        "PROMETHEUS_UNAVAILABLE": "PrometheusUnavailable",
        "PROMETHEUS_TIMEOUT": "PrometheusTimeout",
        "PROMETHEUS_ERROR": "PrometheusError",
        "NO_SERIES": "NoSeries",
        "NO_READY_PODS": "NoReadyPods",
        "INVALID_VALUE": "InvalidValue",
        "STALLED": "Stalled",
        "REQUESTS_IN_FLIGHT": "RequestsInFlight",
    },
    PlanWarningReason: {"VARIABLE_SHAPE_INPUT": "VariableShapeInput", "MAX_BATCH_SIZE_CAPPED": "MaxBatchSizeCapped"},
    ConditionReason: {
        "VALID": "Valid",
        "FEASIBLE": "Feasible",
        "PROFILE_NOT_MEASURED": "ProfileNotMeasured",
        "PLANNED": "Planned",
        "PLANNED_FROM_MEASURED_PROFILE": "PlannedFromMeasuredProfile",
        "FIRST_PLAN": "FirstPlan",
        "REPLICAS_READY": "ReplicasReady",
        "NO_READY_REPLICAS": "NoReadyReplicas",
        "REPLICAS_FAILING": "ReplicasFailing",
        "ROLLED_BACK_BY_HAND": "RolledBackByHand",
        "IDLE": "Idle",
        "SIGNALS_OK": "SignalsOk",
        "NO_DATA": "NoData",
        "REPLICAS_PENDING": "ReplicasPending",
        "AT_MAX_REPLICAS": "AtMaxReplicas",
        "WITHIN_CAPACITY": "WithinCapacity",
        "LOW_CONCURRENCY": "LowConcurrency",
        "ROLLING_OUT": "RollingOut",
        "ROLLOUT_COMPLETE": "RolloutComplete",
        "SLA_AT_RISK": "SLAAtRisk",
        "REQUESTS_FAILING": "RequestsFailing",
        "REQUESTS_SUCCEEDING": "RequestsSucceeding",
    },
    EventReason: {
        "DEPLOYED": "Deployed",
        "CONFIG_CHANGED": "ConfigChanged",
        "ROLLED_BACK_BY_HAND": "RolledBackByHand",
        "ROLLING_IN_PLACE": "RollingInPlace",
        "MANUAL_SCALE_REVERTED": "ManualScaleReverted",
        "SCALE_RESUMED": "ScaleResumed",
        "STATISTICS_UNAVAILABLE": "StatisticsUnavailable",
        "GENERATION_UNHANDLED": "GenerationUnhandled",
        "REQUESTS_FAILING": "RequestsFailing",
    },
    ProfileSource: {"DECLARED": "Declared", "MEASURED": "Measured"},
    PlannedProfileSource: {"DECLARED": "Declared", "MEASURED": "Measured", "FIRST_PLAN": "FirstPlan"},
    SignalState: {"OK": "Ok", "IDLE": "Idle", "UNKNOWN": "Unknown"},
    PlacementReason: {
        "DEDICATED_BY_SPEC": "DedicatedBySpec",
        "SHARED_BY_SPEC": "SharedBySpec",
        "SHARED_BELOW_ONE_GPU": "SharedBelowOneGpu",
        "DEDICATED_FILLS_GPU": "DedicatedFillsGpu",
        "NOT_PLACED": "NotPlaced",
    },
    PoolModelReason: {
        "MODEL_LOADED": "ModelLoaded",
        "MODEL_LOAD_FAILED": "ModelLoadFailed",
        "MODEL_ROUTED": "ModelRouted",
        "MODEL_DRAINING": "ModelDraining",
        "MODEL_UNLOADED": "ModelUnloaded",
        "MODEL_UNLOAD_FAILED": "ModelUnloadFailed",
        "HOLD_POD_UNKNOWN": "HoldPodUnknown",
        "HOLD_IN_TRANSITION": "HoldInTransition",
        "HOLD_LOAD_BACKOFF": "HoldLoadBackoff",
        "HOLD_LAST_COPY": "HoldLastCopy",
        "HOLD_DRAINING": "HoldDraining",
        "HOLD_NO_OTHER_COPY": "HoldNoOtherCopy",
        "HOLD_STALE_LABEL": "HoldStaleLabel",
    },
    CostSplitReason: {
        "EXECUTION_TIME": "ExecutionTime",
        "IDLE_SPLIT_EVENLY": "IdleSplitEvenly",
        "UNKNOWN_COUNTER": "UnknownCounter",
        "MODEL_UNLOADED": "ModelUnloaded",
        "NO_MODEL_LOADED": "NoModelLoaded",
    },
    HpaReason: {
        "SCALING_DISABLED": "ScalingDisabled",
        "FAILED_GET_METRIC": "FailedGetMetric",
        "SCALE_DOWN": "ScaleDown",
        "SCALE_DOWN_STABILIZED": "ScaleDownStabilized",
        "SCALE_UP": "ScaleUp",
        "SCALE_UP_LIMITED": "ScaleUpLimited",
        "WITHIN_TOLERANCE": "WithinTolerance",
    },
}


@pytest.mark.parametrize("enum", list(WIRE), ids=lambda e: e.__name__)
def test_wire_values_never_change(enum: type[StrEnum]) -> None:
    assert {m.name: m.value for m in enum} == WIRE[enum]
    # what goes on the wire: str(), format() and JSON give the bare value (YAML needs .value: safe_dump refuses
    # str subclasses)
    for member in enum:
        assert (str(member), f"{member}", json.dumps(member)) == (member.value, member.value, json.dumps(member.value))
        assert type(str(member)) is str
        assert yaml.safe_dump(member.value) == yaml.safe_dump(str(member))


def test_the_reason_the_readme_explains() -> None:
    assert ScalingReason.HOLD_METRICS_UNKNOWN == "HoldMetricsUnknown"  # README.md: the demo's warning


def test_shared_facts_are_one_value() -> None:
    """A reason that states the same fact in two groups is the same member value, not a second spelling."""
    assert ConditionReason.AT_MAX_REPLICAS == ScalingReason.AT_MAX_REPLICAS
    assert ConditionReason.FIRST_PLAN == PlannedProfileSource.FIRST_PLAN
    assert {PlannedProfileSource.DECLARED, PlannedProfileSource.MEASURED} == set(ProfileSource)


def test_reasons_are_valid_condition_reasons() -> None:
    """metav1.Condition's reason pattern (api/status.py Condition) admits every reason batchfill writes."""
    from batchfill.api.status import Condition

    for enum in (SpecReason, ScalingReason, ReplanReason, SignalsReason, PlanWarningReason, ConditionReason):
        for member in enum:
            Condition(type=ConditionType.READY, status=ConditionStatus.TRUE, reason=member, lastTransitionTime="x")
    for type_ in ConditionType:
        Condition(type=type_, status=ConditionStatus.TRUE, reason=ConditionReason.VALID, lastTransitionTime="x")
