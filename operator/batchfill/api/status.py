"""The BatchedModel status: what the operator writes through the status subresource.

Every float here is finite (JSON has no NaN); writers round before comparing so jitter does not cause writes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from batchfill.api.spec import ProfileSource


class _Status(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Status):
    """A metav1.Condition: ``lastTransitionTime`` changes only when ``status`` flips."""

    type: str = Field(pattern=r"^[A-Z][A-Za-z0-9]*$", max_length=316)
    status: ConditionStatus
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    lastTransitionTime: str = Field(description="RFC 3339 time of the last status flip.")
    observedGeneration: int | None = Field(default=None, ge=0)


class SeedRule(_Status):
    """The textbook rule's numbers, shown next to the chosen plan: D = S - l(B) - N."""

    maxBatchSize: int = Field(ge=0, description="B: the largest profiled batch size that fits the budget.")
    maxQueueDelayMicroseconds: int = Field(ge=0, description="D = S - l(B) - N, in microseconds.")
    capacityPerReplicaRps: float = Field(
        ge=0, description="Requests/s one replica serves within the SLA with the seed rule's settings."
    )


class PlanStatus(_Status):
    """The batching plan derived from the SLA and the profile, and what it predicts."""

    maxBatchSize: int = Field(ge=0, description="Triton max_batch_size (0: batching off).")
    preferredBatchSizes: list[int] = Field(default_factory=list, description="Triton preferred_batch_size.")
    maxQueueDelayMicroseconds: int = Field(ge=0, description="Triton max_queue_delay_microseconds.")
    instanceCount: int = Field(ge=1, description="Triton instance_group count (per GPU on GPU replicas).")
    minimumSlotUtilization: float | None = Field(
        default=None, ge=0, le=1, description="Sequence batcher Direct strategy only."
    )
    serverBudgetMs: float = Field(ge=0, description="T = latencyP99Ms - networkOverheadMs: Triton's p99 budget.")
    capacityPerReplicaRps: float = Field(
        ge=0, description="Largest Poisson request rate one replica serves with server p99 <= T (simulated)."
    )
    predictedP99Ms: float = Field(ge=0, description="Simulated server p99 (queue + execution) at that rate.")
    minClientTimeoutMs: float = Field(
        ge=0, description="Clients with a shorter timeout see failures the server never logs."
    )
    rule: str = Field(description="How the plan was chosen.")
    batchFillAtTarget: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Mean batch size / maxBatchSize the simulator predicts at targetUtilization x capacity: the "
        "batch fill at which a replica counts as saturated.",
    )
    batchFillAtMaxTarget: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="The same at maxTargetUtilization x capacity (absent when that is not above "
        "targetUtilization): with batchFillAtTarget, the saturation fill at a raised effectiveTargetUtilization.",
    )
    seedRule: SeedRule | None = None


class ObservedStatus(_Status):
    """Signals read from Triton's metrics through Prometheus (rounded)."""

    requestRate: float | None = Field(default=None, ge=0, description="Requests per second, all ready pods.")
    avgBatchSize: float | None = Field(default=None, ge=0)
    batchFill: float | None = Field(default=None, ge=0, description="avgBatchSize / maxBatchSize.")
    queueTimeMs: float | None = Field(default=None, ge=0, description="Average queue time per request.")
    p99Ms: float | None = Field(default=None, ge=0, description="Server-side p99 request latency.")
    rateVariability: float | None = Field(
        default=None,
        ge=0,
        description="Root mean square of the request rate's natural-log changes over 60 s in the last 30 min "
        "(0.05: about 5 % per minute); absent until 15 min of changes are known.",
    )


class MeasuredPoint(_Status):
    """Execution latency of one batch size from Triton's statistics (batch_stats) of the Ready pods."""

    batchSize: int = Field(ge=1)
    latencyMs: float = Field(gt=0, description="Mean execution latency (input + infer + output), ms.")
    executions: int = Field(ge=0, description="Executions measured (0: extrapolated by a fitted line).")


class MeasuredProfileStatus(_Status):
    """The latest profile measured on the running pods."""

    points: list[MeasuredPoint] = Field(default_factory=list)
    pods: int = Field(ge=0, description="Pods whose statistics were summed.")
    measuredAt: str = Field(description="When, RFC 3339.")


class PlannedProfileSource(StrEnum):
    """Where the profile behind ``status.plan`` came from (``status.plannedProfile.source``).

    The two sources ``spec.profiling.source`` names, and the first plan, made before any profile exists. The
    first plan is no value of :class:`~batchfill.api.spec.ProfileSource`: the CRD derives the values
    ``spec.profiling.source`` accepts from that enum, and a user cannot ask for it.
    """

    DECLARED = ProfileSource.DECLARED
    MEASURED = ProfileSource.MEASURED
    FIRST_PLAN = "FirstPlan"


class PlannedProfileStatus(_Status):
    """The profile status.plan was computed from."""

    source: str = Field(description="Declared (spec.profile), Measured (points below) or FirstPlan (none yet).")
    points: list[MeasuredPoint] = Field(default_factory=list, description="The measured points in use (Measured).")
    since: str | None = Field(
        default=None,
        description=(
            "When the plan last adopted a measured profile, RFC 3339 (kept when spec.profile changes, so "
            "spec.profiling.replanIntervalSeconds also holds after an edit)."
        ),
    )
    reason: str = Field(default="", description="Why (ProfileMeasured, ProfileDisagrees, ...).")
    message: str = Field(default="", description="The numbers behind the reason: old and new latency.")
    declaredHash: str = Field(
        default="", description="Hash of spec.profile when this was written: a new declared profile wins."
    )


class ScalingVote(_Status):
    """From ``time`` until the next vote, the scaling decision voted for ``replicas`` with ``ready`` Ready."""

    time: str = Field(description="RFC 3339, whole seconds.")
    replicas: int = Field(ge=0, description="The replica count this tick voted for.")
    ready: int = Field(ge=0, description="Ready replicas at that tick.")


#: Most pod names status.placement lists (a pool's pods beyond it are counted in ``podCount`` only): 16 names of at
#: most 253 characters keep the status small.
PLACEMENT_PODS_MAX = 16


class PlacementStatus(_Status):
    """Where the model is served and why: its own replicas or a GPUPool's shared pods (spec.placement)."""

    mode: str = Field(
        max_length=16, pattern=r"^(Dedicated|Shared)$", description="Where it is served now: Dedicated or Shared."
    )
    pool: str | None = Field(default=None, max_length=253, description="The GPUPool serving it (Shared).")
    pods: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list,
        max_length=PLACEMENT_PODS_MAX,
        description="Pods it is loaded and ready on, sorted (the first 16).",
    )
    podCount: int = Field(default=0, ge=0, le=100_000, description="Pods it is loaded and ready on, all of them.")
    gpuShare: float | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description=(
            "GPUs of the plan's GPU time it takes: its predicted busy time per second over the GPUs it is on "
            "(a fraction of one GPU when shared; its replicas' GPUs when dedicated)."
        ),
    )
    planHeadroom: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Fraction of its shared GPU's time the joint plan leaves unused at the planned rates.",
    )
    reason: str = Field(default="", max_length=64, description="Why it is served there (a reason, CamelCase).")
    message: str = Field(default="", max_length=1024, description="The numbers behind the reason.")
    since: str | None = Field(default=None, max_length=64, description="When it last moved, RFC 3339.")


class BatchedModelStatus(_Status):
    """Status subresource of a BatchedModel."""

    observedGeneration: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = Field(default_factory=list)
    plan: PlanStatus | None = None
    replicas: int | None = Field(default=None, ge=0)
    readyReplicas: int | None = Field(default=None, ge=0)
    desiredReplicas: int | None = Field(default=None, ge=0)
    appliedReplicas: int | None = Field(
        default=None, ge=0, description="Replicas the operator last set on the Deployment (scaling.mode Auto only)."
    )
    lastScaleTime: str | None = None
    lastScaleReason: str | None = None
    effectiveTargetUtilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The targetUtilization in effect: spec.scaling.targetUtilization, raised on calm traffic (a "
        "low observed.rateVariability) up to spec.scaling.maxTargetUtilization.",
    )
    observed: ObservedStatus | None = None
    measuredProfile: MeasuredProfileStatus | None = None
    plannedProfile: PlannedProfileStatus | None = None
    placement: PlacementStatus | None = None
    scalingHistory: list[ScalingVote] | None = Field(
        default=None,
        description=(
            "The scaling votes of the stabilization window, an entry only where the vote or the Ready count "
            "changed: a restarted or newly elected operator continues the window instead of starting it over."
        ),
    )
