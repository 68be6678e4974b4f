"""The BatchedModel spec: pydantic v2 models, the single source of the CRD schema.

Field names follow the Kubernetes API conventions (camelCase) for Kubernetes things and Triton's own terms
for Triton things (``maxBatchSize`` is Triton's ``max_batch_size``). Units live in the names: ``...Ms`` are
milliseconds, ``...Microseconds`` microseconds. Descriptions become the CRD's descriptions, so they are what
``kubectl explain batchedmodel.spec`` shows.

Rules that span several fields carry a CEL rule (``x-kubernetes-validations``) so the API server enforces
them, and are checked again in :mod:`batchfill.api.validate` so the same errors reach ``batchfill plan``.

Long because it is the whole schema of one resource: every model here becomes part of the one CRD, and
the field descriptions are the API's documentation.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

GROUP = "batchfill.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "BatchedModel"
PLURAL = "batchedmodels"
SINGULAR = "batchedmodel"
SHORT_NAMES = ("bm",)

#: Triton 2.51 (NGC release 24.10), the version the rendered config is tested against.
DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    """One CEL validation rule for ``x-kubernetes-validations`` (apiextensions.k8s.io/v1)."""
    r: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        r["fieldPath"] = field_path
    return r


#: Longest qualified name Kubernetes takes (label keys, resource names: a 253-character DNS prefix, "/", 63).
QUALIFIED_NAME_MAX = 317
#: Longest label value.
LABEL_VALUE_MAX = 63
#: Longest file path or object-store URI in the spec (and tritonserver argument).
PATH_MAX = 1024
#: Longest tensor name (Triton's are identifiers; 128 as for model names).
TENSOR_NAME_MAX = 128
#: Largest copy of a spec kopf can be asked to keep, bytes (tests/unit/test_crd.py builds the largest spec the
#: CRD admits and measures it). kopf stores the handled spec, labels and annotations in an annotation, JSON with
#: every non-ASCII character escaped, and an object's annotations may total 256 KiB: a spec the API server accepts
#: but whose copy does not fit is refused on every write kopf makes to it. So every string, list and map in the
#: spec is bounded, free text is printable ASCII, and the largest copy leaves 32 KiB for the user's annotations.
#: (Client-side `kubectl apply` keeps yet another copy: use --server-side for specs near these bounds.)
SPEC_BYTES_MAX = 224 * 1024
#: Printable ASCII: free text in the spec (arguments, paths, tensor names, label keys and values). kopf's copy of
#: the spec escapes any other character to as many as 12 bytes, which no length bound could then budget for.
PRINTABLE = r"^[ -~]*$"
QualifiedName = Annotated[str, Field(min_length=1, max_length=QUALIFIED_NAME_MAX, pattern=PRINTABLE)]


class _Model(BaseModel):
    """Base: unknown fields are errors (the CRD is structural and prunes them; we say so instead)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False)


class DataType(StrEnum):
    """Triton tensor data types, as spelled in ``config.pbtxt`` (``model_config.proto`` ``DataType``)."""

    TYPE_BOOL = "TYPE_BOOL"
    TYPE_UINT8 = "TYPE_UINT8"
    TYPE_UINT16 = "TYPE_UINT16"
    TYPE_UINT32 = "TYPE_UINT32"
    TYPE_UINT64 = "TYPE_UINT64"
    TYPE_INT8 = "TYPE_INT8"
    TYPE_INT16 = "TYPE_INT16"
    TYPE_INT32 = "TYPE_INT32"
    TYPE_INT64 = "TYPE_INT64"
    TYPE_FP16 = "TYPE_FP16"
    TYPE_FP32 = "TYPE_FP32"
    TYPE_FP64 = "TYPE_FP64"
    TYPE_STRING = "TYPE_STRING"
    TYPE_BF16 = "TYPE_BF16"


class TensorSpec(_Model):
    """One model input or output."""

    name: str = Field(
        min_length=1, max_length=TENSOR_NAME_MAX, pattern=PRINTABLE, description="Tensor name as the model defines it."
    )
    dataType: DataType = Field(description="Triton data type, e.g. TYPE_FP32.")
    dims: list[Annotated[int, Field(ge=-1)]] = Field(
        min_length=1,
        max_length=16,
        description=(
            "Shape of ONE sample, without the batch axis (Triton adds it when maxBatchSize > 0). "
            "-1 marks a variable-size axis. If your shape includes the batch axis, set includesBatchDim."
        ),
    )
    includesBatchDim: bool = Field(
        default=False,
        description=(
            "dims starts with the batch axis. batchfill removes exactly that one axis when batching is on "
            "and keeps the full shape when batching is off (maxBatchSize 0)."
        ),
    )
    rank: int | None = Field(
        default=None,
        ge=1,
        le=17,
        description="Optional rank of the tensor the model really takes, batch axis included; checked against dims.",
    )
    allowRaggedBatch: bool = Field(
        default=False,
        description="Input only: batch requests of different shapes without padding. Needs spec.model.batchInputs.",
    )


class BatchInputKind(StrEnum):
    """Triton ``BatchInput.Kind``: extra tensors that describe a ragged batch to the model."""

    BATCH_ELEMENT_COUNT = "BATCH_ELEMENT_COUNT"
    BATCH_ACCUMULATED_ELEMENT_COUNT = "BATCH_ACCUMULATED_ELEMENT_COUNT"
    BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO = "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"
    BATCH_MAX_ELEMENT_COUNT_AS_SHAPE = "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"
    BATCH_ITEM_SHAPE = "BATCH_ITEM_SHAPE"
    BATCH_ITEM_SHAPE_FLATTEN = "BATCH_ITEM_SHAPE_FLATTEN"


class BatchInput(_Model):
    """A Triton ``batch_input`` entry (ragged batching); see Triton's ragged_batching.md."""

    kind: BatchInputKind
    targetName: str = Field(
        min_length=1,
        max_length=TENSOR_NAME_MAX,
        pattern=PRINTABLE,
        description="Name of the extra tensor the model receives.",
    )
    dataType: DataType
    sourceInputs: list[Annotated[str, Field(max_length=TENSOR_NAME_MAX, pattern=PRINTABLE)]] = Field(
        min_length=1, max_length=8, description="Inputs the batch input is computed from."
    )


class PVCSource(_Model):
    """Model repository on a PersistentVolumeClaim."""

    claimName: str = Field(min_length=1, max_length=253, pattern=PRINTABLE)
    path: str = Field(
        default="",
        max_length=PATH_MAX,
        pattern=PRINTABLE,
        description="Sub-path of the volume that holds the model repository.",
    )


class ImageSource(_Model):
    """Model repository inside an OCI image (Kubernetes image volume)."""

    reference: str = Field(
        min_length=1,
        max_length=PATH_MAX,
        pattern=PRINTABLE,
        description="OCI image reference holding the model repository.",
    )
    path: str = Field(
        default="",
        max_length=PATH_MAX,
        pattern=PRINTABLE,
        description="Directory inside the image that holds the model repository.",
    )


class ModelRepository(_Model):
    """Where the model files come from. Exactly one source."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.pvc) ? 1 : 0) + (has(self.image) ? 1 : 0) + (has(self.uri) ? 1 : 0) == 1",
                    "exactly one of pvc, image or uri must be set",
                )
            ]
        }
    )

    pvc: PVCSource | None = None
    image: ImageSource | None = None
    uri: str | None = Field(
        default=None,
        max_length=PATH_MAX,
        pattern=r"^(s3|gs|as)://[ -~]+$",
        description="Object-store model repository, as tritonserver --model-repository takes it (s3://, gs://, as://).",
    )


class WarmupData(StrEnum):
    """What Triton fills a warm-up request's inputs with (``ModelWarmup.Input`` ``zero_data`` / ``random_data``)."""

    ZERO = "Zero"
    RANDOM = "Random"


class WarmupSpec(_Model):
    """Requests Triton runs on each model instance while it loads, before the model is READY (Triton's
    ``model_warmup``), so the first requests a new replica or a pool copy gets are not also its first executions
    (lazy initialisation, CUDA kernels and TensorRT contexts made on first use)."""

    batchSizes: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Batch sizes of the warm-up requests. Empty: 1 and the planned maxBatchSize. A size above the planned "
            "maxBatchSize runs at it; a model with batching off warms up with batch size 1."
        ),
    )
    count: int = Field(default=1, ge=1, le=100, description="Times each warm-up request runs.")
    data: WarmupData = Field(
        default=WarmupData.ZERO, description="Input contents: Zero, or Random (Triton treats Random strings as Zero)."
    )


class SequenceStrategy(StrEnum):
    """Triton sequence-batcher strategy for stateful models."""

    OLDEST = "Oldest"
    DIRECT = "Direct"


class ModelSpec(_Model):
    """The Triton model that is served."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.backend) != has(self.platform)",
                    "exactly one of backend or platform must be set",
                ),
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="Triton model name: the directory in the repository and the `model` label on nv_* metrics.",
    )
    backend: str | None = Field(
        default=None,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="Triton backend, e.g. onnxruntime, python, pytorch, tensorrt.",
    )
    platform: str | None = Field(
        default=None,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="Triton platform, e.g. tensorrt_plan, onnxruntime_onnx (instead of backend).",
    )
    stateful: bool = Field(
        default=False, description="The model keeps state per sequence: Triton's sequence batcher is used."
    )
    sequenceStrategy: SequenceStrategy = Field(
        default=SequenceStrategy.OLDEST,
        description="Sequence-batcher strategy when stateful. Always written out explicitly.",
    )
    inputs: list[TensorSpec] = Field(default_factory=list, max_length=32, description="Optional inputs.")
    outputs: list[TensorSpec] = Field(default_factory=list, max_length=32, description="Optional outputs.")
    batchInputs: list[BatchInput] = Field(
        default_factory=list, max_length=8, description="Triton batch_input entries for ragged batching."
    )
    repository: ModelRepository | None = Field(default=None, description="Where the model files come from.")
    warmup: WarmupSpec | None = Field(
        default=None,
        description=(
            "Warm-up requests Triton runs while loading the model, before it is READY and is routed to. Needs "
            "spec.model.inputs with fixed per-sample dims (no -1)."
        ),
    )


class SLASpec(_Model):
    """The latency promise."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.networkOverheadMs) || self.networkOverheadMs < self.latencyP99Ms",
                    "networkOverheadMs must be less than latencyP99Ms",
                    ".networkOverheadMs",
                )
            ]
        }
    )

    latencyP99Ms: float = Field(
        gt=0, le=3_600_000, description="End-to-end p99 latency the service promises, in milliseconds."
    )
    networkOverheadMs: float = Field(
        default=0,
        ge=0,
        le=3_600_000,
        description="Budget outside Triton (network, pre/post processing), in ms. Triton's budget is the rest.",
    )

    @property
    def server_budget_ms(self) -> float:
        """Triton's p99 budget T = latencyP99Ms - networkOverheadMs, in ms, to 1 ns.

        Rounded because the subtraction of two decimal inputs is not exact in binary floats (100.3 - 90.3 is
        9.999999999999996): a budget that equals a latency in the profile must compare equal to it, not fail by one
        unit in the last place and then report "budget is 10 ms".
        """
        return round(self.latencyP99Ms - self.networkOverheadMs, SERVER_BUDGET_DECIMALS)


#: Decimal places of milliseconds kept in the server budget (1 ns).
SERVER_BUDGET_DECIMALS = 6


class ProfilePoint(_Model):
    """Execution latency of one batch size."""

    batchSize: int = Field(ge=1, le=65_536, description="Batch size (samples per execution).")
    latencyMs: float = Field(
        gt=0,
        le=3_600_000,
        description="Execution latency of one batch of this size, in milliseconds (a high percentile).",
    )


#: Most points a profile has, declared (spec.profile) or measured (status.measuredProfile and plannedProfile, where
#: a model measured at thousands of batch sizes is thinned to this many: batchfill.policy.profile_fit).
PROFILE_POINTS_MAX = 64


class BatchingSpec(_Model):
    """Optional bounds and overrides of the derived plan. Overrides that break the SLA are rejected."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.preferredBatchSizes) || !has(self.maxBatchSize) || "
                    "self.preferredBatchSizes.all(p, p <= self.maxBatchSize)",
                    "every preferredBatchSizes entry must be <= maxBatchSize",
                    ".preferredBatchSizes",
                ),
                cel(
                    "!has(self.preferredBatchSizes) || size(self.preferredBatchSizes) == 0 || "
                    "!has(self.maxBatchSize) || self.maxBatchSize > 0",
                    "preferredBatchSizes need batching: maxBatchSize must be > 0",
                    ".preferredBatchSizes",
                ),
            ]
        }
    )

    maxBatchSize: int | None = Field(
        default=None,
        ge=0,
        le=65_536,
        description="Upper bound on Triton's max_batch_size (e.g. a GPU-memory cap). 0 turns batching off.",
    )
    preferredBatchSizes: list[Annotated[int, Field(ge=1)]] | None = Field(
        default=None,
        max_length=32,
        description="Override Triton's preferred_batch_size. Each must be in [1, maxBatchSize].",
    )
    maxQueueDelayMicroseconds: int | None = Field(
        default=None,
        ge=1,
        le=3_600_000_000,
        description=(
            "Override Triton's max_queue_delay_microseconds (MICROseconds). Must leave room for execution "
            "within the SLA. 0 is not accepted: its behaviour depends on the Triton version."
        ),
    )
    instancesPerGpu: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Model instances per GPU (instance_group count). Executions on one GPU share it.",
    )
    safetyMarginPercent: float = Field(
        default=0,
        ge=0,
        le=50,
        description="Plan for a p99 this many percent below the server budget (latencyP99Ms - networkOverheadMs).",
    )


class ProfileSource(StrEnum):
    """Where the plan's batch-latency profile comes from."""

    DECLARED = "Declared"
    MEASURED = "Measured"


class ProfilingSpec(_Model):
    """How the operator measures the profile from Triton's statistics of the running pods and when it re-plans."""

    source: ProfileSource | None = Field(
        default=None,
        description=(
            "Declared: plan from spec.profile, re-plan only when the measurement disagrees beyond "
            "tolerancePercent. Measured: plan from the measurement once there is one (until then from "
            "spec.profile, or a first plan without one). Default: Declared when spec.profile is given, else "
            "Measured."
        ),
    )
    tolerancePercent: float = Field(
        default=15,
        gt=0,
        le=100,
        description="Relative difference between measured and planned latency at a batch size that triggers a re-plan.",
    )
    replanIntervalSeconds: int = Field(
        default=900, ge=60, le=604_800, description="Least time between two re-plans (each rolls the pods once)."
    )
    minExecutions: int = Field(
        default=100, ge=1, le=1_000_000, description="Executions a batch size needs before its latency counts."
    )


class ScalingMode(StrEnum):
    """How the operator acts on its replica decisions."""

    AUTO = "Auto"
    ADVISE = "Advise"
    OFF = "Off"


#: Why spec.scaling.minReplicas must be at least 1 (docs/operations.md, scale to zero).
MIN_REPLICAS_ZERO = (
    "minReplicas must be at least 1: at 0 replicas no pod runs to report demand, so nothing would ever scale the "
    "model up again (scale to zero needs a wake-up signal from outside Triton, which batchfill does not read yet)"
)


#: spec.scaling.maxTargetUtilization's default (policy/headroom.py; docs/design-notes.md, Autoscaling).
DEFAULT_MAX_TARGET_UTILIZATION = 0.95


class ScalingSpec(_Model):
    """Load-proportional scaling bounds."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
                    "minReplicas must be <= maxReplicas",
                    ".minReplicas",
                ),
                cel("!has(self.minReplicas) || self.minReplicas >= 1", MIN_REPLICAS_ZERO, ".minReplicas"),
            ]
        }
    )

    # The policy (policy.scaling) handles 0 replicas, but the API refuses it: see MIN_REPLICAS_ZERO.
    minReplicas: int = Field(
        default=1, ge=0, le=10_000, description="Fewest Triton replicas (at least 1: see the CEL rule's message)."
    )
    maxReplicas: int = Field(default=16, ge=1, le=10_000, description="Most Triton replicas (GPU budget).")
    targetUtilization: float = Field(
        default=0.85,
        gt=0,
        le=1,
        description="Fraction of a replica's capacity at SLA it may carry before another is added, on noisy "
        "traffic: the headroom for the rise of the next minutes.",
    )
    maxTargetUtilization: float = Field(
        default=DEFAULT_MAX_TARGET_UTILIZATION,
        gt=0,
        le=1,
        description="On calm traffic the operator raises targetUtilization up to this fraction, by how much the "
        "request rate has moved per minute over the last 30 min (status.effectiveTargetUtilization); never below "
        "targetUtilization. At or below targetUtilization the headroom is fixed.",
    )
    scaleDownStabilizationSeconds: int = Field(
        default=300,
        ge=0,
        le=86_400,
        description="Scale in only if every decision in this window allowed it: those of the last 120 s at "
        "targetUtilization, older ones at full capacity.",
    )
    mode: ScalingMode = Field(
        default=ScalingMode.AUTO,
        description="Auto: scale. Advise: write the recommendation to status only. Off: never touch replicas.",
    )


#: Longest quantity string ("500m", "1Gi"). The CRD cannot bound one branch of an int-or-string, so a CEL rule on
#: the map does (:data:`_QUANTITIES`).
QUANTITY_MAX = 64
Quantity = Annotated[
    int | Annotated[str, Field(max_length=QUANTITY_MAX)],
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]
_QUANTITIES: dict[str, Any] = {
    "x-kubernetes-validations": [
        cel(
            f"self.all(k, type(self[k]) != string || size(self[k]) <= {QUANTITY_MAX})",
            f"quantities must be at most {QUANTITY_MAX} characters",
        )
    ]
}


class ResourceRequirements(_Model):
    """Container resources of the Triton container (core/v1 ResourceRequirements subset)."""

    requests: dict[QualifiedName, Quantity] = Field(default_factory=dict, max_length=16, json_schema_extra=_QUANTITIES)
    limits: dict[QualifiedName, Quantity] = Field(default_factory=dict, max_length=16, json_schema_extra=_QUANTITIES)


class TolerationOperator(StrEnum):
    """core/v1 Toleration operator ("" means Equal)."""

    EQUAL = "Equal"
    EXISTS = "Exists"
    DEFAULT = ""


class TaintEffect(StrEnum):
    """core/v1 taint effect ("" matches every effect)."""

    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"
    ANY = ""


class Toleration(_Model):
    """A core/v1 Toleration of the Triton pods (its rules across fields are checked by batchfill.api.validate)."""

    key: str | None = Field(default=None, max_length=QUALIFIED_NAME_MAX, pattern=PRINTABLE)
    operator: TolerationOperator | None = None
    value: str | None = Field(default=None, max_length=LABEL_VALUE_MAX, pattern=PRINTABLE)
    effect: TaintEffect | None = None
    tolerationSeconds: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)


#: The extended resource of a whole NVIDIA GPU (the device plugin's name); any other is configured per spec or pool.
GPU_RESOURCE = "nvidia.com/gpu"
#: An extended resource name: ``<domain>/<name>`` (Kubernetes' qualified name with a DNS prefix), e.g.
#: ``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``, ``nvidia.com/gpu.shared``.
EXTENDED_RESOURCE_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
GpuResourceName = Annotated[str, Field(min_length=3, max_length=QUALIFIED_NAME_MAX, pattern=EXTENDED_RESOURCE_PATTERN)]


def resources_keys_rule(key_ok: str) -> str:
    """CEL rule of an object with ``resources``: every key ``k`` of its requests and limits satisfies ``key_ok``.

    Every field it reads is behind has(): the API server checks each rule against the object's ``default: {}`` as
    written, nested defaults not filled in, and an unguarded read makes the whole CRD invalid.
    """
    maps = (f"(!has(self.resources.{m}) || self.resources.{m}.all(k, {key_ok}))" for m in ("requests", "limits"))
    return "!has(self.resources) || (" + " && ".join(maps) + ")"


class TritonSpec(_Model):
    """The Triton pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    resources_keys_rule(
                        "!k.startsWith('nvidia.com/') || k == (has(self.gpuResource) ? self.gpuResource : "
                        f"'{GPU_RESOURCE}')"
                    ),
                    "an nvidia.com/ resource other than gpuResource is a GPU nothing would count: name it in "
                    "gpuResource and count it in gpusPerReplica",
                    ".resources",
                ),
            ]
        }
    )

    image: str = Field(
        default=DEFAULT_TRITON_IMAGE,
        min_length=1,
        max_length=PATH_MAX,
        pattern=PRINTABLE,
        description="Triton server image.",
    )
    gpusPerReplica: int = Field(
        default=1,
        ge=0,
        le=64,
        description=(
            "Units of gpuResource per replica (limit = request): whole GPUs, or MIG slices when gpuResource "
            "names one. 0 runs on CPU (KIND_CPU). GPU-hours count these units."
        ),
    )
    gpuResource: GpuResourceName = Field(
        default=GPU_RESOURCE,
        description=(
            "The extended resource that is the replica's GPU: nvidia.com/gpu, a MIG slice such as "
            "nvidia.com/mig-1g.10gb, or any resource a device plugin advertises. Instance groups are KIND_GPU "
            "for any of them."
        ),
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Extra resources; gpuResource, if given, must equal gpusPerReplica in requests and limits.",
    )
    nodeSelector: dict[QualifiedName, Annotated[str, Field(max_length=LABEL_VALUE_MAX, pattern=PRINTABLE)]] = Field(
        default_factory=dict, max_length=32, description="Node labels the Triton pods must run on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="Tolerations of the Triton pods."
    )
    args: list[Annotated[str, Field(max_length=PATH_MAX, pattern=PRINTABLE)]] = Field(
        default_factory=list, max_length=16, description="Extra tritonserver arguments."
    )


class PlacementMode(StrEnum):
    """Where a model's replicas run (spec.placement.mode)."""

    DEDICATED = "Dedicated"
    SHARED = "Shared"
    AUTO = "Auto"


#: A Kubernetes object name (DNS-1123 subdomain), e.g. a GPUPool's.
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
#: Largest GPU memory figure, MiB (1 TiB: beyond every GPU made).
GPU_MEMORY_MIB_MAX = 1_048_576


class PlacementSpec(_Model):
    """Whether the model has GPUs of its own or shares a GPUPool's Triton pods with other models."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.mode) || self.mode == 'Dedicated' || has(self.pool)",  # see TritonSpec's rule
                    "pool is required when mode is Shared or Auto",
                    ".pool",
                ),
            ]
        }
    )

    mode: PlacementMode = Field(
        default=PlacementMode.DEDICATED,
        json_schema_extra={"maxLength": 16},  # bounds the CEL rule's cost estimate
        description=(
            "Dedicated: replicas of its own (the default). Shared: always on the pool's shared pods. Auto: on "
            "the pool's pods while its load is below what one GPU serves at its SLA, on dedicated replicas when "
            "it fills one (with the joint plan's hysteresis)."
        ),
    )
    pool: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=OBJECT_NAME_PATTERN,
        description="Name of the GPUPool in the model's namespace (Shared and Auto).",
    )
    memoryMiB: int | None = Field(
        default=None,
        ge=1,
        le=GPU_MEMORY_MIB_MAX,
        description=(
            "GPU memory the loaded model holds (weights, workspace, activations at its largest batch), MiB. "
            "Without it the operator uses the measured figure, else a default of 2048."
        ),
    )


class BatchedModelSpec(_Model):
    """A model served by Triton under a p99 latency SLA, at the fewest GPUs that keep it."""

    model: ModelSpec
    sla: SLASpec
    profile: list[ProfilePoint] | None = Field(
        default=None,
        min_length=1,
        max_length=PROFILE_POINTS_MAX,
        description=(
            "Execution latency per batch size, batch sizes strictly increasing (measure it with `batchfill "
            "profile`). Optional: without it the operator measures the profile (spec.profiling)."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.map(p, p.batchSize).isSorted() && "
                    "self.all(p, self.exists_one(q, q.batchSize == p.batchSize))",
                    "profile batch sizes must be strictly increasing",
                )
            ]
        },
    )
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    profiling: ProfilingSpec = Field(default_factory=ProfilingSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    triton: TritonSpec = Field(default_factory=TritonSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)

    @property
    def profile_source(self) -> ProfileSource:
        """spec.profiling.source, defaulted: Declared when a profile is given, else Measured."""
        if self.profiling.source is not None:
            return self.profiling.source
        return ProfileSource.DECLARED if self.profile else ProfileSource.MEASURED


class ObjectMeta(BaseModel):
    """The parts of metadata batchfill reads; everything else is kept as is."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(default="unnamed", max_length=253)
    namespace: str | None = Field(default=None, max_length=63)
    generation: int | None = None


class BatchedModel(BaseModel):
    """A whole BatchedModel object as read from YAML or the API."""

    model_config = ConfigDict(extra="allow")

    apiVersion: Literal["batchfill.io/v1alpha1"] = "batchfill.io/v1alpha1"  # == API_VERSION (a str to mypy)
    kind: Literal["BatchedModel"] = "BatchedModel"  # == KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: BatchedModelSpec
