"""The GPUPool resource: shared Triton pods that BatchedModels with ``spec.placement.mode`` Shared or Auto are packed
onto (pydantic v2 models, the single source of the GPUPool CRD, :func:`batchfill.api.crd.build_pool_crd`).

The pool is how a platform team opts in to sharing: it names the GPU (any extended resource: a whole
``nvidia.com/gpu``, a MIG slice such as ``nvidia.com/mig-1g.10gb``), how much of it each pod holds and how much GPU
memory that is, the Triton image, the repository the shared pods load models from, and bounds on the pods. A model
only joins a pool it names in its own namespace, and only a pool someone with the RBAC to create GPUPools made.

Namespaced, like BatchedModel: the pool's pods, the per-model Services and the model repository (a PVC) all live in
one namespace; a platform team that serves several namespaces makes a pool in each.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from batchfill.api.spec import (
    DEFAULT_TRITON_IMAGE,
    GPU_MEMORY_MIB_MAX,
    GPU_RESOURCE,
    LABEL_VALUE_MAX,
    PATH_MAX,
    PRINTABLE,
    GpuResourceName,
    ModelRepository,
    ObjectMeta,
    QualifiedName,
    ResourceRequirements,
    Toleration,
    cel,
    resources_keys_rule,
)
from batchfill.api.status import Condition

POOL_KIND = "GPUPool"
POOL_PLURAL = "gpupools"
POOL_SINGULAR = "gpupool"
POOL_SHORT_NAMES = ("gpool",)
#: Most models one pool pod loads (Triton's repository API takes any number; the bound keeps each load plan, the
#: pod's labels and the status of the pool small).
MODELS_PER_POD_MAX = 64
#: Most pods one pool runs.
POOL_PODS_MAX = 1_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False)


class PoolTritonSpec(_Model):
    """The pool's Triton pods (the GPU is set on the pool itself: gpuResource, gpusPerPod)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    resources_keys_rule("!k.startsWith('nvidia.com/')"),
                    "the pool's GPU is spec.gpuResource and spec.gpusPerPod, not triton.resources",
                    ".resources",
                ),
            ]
        }
    )

    image: str = Field(
        default=DEFAULT_TRITON_IMAGE, min_length=1, max_length=PATH_MAX, pattern=PRINTABLE, description="Triton image."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU and memory of the Triton container (no GPU here)."
    )
    nodeSelector: dict[QualifiedName, Annotated[str, Field(max_length=LABEL_VALUE_MAX, pattern=PRINTABLE)]] = Field(
        default_factory=dict, max_length=32, description="Node labels the pool's pods must run on."
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16, description="Tolerations of the pods.")
    args: list[Annotated[str, Field(max_length=PATH_MAX, pattern=PRINTABLE)]] = Field(
        default_factory=list, max_length=16, description="Extra tritonserver arguments."
    )


class GPUPoolSpec(_Model):
    """A pool of Triton pods with explicit model control that models share."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.minPods <= self.maxPods", "minPods must be <= maxPods", ".minPods"),
            ]
        }
    )

    gpuResource: GpuResourceName = Field(
        default=GPU_RESOURCE,
        description="The extended resource that is a pod's GPU: nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...",
    )
    gpusPerPod: int = Field(
        default=1,
        ge=1,
        le=8,
        description="Units of gpuResource per pod (limit = request); GPU-hours count these units. Triton places "
        "every loaded model's instances on each GPU of its pod (KIND_GPU), so a pod of n is n of the joint "
        "plan's shared GPUs holding the same models.",
    )
    gpuMemoryMiB: int = Field(
        ge=1,
        le=GPU_MEMORY_MIB_MAX,
        description="GPU memory of one unit of gpuResource, MiB (e.g. 10240 for nvidia.com/mig-1g.10gb).",
    )
    repository: ModelRepository = Field(
        description="The model repository the pods load from: each shared model's directory is its spec.model.name."
    )
    triton: PoolTritonSpec = Field(default_factory=PoolTritonSpec)
    minPods: int = Field(default=0, ge=0, le=POOL_PODS_MAX, description="Fewest pods (0: none while no model).")
    maxPods: int = Field(default=8, ge=1, le=POOL_PODS_MAX, description="Most pods (the pool's GPU budget).")
    maxModelsPerPod: int = Field(default=16, ge=1, le=MODELS_PER_POD_MAX, description="Most models loaded on one pod.")


class GPUPoolStatus(BaseModel):
    """Status subresource of a GPUPool (the operator writes it)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    observedGeneration: int | None = Field(default=None, ge=0)
    pods: int | None = Field(default=None, ge=0, description="Pods of the pool.")
    readyPods: int | None = Field(default=None, ge=0, description="Ready pods.")
    desiredPods: int | None = Field(default=None, ge=0, description="Pods the joint plan calls for.")
    models: int | None = Field(default=None, ge=0, description="BatchedModels placed on the pool.")
    planHeadroom: float | None = Field(
        default=None, ge=0, le=1, description="Least fraction of a pod's GPU time the plan leaves unused."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        description="ConfigValid: False (InvalidSpec, ApplyRejected) naming the fields while the pool cannot be "
        "served; the pool's pods are then left as they are.",
    )


class GPUPool(BaseModel):
    """A whole GPUPool object as read from YAML or the API."""

    model_config = ConfigDict(extra="allow")

    apiVersion: Literal["batchfill.io/v1alpha1"] = "batchfill.io/v1alpha1"
    kind: Literal["GPUPool"] = "GPUPool"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GPUPoolSpec
