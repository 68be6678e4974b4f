"""The words batchfill writes for people and tools to match: condition types, and the reasons of conditions,
Events, scaling decisions and re-plans.

They are API: users alert on them, dashboards and ``kubectl wait --for=condition=...`` match them, so a value
never changes once released; ``tests/unit/test_reasons.py`` pins every one. Each is defined here once, grouped by
the code that produces it; a reason that means the same fact in two places (``AtMaxReplicas``) is one value.
Reasons are CamelCase, as metav1.Condition requires (the pattern of ``Condition.reason`` in api/status.py, from
https://github.com/kubernetes/apimachinery/blob/master/pkg/apis/meta/v1/types.go) and as Kubernetes Events use
them.

Values Kubernetes itself defines are not here: condition statuses (:class:`batchfill.api.status.ConditionStatus`),
Event types (``Normal``, ``Warning``), the conditions of pods and Deployments.
"""

from __future__ import annotations

from enum import StrEnum

from batchfill.api.status import PlannedProfileSource


class ConditionType(StrEnum):
    """``status.conditions[].type`` of a BatchedModel."""

    READY = "Ready"
    CONFIG_VALID = "ConfigValid"
    PLANNED = "Planned"
    SLA_FEASIBLE = "SLAFeasible"
    BATCHING_EFFECTIVE = "BatchingEffective"
    METRICS_AVAILABLE = "MetricsAvailable"
    CAPACITY_LIMITED = "CapacityLimited"
    #: only while the pods run another config than the plan's: False, RolledBackByHand
    CONFIG_APPLIED = "ConfigApplied"
    #: True while the pods move to the plan's config (a rollout, a new plan); False once all of them serve it
    PROGRESSING = "Progressing"
    #: kstatus' abnormal-true conditions (Flux, kpt), present only while True: Reconciling while
    #: Progressing or no replica is Ready yet, Stalled while Ready is False for a reason waiting cannot fix
    RECONCILING = "Reconciling"
    STALLED = "Stalled"
    #: from the first window in which requests failed: True while they do (RequestsFailing), then False
    REQUESTS_FAILING = "RequestsFailing"


class SpecReason(StrEnum):
    """Why a spec cannot be served (``SpecError.reason``): the reason of ConfigValid, SLAFeasible, Planned and
    Ready while it is refused, and of the Warning Event that says so."""

    INVALID_SPEC = "InvalidSpec"
    INVALID_BATCHING = "InvalidBatching"
    SLA_INFEASIBLE = "SLAInfeasible"
    #: the API server refused a child the spec renders (an admission webhook or policy, a quota)
    APPLY_REJECTED = "ApplyRejected"


class ScalingReason(StrEnum):
    """Why the replica decision chose its count (``policy.scaling.Decision.reason``): ``status.lastScaleReason``,
    the reason of the scaling Event and the ``reason`` label of ``batchfill_scaling_decisions``.

    The rules behind each are in the docstring of :mod:`batchfill.policy.scaling`.
    """

    ABOVE_MAX_REPLICAS = "AboveMaxReplicas"
    BELOW_MIN_REPLICAS = "BelowMinReplicas"
    HOLD_SCALED_TO_ZERO = "HoldScaledToZero"
    HOLD_METRICS_UNKNOWN = "HoldMetricsUnknown"
    HOLD_NO_CAPACITY = "HoldNoCapacity"
    SCALE_OUT_FROM_ZERO = "ScaleOutFromZero"
    HOLD_IDLE = "HoldIdle"
    HOLD_REPLICAS_PENDING = "HoldReplicasPending"
    HOLD_REPLICAS_FAILING = "HoldReplicasFailing"
    HOLD_CAPACITY_ON_THE_WAY = "HoldCapacityOnTheWay"
    HOLD_SETTLING = "HoldSettling"
    AT_MAX_REPLICAS = "AtMaxReplicas"
    SCALE_OUT_SATURATED = "ScaleOutSaturated"
    SCALE_OUT_SLA_AT_RISK = "ScaleOutSLAAtRisk"
    #: the rate needs more replicas and the batch fill would reach saturation at 1/targetUtilization x the load
    SCALE_OUT_LOW_HEADROOM = "ScaleOutLowHeadroom"
    HOLD_NOT_SATURATED = "HoldNotSaturated"
    SCALE_IN_IDLE = "ScaleInIdle"
    SCALE_IN_LOAD_FITS = "ScaleInLoadFits"
    HOLD_STABILIZING = "HoldStabilizing"
    HOLD_WITHIN_TOLERANCE = "HoldWithinTolerance"
    SCALING_OFF = "ScalingOff"
    #: at least policy.scaling.FAILURE_FRACTION of the requests fail: no scale-in (and no scale-out while none
    #: succeeds)
    HOLD_REQUESTS_FAILING = "HoldRequestsFailing"
    #: the rate alone would scale in, but the fewer replicas would be saturated (their scale-out rules refuse it)
    HOLD_SCALE_IN_WOULD_SATURATE = "HoldScaleInWouldSaturate"


class ReplanReason(StrEnum):
    """Whether the plan adopts the measured profile, and why (``policy.profile_fit.decide_replan``):
    ``status.plannedProfile.reason`` and the reason of the profiling Event."""

    AWAITING_MEASUREMENT = "AwaitingMeasurement"
    REPLAN_INTERVAL_NOT_ELAPSED = "ReplanIntervalNotElapsed"
    PROFILE_MEASURED = "ProfileMeasured"
    PROFILE_NOT_COMPARABLE = "ProfileNotComparable"
    PROFILE_DISAGREES = "ProfileDisagrees"
    PROFILE_AGREES = "ProfileAgrees"
    #: the rule would adopt the measurement, but no plan meets the SLA with it: the plan is kept (a Warning)
    MEASURED_PROFILE_INFEASIBLE = "MeasuredProfileInfeasible"


class SignalsReason(StrEnum):
    """Why the load signals are unknown (``policy.signals.ModelSignals.reason``): the reason of
    MetricsAvailable=False."""

    PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
    PROMETHEUS_TIMEOUT = "PrometheusTimeout"
    PROMETHEUS_ERROR = "PrometheusError"
    NO_SERIES = "NoSeries"
    NO_READY_PODS = "NoReadyPods"
    INVALID_VALUE = "InvalidValue"
    STALLED = "Stalled"
    #: requests pending now, none completed in the window, and not pending throughout it: they just came (the first
    #: ones of a load that starts), so neither a stall nor a rate yet
    REQUESTS_IN_FLIGHT = "RequestsInFlight"


class PlanWarningReason(StrEnum):
    """Something the plan cannot fix (``policy.plan.PlanWarning.reason``): shown by ``batchfill plan``, and the
    reason of the condition the warning names."""

    VARIABLE_SHAPE_INPUT = "VariableShapeInput"
    MAX_BATCH_SIZE_CAPPED = "MaxBatchSizeCapped"


class ConditionReason(StrEnum):
    """The reasons of BatchedModel conditions that are not one of the groups above, by condition type.

    A refused spec sets a :class:`SpecReason` everywhere; MetricsAvailable=False carries a :class:`SignalsReason`
    (``NoData`` when the signals name none); BatchingEffective=Unknown a :class:`PlanWarningReason`.
    """

    # ConfigValid=True
    VALID = "Valid"
    # SLAFeasible: True, or Unknown while there is no profile yet
    FEASIBLE = "Feasible"
    PROFILE_NOT_MEASURED = "ProfileNotMeasured"
    # Planned=True: from spec.profile, from a measured profile, or without a profile (capacity unknown)
    PLANNED = "Planned"
    PLANNED_FROM_MEASURED_PROFILE = "PlannedFromMeasuredProfile"
    FIRST_PLAN = PlannedProfileSource.FIRST_PLAN
    # Ready
    REPLICAS_READY = "ReplicasReady"
    NO_READY_REPLICAS = "NoReadyReplicas"
    REPLICAS_FAILING = "ReplicasFailing"
    # ConfigApplied=False: someone rolled the Deployment back (kubectl rollout undo); batchfill leaves it
    ROLLED_BACK_BY_HAND = "RolledBackByHand"
    # MetricsAvailable: True with traffic or without, False when the signals name no reason
    IDLE = "Idle"
    SIGNALS_OK = "SignalsOk"
    NO_DATA = "NoData"
    # CapacityLimited: True while replicas cannot be scheduled or maxReplicas is reached, else False
    REPLICAS_PENDING = "ReplicasPending"
    AT_MAX_REPLICAS = ScalingReason.AT_MAX_REPLICAS
    WITHIN_CAPACITY = "WithinCapacity"
    # BatchingEffective=False: clients send one request at a time, so there is nothing to batch
    LOW_CONCURRENCY = "LowConcurrency"
    # Ready=False and Progressing=True while the pods move to the plan's config; Progressing=False once done
    ROLLING_OUT = "RollingOut"
    ROLLOUT_COMPLETE = "RolloutComplete"
    # Ready=False: the load wants more than can run, or the observed p99 is over the server budget
    SLA_AT_RISK = "SLAAtRisk"
    # RequestsFailing: True while failed requests reach policy.scaling.FAILURE_FRACTION, False once they stop
    REQUESTS_FAILING = ConditionType.REQUESTS_FAILING
    REQUESTS_SUCCEEDING = "RequestsSucceeding"


class EventReason(StrEnum):
    """The reasons of Events that are not a spec, scaling or re-plan reason (those Events carry that reason)."""

    DEPLOYED = "Deployed"
    CONFIG_CHANGED = "ConfigChanged"
    ROLLED_BACK_BY_HAND = ConditionReason.ROLLED_BACK_BY_HAND
    #: no free GPU for a surge pod: the rollout goes one replica at a time (controller.rollout)
    ROLLING_IN_PLACE = "RollingInPlace"
    #: scaling.mode Auto restored the replica count someone else set on the Deployment
    MANUAL_SCALE_REVERTED = "ManualScaleReverted"
    #: a scale status recorded but the Deployment never got (the operator stopped in between) was completed
    SCALE_RESUMED = "ScaleResumed"
    STATISTICS_UNAVAILABLE = "StatisticsUnavailable"
    #: status did not observe a generation for BATCHFILL_UNHANDLED_GENERATION_SECONDS (a stalled watch, a stuck
    #: handler): the scaling loop reconciled it itself (controller.loops.ScalingLoop)
    GENERATION_UNHANDLED = "GenerationUnhandled"
    #: a Warning once RequestsFailing turns True (requests the model rejects or fails)
    REQUESTS_FAILING = ConditionReason.REQUESTS_FAILING


class CostSplitReason(StrEnum):
    """How a shared pod's GPU time was split among its models (:func:`batchfill.policy.cost.split_gpu_time`): the
    ``reason`` label of ``batchfill_pool_unattributed_gpu_hours`` for the unattributed ones."""

    EXECUTION_TIME = "ExecutionTime"
    IDLE_SPLIT_EVENLY = "IdleSplitEvenly"
    UNKNOWN_COUNTER = "UnknownCounter"
    MODEL_UNLOADED = "ModelUnloaded"
    NO_MODEL_LOADED = "NoModelLoaded"


class PlacementReason(StrEnum):
    """Why a model is served where it is (``status.placement.reason``; :mod:`batchfill.policy.placement_status`)."""

    #: spec.placement.mode Dedicated (the default): replicas of its own
    DEDICATED_BY_SPEC = "DedicatedBySpec"
    #: spec.placement.mode Shared: on the pool whatever its load
    SHARED_BY_SPEC = "SharedBySpec"
    #: mode Auto, its load below what one GPU serves at its SLA: on the pool
    SHARED_BELOW_ONE_GPU = "SharedBelowOneGpu"
    #: mode Auto, its load fills at least one GPU: dedicated replicas
    DEDICATED_FILLS_GPU = "DedicatedFillsGpu"
    #: mode Shared or Auto but the joint plan has no place for it yet (no rate known, no plan): where it was
    NOT_PLACED = "NotPlaced"


class PoolModelReason(StrEnum):
    """What the operator did, or why it waited, with one model on one GPUPool pod
    (:func:`batchfill.controller.pool_models.decide_pool_models`): the reasons of its Events and of its holds."""

    #: a load with the model's current config succeeded (Triton answered after the model was ready)
    MODEL_LOADED = "ModelLoaded"
    #: Triton refused or failed the load (a Warning with the HTTP status and Triton's message); retried later
    MODEL_LOAD_FAILED = "ModelLoadFailed"
    #: the pod got the model's label: the model's Service routes to it
    MODEL_ROUTED = "ModelRouted"
    #: the model's label was taken off the pod: its Service stops routing there; unloaded after the drain time
    MODEL_DRAINING = "ModelDraining"
    MODEL_UNLOADED = "ModelUnloaded"
    MODEL_UNLOAD_FAILED = "ModelUnloadFailed"
    #: holds (nothing done this tick): the pod is not Ready or its repository index could not be read
    HOLD_POD_UNKNOWN = "HoldPodUnknown"
    #: Triton is still loading or unloading the model on the pod
    HOLD_IN_TRANSITION = "HoldInTransition"
    #: the last load of this config on this pod failed less than the retry interval ago
    HOLD_LOAD_BACKOFF = "HoldLoadBackoff"
    #: the pod is the model's last labelled READY copy while the model is still wanted: its label stays
    HOLD_LAST_COPY = "HoldLastCopy"
    #: unlabelled, waiting for the drain time before the unload
    HOLD_DRAINING = "HoldDraining"
    #: no pod serves the wanted model: the draining copy is kept loaded
    HOLD_NO_OTHER_COPY = "HoldNoOtherCopy"
    #: a label of a model no longer wanted is still on the pod: no unload there until it is off
    HOLD_STALE_LABEL = "HoldStaleLabel"
