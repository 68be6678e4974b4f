"""Cost per model on a shared pod: the pod's GPU-hours split by each model's share of its execution time (pure).

A shared Triton pod's GPU is held for all the models loaded on it. Each model's share of an interval is its
execution time in that interval over the execution time of all models on the pod, read from Triton's cumulative
per-model counters (https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html,
"Latencies"): ``nv_inference_compute_input_duration_us + nv_inference_compute_infer_duration_us +
nv_inference_compute_output_duration_us``, microseconds, summed over the model's versions. The same time-share rule
as a chargeback of a time-sliced resource: time nobody used (an idle interval) is split evenly among the models
loaded at the end of it, since each of them kept the GPU held.

Cases, each explicit (as a KEDA scaler treats its metric): a counter that went down was reset (the model was
reloaded or the pod restarted), so its increase is its new value, as Prometheus' ``increase()`` counts it; a model
with no sample before the interval was loaded during it, so the same; a model that had a sample before but none
after was unloaded, and its last increment is unknown; a NaN, infinite or negative sample is unknown. Any unknown
makes every share unknown (the shares depend on every model's time), so the whole interval is *unattributed*
rather than split on a guess; the caller exports that remainder so the totals still add up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from batchfill.api.reasons import CostSplitReason

#: Why an interval was split as it was (exported as a label; docs/operations.md).
SPLIT_BY_EXECUTION = CostSplitReason.EXECUTION_TIME
SPLIT_IDLE_EVENLY = CostSplitReason.IDLE_SPLIT_EVENLY
UNATTRIBUTED_UNKNOWN_COUNTER = CostSplitReason.UNKNOWN_COUNTER
UNATTRIBUTED_UNLOADED = CostSplitReason.MODEL_UNLOADED
UNATTRIBUTED_NO_MODEL = CostSplitReason.NO_MODEL_LOADED


@dataclass(frozen=True)
class ExecutionCounters:
    """One model's cumulative Triton counters on one pod at one scrape, microseconds.

    Attributes:
        compute_input_us: ``nv_inference_compute_input_duration_us``.
        compute_infer_us: ``nv_inference_compute_infer_duration_us``.
        compute_output_us: ``nv_inference_compute_output_duration_us``.
    """

    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float

    @property
    def total_us(self) -> float:
        """Input + infer + output, µs; NaN when any part is NaN, infinite or negative (unknown)."""
        parts = (self.compute_input_us, self.compute_infer_us, self.compute_output_us)
        if not all(math.isfinite(p) and p >= 0 for p in parts):
            return math.nan
        return sum(parts)


@dataclass(frozen=True)
class CostSplit:
    """One pod-interval's GPU time split among its models.

    Attributes:
        gpu_seconds: per model, GPU-seconds attributed (sums to the pod's GPU-seconds unless unattributed).
        unattributed_gpu_seconds: GPU-seconds no model could be charged with (see ``reason``).
        reason: how it was split (:class:`~batchfill.api.reasons.CostSplitReason`).
        execution_us: per model, its execution time in the interval, µs (empty when unattributed).
    """

    gpu_seconds: Mapping[str, float]
    unattributed_gpu_seconds: float
    reason: CostSplitReason
    execution_us: Mapping[str, float] = field(default_factory=dict)


def _increase(before: ExecutionCounters | None, after: ExecutionCounters) -> float:
    """Counter increase over the interval, µs: a reset or a first sample counts from 0; NaN when unknown."""
    now = after.total_us
    if before is None or math.isnan(now):
        return now
    then = before.total_us
    if math.isnan(then):
        return math.nan
    return now if now < then else now - then


def split_gpu_time(
    pod_gpu_seconds: float,
    before: Mapping[str, ExecutionCounters],
    after: Mapping[str, ExecutionCounters],
) -> CostSplit:
    """Split ``pod_gpu_seconds`` (GPUs held by the pod x interval length, s) among the models by execution time.

    Args:
        pod_gpu_seconds: GPU-seconds the pod held in the interval (units of its GPU resource x seconds), >= 0.
        before: per model name, its counters at the start of the interval (models without a series absent).
        after: per model name, its counters at the end.

    Returns:
        The split (module docstring for the cases). Deterministic: models in sorted order.

    Raises:
        ValueError: ``pod_gpu_seconds`` negative or not finite.
    """
    if not (math.isfinite(pod_gpu_seconds) and pod_gpu_seconds >= 0):
        raise ValueError(f"pod_gpu_seconds={pod_gpu_seconds} must be a finite number >= 0")
    if sorted(set(before) - set(after)):
        return CostSplit({}, pod_gpu_seconds, UNATTRIBUTED_UNLOADED)
    if not after:
        return CostSplit({}, pod_gpu_seconds, UNATTRIBUTED_NO_MODEL)
    used = {m: _increase(before.get(m), after[m]) for m in sorted(after)}
    if any(math.isnan(u) for u in used.values()):
        return CostSplit({}, pod_gpu_seconds, UNATTRIBUTED_UNKNOWN_COUNTER)
    total = sum(used.values())
    if total <= 0:
        even = pod_gpu_seconds / len(used)
        return CostSplit(dict.fromkeys(used, even), 0.0, SPLIT_IDLE_EVENLY, used)
    return CostSplit({m: pod_gpu_seconds * u / total for m, u in used.items()}, 0.0, SPLIT_BY_EXECUTION, used)


def add_splits(splits: list[CostSplit]) -> tuple[dict[str, float], float]:
    """Per-model GPU-seconds and the unattributed remainder summed over several pods or intervals."""
    per_model: dict[str, float] = {}
    unattributed = 0.0
    for s in splits:
        unattributed += s.unattributed_gpu_seconds
        for m, g in s.gpu_seconds.items():
            per_model[m] = per_model.get(m, 0.0) + g
    return dict(sorted(per_model.items())), unattributed
