"""Each pool tick's GPU time, split among the models on each pod (pure; :func:`batchfill.policy.cost.split_gpu_time`).

Between two reads of a pod's execution counters (Triton's statistics, one call per Ready pod per tick), the pod
held ``gpusPerPod`` units of the pool's GPU resource for the time between the reads; that time is split among its
models by their execution time. A pod whose counters could not be read this tick (the read failed, or the pod was
not read at all: not Ready for a moment, its index unread) charges its interval to no model (``UnknownCounter``),
and so does its next interval, which has no counters to start from; a pod read for the first time (new, or the
operator restarted) only starts its interval: its earlier time is not known to this operator. So every second a
pod once read is still listed counts, attributed or not.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from batchfill.api.reasons import CostSplitReason
from batchfill.policy.cost import CostSplit, ExecutionCounters, split_gpu_time

#: Longest interval charged at once, s: after a longer gap (the operator paused, a pod unread for long) the pod's
#: time is not known well enough to charge any model with it.
MAX_INTERVAL_S = 600.0


@dataclass(frozen=True)
class CostMemory:
    """Per pod: when its interval last ended (epoch s) and its counters then, by BatchedModel name (None: they could
    not be read, so the next interval has nothing to split by)."""

    reads: Mapping[str, tuple[float, Mapping[str, ExecutionCounters] | None]] = field(default_factory=dict)


def decide_cost(
    reads: Mapping[str, Mapping[str, ExecutionCounters] | None],
    names: Mapping[str, str],
    gpus_per_pod: float,
    memory: CostMemory,
    now: float,
    listed: Collection[str] = (),
) -> tuple[list[CostSplit], CostMemory]:
    """This tick's splits, one per pod with an interval, and the memory for the next tick.

    Args:
        reads: per Ready pod, its counters by Triton model name, or None when they could not be read.
        names: Triton model name -> BatchedModel name of the pool's members (a model loaded on the pod that is no
            member keeps its Triton name: its time is still the pod's).
        gpus_per_pod: units of the GPU resource each pod holds (spec.gpusPerPod).
        memory: the previous tick's memory.
        now: seconds since the epoch.
        listed: the names of every pod of the pool this tick (those in ``reads`` included): one the memory holds
            that was not read is charged as unreadable.

    Returns:
        (splits, memory); a pod no longer listed is forgotten.
    """
    splits: list[CostSplit] = []
    kept: dict[str, tuple[float, Mapping[str, ExecutionCounters] | None]] = {}
    for pod in sorted(set(reads) | (set(listed) & set(memory.reads))):
        counters = reads.get(pod)
        before = memory.reads.get(pod)
        interval = now - before[0] if before is not None else 0.0
        charged = before is not None and 0 < interval <= MAX_INTERVAL_S and math.isfinite(interval)
        unknown = CostSplit({}, gpus_per_pod * interval, CostSplitReason.UNKNOWN_COUNTER)
        if counters is None:
            if charged:
                splits.append(unknown)
            if before is not None:
                kept[pod] = (now, None)
            continue
        after = {names.get(m, m): c for m, c in counters.items()}
        if charged and before is not None:
            splits.append(unknown if before[1] is None else split_gpu_time(gpus_per_pod * interval, before[1], after))
        kept[pod] = (now, after)
    return splits, CostMemory(kept)
