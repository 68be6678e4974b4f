"""Render Triton's ``config.pbtxt`` for a BatchedModel from its spec and its batching plan.

Pure: no I/O, no clock. The config is built as Triton's own protobuf message
(``tritonclient.grpc.model_config_pb2.ModelConfig``, generated from Triton's ``model_config.proto``) and
printed with ``google.protobuf.text_format``; no text is templated. The same inputs always give byte-identical
text, so :func:`config_hash` of it can go into a pod-template annotation and roll the pods exactly when the
config changes.

What is written (Triton docs: ``docs/user_guide/model_configuration.md``, schema ``model_config.proto``):

- ``name``, ``backend`` or ``platform``, and ``max_batch_size`` ALWAYS, including ``max_batch_size: 0``.
  proto3 drops zero scalars when printing, and Triton checks preferred sizes against whatever
  ``max_batch_size`` is literally in the file (a missing value counts as 0;
  docs/field-cases.md#preferred-above-max).
- ``input``/``output`` with ``dims`` WITHOUT the batch axis when ``max_batch_size > 0`` (Triton prepends it),
  and the full shape when it is 0. Exactly one leading axis is removed, and only from tensors the spec marks
  ``includesBatchDim``; a leading ``-1`` alone is never taken for a batch axis
  (docs/field-cases.md#batch-axis-in-dims).
- ``batch_input`` entries and ``allow_ragged_batch`` for ragged batching (Triton ``ragged_batching.md``;
  docs/field-cases.md#variable-length-inputs).
- One scheduler, never both (they are the ``oneof scheduling_choice``; docs/field-cases.md#stateful-models):
  ``dynamic_batching`` for stateless models with batching on, ``sequence_batching`` with an explicit
  ``oldest`` or ``direct`` strategy for stateful ones, nothing for stateless models with batching off.
- One ``instance_group``: ``KIND_GPU`` with ``count`` instances per GPU and no ``gpus`` list (Triton then
  places ``count`` instances on every GPU the container sees), or ``KIND_CPU``.

Nothing else (no ``parameters``, no ``version_policy``): Triton's defaults apply to everything not listed.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import tritonclient.grpc.model_config_pb2 as model_config_pb2
from google.protobuf import text_format

from batchfill.api.errors import Problem, SpecError
from batchfill.api.spec import BatchedModelSpec, SequenceStrategy, TensorSpec
from batchfill.api.status import PlanStatus
from batchfill.render.warmup import add_model_warmup

__all__ = [
    "InstanceKind",
    "build_model_config",
    "config_hash",
    "config_on_cpu",
    "config_with_parameters",
    "render_model_config",
]

#: Instance-group kinds batchfill renders (``ModelInstanceGroup.Kind`` in ``model_config.proto``).
InstanceKind = Literal["KIND_GPU", "KIND_CPU"]

#: Length of :func:`config_hash` (hex characters of the SHA-256 digest).
HASH_LENGTH = 16

#: Minimum slot utilization written for the Direct sequence strategy when the plan gives none. Triton
#: ignores Direct's max_queue_delay_microseconds while minimum_slot_utilization is 0
#: (docs/field-cases.md#stateful-models).
DEFAULT_MINIMUM_SLOT_UTILIZATION = 1.0

# Top-level fields in the order they are printed: identity, shapes, scheduling, placement. Every field
# build_model_config sets must be listed here (checked), so nothing set is ever left out of the text.
_TOP_LEVEL_ORDER = (
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "input",
    "output",
    "batch_input",
    "dynamic_batching",
    "sequence_batching",
    "instance_group",
    "model_warmup",
)
# Top-level scalars printed even when zero (proto3 would omit them).
_ALWAYS_PRINTED = frozenset({"max_batch_size"})

_PRINT_OPTIONS: dict[str, Any] = {"as_utf8": True, "use_short_repeated_primitives": True}


def build_model_config(
    spec: BatchedModelSpec,
    plan: PlanStatus,
    *,
    instance_kind: InstanceKind | None = None,
) -> model_config_pb2.ModelConfig:
    """Build the Triton ``ModelConfig`` message for ``spec`` served with ``plan``.

    Args:
        spec: a validated BatchedModel spec (:func:`batchfill.api.check_spec` found no problem).
        plan: the batching plan: ``maxBatchSize`` (samples per batch, 0 = batching off),
            ``preferredBatchSizes`` (samples, each in [1, maxBatchSize]), ``maxQueueDelayMicroseconds``
            (µs, >= 1 when batching is on), ``instanceCount`` (instances per GPU), and
            ``minimumSlotUtilization`` (fraction in (0, 1], Direct sequence strategy only; None means 1.0).
        instance_kind: override of the instance-group kind. Default: ``KIND_GPU`` when
            ``spec.triton.gpusPerReplica > 0``, else ``KIND_CPU``. ``KIND_CPU`` on a GPU spec is the local
            stand-in: ``count = plan.instanceCount * gpusPerReplica`` keeps the same parallelism.

    Returns:
        ``tritonclient.grpc.model_config_pb2.ModelConfig``. ``max_batch_size`` is a proto3 scalar, so the
        message alone cannot show an explicit 0: print it with :func:`render_model_config`.

    Raises:
        SpecError: the spec cannot be rendered as Triton config, naming the field: both or neither of
            ``spec.model.backend``/``platform``; dims that hold only the batch axis; dims that contradict
            ``rank``; ``allowRaggedBatch`` without ``spec.model.batchInputs``; ``spec.model.warmup`` without
            inputs or with a variable input dim.
        ValueError: the plan contradicts itself or the spec (a preferred size outside [1, maxBatchSize],
            listed twice, or given with batching off; a delay below 1 µs with batching on; a Direct
            ``minimumSlotUtilization`` of 0; ``maxBatchSize`` above ``spec.batching.maxBatchSize``), or
            ``instance_kind`` is unknown or ``KIND_GPU`` while ``spec.triton.gpusPerReplica`` is 0.

    Triton reference: ``model_configuration.md`` (Maximum Batch Size, Inputs and Outputs, Instance Groups,
    Dynamic Batcher, Sequence Batcher, Model Warmup) and ``model_config.proto`` (``ModelConfig``).

    Long because it fills one ModelConfig message field by field, in the order of Triton's model_config.proto.
    """
    _check_plan(spec, plan)
    model = spec.model
    mbs = plan.maxBatchSize
    cfg = model_config_pb2.ModelConfig()
    cfg.name = model.name
    if (model.backend is None) == (model.platform is None):
        given = "both are set" if model.backend is not None else "neither is set"
        raise SpecError(
            [
                Problem(
                    "spec.model.backend",
                    f"exactly one of backend or spec.model.platform must be set; {given}",
                )
            ]
        )
    if model.backend is not None:
        cfg.backend = model.backend
    else:
        cfg.platform = model.platform
    cfg.max_batch_size = mbs

    ragged_inputs = []
    input_dims = []
    for i, t in enumerate(model.inputs):
        where = f"spec.model.inputs[{i}]"
        inp = cfg.input.add()
        inp.name = t.name
        inp.data_type = model_config_pb2.DataType.Value(t.dataType.value)
        input_dims.append(_config_dims(t, mbs, where))
        inp.dims.extend(input_dims[-1])
        if t.allowRaggedBatch and mbs > 0:
            inp.allow_ragged_batch = True
            ragged_inputs.append(f"{where}.allowRaggedBatch")
    for i, t in enumerate(model.outputs):
        out = cfg.output.add()
        out.name = t.name
        out.data_type = model_config_pb2.DataType.Value(t.dataType.value)
        out.dims.extend(_config_dims(t, mbs, f"spec.model.outputs[{i}]"))
    if ragged_inputs and not model.batchInputs:
        raise SpecError(
            [
                Problem(
                    path,
                    "ragged batching requires batch_input entries and model support; none declared "
                    "(add spec.model.batchInputs)",
                )
                for path in ragged_inputs
            ]
        )
    for bi in model.batchInputs:
        entry = cfg.batch_input.add()
        entry.kind = model_config_pb2.BatchInput.Kind.Value(bi.kind.value)
        entry.target_name.append(bi.targetName)
        entry.data_type = model_config_pb2.DataType.Value(bi.dataType.value)
        entry.source_input.extend(bi.sourceInputs)

    if model.stateful:
        _add_sequence_batching(cfg, spec, plan)
    elif mbs > 0:
        dyn = cfg.dynamic_batching
        dyn.preferred_batch_size.extend(plan.preferredBatchSizes)
        dyn.max_queue_delay_microseconds = plan.maxQueueDelayMicroseconds
        dyn.SetInParent()  # present even in the (impossible) all-default case

    kind = _instance_kind(spec, instance_kind)
    group = cfg.instance_group.add()
    group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value(kind)
    if kind == "KIND_GPU":
        # No `gpus` list: Triton creates `count` instances on EACH GPU visible to the container, i.e. on
        # every nvidia.com/gpu the pod was given (model_configuration.md, "Instance Groups").
        group.count = plan.instanceCount
    else:
        group.count = plan.instanceCount * max(1, spec.triton.gpusPerReplica)
    add_model_warmup(cfg, model, mbs, input_dims)
    return cfg


def render_model_config(
    spec: BatchedModelSpec,
    plan: PlanStatus,
    *,
    instance_kind: InstanceKind | None = None,
) -> str:
    """The ``config.pbtxt`` text for ``spec`` served with ``plan`` (protobuf text format, ``\\n`` line ends).

    Same arguments and errors as :func:`build_model_config`. The text always has a top-level
    ``max_batch_size:`` line (also for 0), prints repeated numbers as lists (``dims: [3, 224, 224]``) and
    prints every ``batch_input`` field, including ``kind: BATCH_ELEMENT_COUNT`` (enum value 0). Before it is
    returned it is parsed back with ``text_format.Parse`` and compared with the message.

    Raises:
        SpecError, ValueError: as :func:`build_model_config`.
        RuntimeError: the printed text does not parse back to the same ``ModelConfig`` (a bug here).

    Triton reference: ``model_configuration.md`` (the file is ``<model-repository>/<model>/config.pbtxt``).
    """
    cfg = build_model_config(spec, plan, instance_kind=instance_kind)
    text = _print_model_config(cfg)
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    if parsed != cfg:
        raise RuntimeError("rendered config.pbtxt does not parse back to the ModelConfig it was printed from")
    return text


def config_hash(text: str) -> str:
    """Short stable digest of a rendered config: the first 16 hex characters of SHA-256 of its UTF-8 bytes.

    For a pod-template annotation, so the pods roll exactly when ``config.pbtxt`` changes.
    """
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_LENGTH]


def config_on_cpu(config_pbtxt: str) -> str:
    """``config_pbtxt`` with every ``instance_group`` moved to ``KIND_CPU`` (its ``gpus`` list dropped).

    For running a production config (``KIND_GPU``) on a machine without a GPU, where Triton refuses to load a
    ``KIND_GPU`` instance group. Everything else, batching included, is kept as it is. Raises
    ``google.protobuf.text_format.ParseError`` for text that is not a ``ModelConfig``.
    """
    cfg = text_format.Parse(config_pbtxt, model_config_pb2.ModelConfig())
    for group in cfg.instance_group:
        group.kind = model_config_pb2.ModelInstanceGroup.Kind.KIND_CPU
        del group.gpus[:]
    return _print_model_config(cfg)


def config_with_parameters(config_pbtxt: str, parameters: Mapping[str, str]) -> str:
    """``config_pbtxt`` with Triton model ``parameters`` set (string values; a model's own knobs, e.g. the
    sleep model's ``alpha_ms``). Raises ``google.protobuf.text_format.ParseError`` for text that is not a
    ``ModelConfig``."""
    cfg = text_format.Parse(config_pbtxt, model_config_pb2.ModelConfig())
    for key, value in parameters.items():
        cfg.parameters[key].string_value = value
    knobs = model_config_pb2.ModelConfig()
    knobs.parameters.MergeFrom(cfg.parameters)
    cfg.ClearField("parameters")
    # map entries are printed by text_format itself (sorted by key), after the fields batchfill renders
    return _print_model_config(cfg) + str(text_format.MessageToString(knobs, as_utf8=True))


# --- helpers -------------------------------------------------------------------------------------------


def _check_plan(spec: BatchedModelSpec, plan: PlanStatus) -> None:
    """Reject a plan Triton would refuse or silently misread (the plan comes from policy, so: ValueError)."""
    mbs = plan.maxBatchSize
    cap = spec.batching.maxBatchSize
    if cap is not None and mbs > cap:
        raise ValueError(f"plan.maxBatchSize={mbs} exceeds spec.batching.maxBatchSize={cap}")
    seen: set[int] = set()
    for i, size in enumerate(plan.preferredBatchSizes):
        where = f"plan.preferredBatchSizes[{i}]"
        if mbs == 0:
            raise ValueError(f"{where}={size} given with plan.maxBatchSize=0: preferred sizes need batching")
        if not 1 <= size <= mbs:
            raise ValueError(f"{where}={size} is outside [1, plan.maxBatchSize={mbs}]")
        if size in seen:
            raise ValueError(f"{where}={size} is listed twice")
        seen.add(size)
    if mbs > 0 and plan.maxQueueDelayMicroseconds < 1:
        # Triton's default of 0 depends on the release (docs/field-cases.md#queue-delay-units); the plan always
        # states a delay.
        raise ValueError(
            f"plan.maxQueueDelayMicroseconds={plan.maxQueueDelayMicroseconds} must be >= 1 µs when "
            f"batching is on (plan.maxBatchSize={mbs})"
        )


def _config_dims(t: TensorSpec, max_batch_size: int, where: str) -> list[int]:
    """``dims`` as Triton wants them: without the batch axis when batching is on, the full shape when off."""
    dims = list(t.dims)
    if max_batch_size > 0 and t.includesBatchDim:
        dims = dims[1:]  # exactly one leading axis, never more; a leading -1 alone means nothing here
    if not dims:
        raise SpecError(
            [
                Problem(
                    f"{where}.dims",
                    f"={list(t.dims)} holds only the batch axis; give the per-sample dims too (Triton needs "
                    "at least one dim)",
                )
            ]
        )
    if t.rank is not None:
        expected = t.rank - 1 if max_batch_size > 0 else t.rank
        if len(dims) != expected:
            state = (
                f"batching is on (max_batch_size {max_batch_size}), so Triton adds the batch axis"
                if max_batch_size > 0
                else "batching is off (max_batch_size 0), so dims must be the full shape"
            )
            raise SpecError(
                [
                    Problem(
                        f"{where}.dims",
                        f"={list(t.dims)} renders {len(dims)} dims but model rank is {t.rank} and {state}; "
                        f"expected {expected} dims",
                    )
                ]
            )
    return dims


def _add_sequence_batching(cfg: Any, spec: BatchedModelSpec, plan: PlanStatus) -> None:
    """``sequence_batching`` with the strategy always explicit (Triton's default, Direct, is never implied).

    Triton reference: ``model_configuration.md`` "Sequence Batcher" and ``architecture.md`` "Stateful
    Models" (Direct and Oldest strategies); ``ModelSequenceBatching`` in ``model_config.proto``.
    """
    mbs = plan.maxBatchSize
    seq = cfg.sequence_batching
    if spec.model.sequenceStrategy is SequenceStrategy.DIRECT:
        direct = seq.direct
        msu = plan.minimumSlotUtilization
        if msu is None:
            msu = DEFAULT_MINIMUM_SLOT_UTILIZATION
        if not 0 < msu <= 1:
            raise ValueError(
                f"plan.minimumSlotUtilization={msu} must be in (0, 1] for the Direct sequence strategy: at 0 "
                "Triton ignores max_queue_delay_microseconds"
            )
        if mbs > 0:
            direct.max_queue_delay_microseconds = plan.maxQueueDelayMicroseconds
        direct.minimum_slot_utilization = msu
        # Direct reserves a batch slot per sequence: preferred sizes do not exist there
        # (docs/field-cases.md#stateful-models), so a plan's preferred sizes are not written.
        direct.SetInParent()
    else:
        oldest = seq.oldest
        oldest.max_candidate_sequences = max(1, mbs)
        oldest.preferred_batch_size.extend(plan.preferredBatchSizes)
        if mbs > 0:
            oldest.max_queue_delay_microseconds = plan.maxQueueDelayMicroseconds
        oldest.SetInParent()


def _instance_kind(spec: BatchedModelSpec, override: InstanceKind | None) -> InstanceKind:
    gpus = spec.triton.gpusPerReplica
    if override is None:
        return "KIND_GPU" if gpus > 0 else "KIND_CPU"
    if override not in get_args(InstanceKind):
        raise ValueError(f"instance_kind={override!r} must be one of {', '.join(get_args(InstanceKind))}")
    if override == "KIND_GPU" and gpus == 0:
        raise ValueError(
            "instance_kind=KIND_GPU but spec.triton.gpusPerReplica=0: the pod gets no GPU, so a KIND_GPU "
            "instance group cannot load"
        )
    return override


def _print_model_config(cfg: Any) -> str:
    """Protobuf text of ``cfg``, fields in ``_TOP_LEVEL_ORDER``, zero scalars in ``_ALWAYS_PRINTED`` kept."""
    descriptor = cfg.DESCRIPTOR
    unlisted = sorted({fd.name for fd, _ in cfg.ListFields()} - set(_TOP_LEVEL_ORDER))
    if unlisted:
        raise RuntimeError(f"ModelConfig fields set but not printed: {unlisted}")
    out = io.StringIO()
    for name in _TOP_LEVEL_ORDER:
        fd = descriptor.fields_by_name[name]
        value = getattr(cfg, name)
        if fd.is_repeated:
            for element in value:
                _print_field(fd, element, out)
        elif name in _ALWAYS_PRINTED or _is_set(cfg, fd):
            _print_field(fd, value, out)
    text: str = out.getvalue()
    return text


def _is_set(message: Any, fd: Any) -> bool:
    if fd.message_type is not None:
        return bool(message.HasField(fd.name))
    return bool(getattr(message, fd.name) != fd.default_value)


def _print_field(fd: Any, value: Any, out: io.StringIO) -> None:
    text_format.PrintField(fd, value, out, message_formatter=_format_message, **_PRINT_OPTIONS)


def _format_message(message: Any, indent: int, as_one_line: bool) -> str | None:
    """``text_format`` hook: print every field of a ``BatchInput`` (its ``kind`` 0 would be dropped)."""
    if message.DESCRIPTOR.full_name != model_config_pb2.BatchInput.DESCRIPTOR.full_name or as_one_line:
        return None
    out = io.StringIO()
    for fd in message.DESCRIPTOR.fields:
        value = getattr(message, fd.name)
        elements: Sequence[Any] = list(value) if fd.is_repeated else [value]
        for element in elements:
            text_format.PrintField(fd, element, out, indent=indent, **_PRINT_OPTIONS)
    # text_format writes the indent before the returned text and a newline after it.
    body: str = out.getvalue()
    return body[indent:].rstrip("\n")
