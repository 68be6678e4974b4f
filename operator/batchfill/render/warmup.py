"""Triton ``model_warmup`` entries for a model's ``spec.model.warmup`` (pure).

Triton runs each entry on every model instance while the model loads and marks the model READY only after
them (``model_configuration.md``, "Model Warmup"; ``model_config.proto`` ``ModelWarmup``). READY is what the
operator waits for before it routes to a new replica or labels a pool pod for a model, so with warm-up the first
requests routed there are not the model's first executions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchfill.api.errors import SpecError
from batchfill.api.spec import ModelSpec, WarmupData
from batchfill.api.validate import warmup_problems


def warmup_batch_sizes(requested: Sequence[int], max_batch_size: int) -> list[int]:
    """The batch sizes to warm up with, ascending and each once: ``requested`` (or ``[1, max_batch_size]`` when
    empty) capped at ``max_batch_size``; ``[1]`` when batching is off (``max_batch_size`` 0)."""
    if max_batch_size <= 0:
        return [1]
    return sorted({min(b, max_batch_size) for b in (requested or (1, max_batch_size))})


def add_model_warmup(cfg: Any, model: ModelSpec, max_batch_size: int, input_dims: Sequence[Sequence[int]]) -> None:
    """Append ``model_warmup`` entries to ``cfg`` (a ``ModelConfig``) for ``model.warmup``; nothing without it.

    Args:
        cfg: the ``tritonclient.grpc.model_config_pb2.ModelConfig`` being built, with its inputs.
        model: the spec's model: its ``warmup`` and ``inputs``.
        max_batch_size: the planned ``max_batch_size`` (0: batching off).
        input_dims: each input's dims as rendered in ``cfg`` (per sample when batching is on), the order of
            ``model.inputs``.

    Raises:
        SpecError: :func:`batchfill.api.validate.warmup_problems` found some (no inputs, a variable dim).
    """
    warmup = model.warmup
    if warmup is None:
        return
    problems = warmup_problems(model, input_dims)
    if problems:
        raise SpecError(problems)
    for b in warmup_batch_sizes(warmup.batchSizes, max_batch_size):
        entry = cfg.model_warmup.add()
        entry.name = f"batch_{b}"
        entry.batch_size = b
        entry.count = warmup.count
        for t, dims, inp in zip(model.inputs, input_dims, cfg.input, strict=True):
            data = entry.inputs[t.name]
            data.data_type = inp.data_type
            data.dims.extend(dims)
            if warmup.data == WarmupData.RANDOM:
                data.random_data = True
            else:
                data.zero_data = True
