"""Triton's counter series written as OpenMetrics text for :meth:`LocalPrometheus.backfill`: the history a model's
pods would have left in Prometheus, for tests that need more of it than they can afford to serve live (the rate
variability of policy/headroom.py looks back 30 min)."""

from __future__ import annotations

from collections.abc import Iterable

from batchfill.adapters.metrics import COUNTERS

#: Queue time the written series claim per request, microseconds (Triton's queue counter is in µs).
QUEUE_US_PER_REQUEST = 2000.0
#: Samples per execution the written series claim (Triton counts executions separately from inferences).
SAMPLES_PER_EXECUTION = 4.0


def counter_samples(namespace: str, pod: str, model: str, time_s: int, success: float) -> list[str]:
    """The OpenMetrics sample lines of Triton's counters (:data:`COUNTERS`) of one pod at Unix second ``time_s``,
    after ``success`` successful single-sample requests since the server started: as many inferences, one
    execution per :data:`SAMPLES_PER_EXECUTION`, :data:`QUEUE_US_PER_REQUEST` of queue each, no failure. The
    labels are the ones a ServiceMonitor adds (``namespace``, ``pod``) and Triton's own ``model``."""
    labels = f'model="{model}",namespace="{namespace}",pod="{pod}"'
    values = {
        "success": success,
        "inferences": success,
        "executions": success / SAMPLES_PER_EXECUTION,
        "queue_us": success * QUEUE_US_PER_REQUEST,
    }
    return [f"{metric}{{{labels}}} {values.get(name, 0.0):.3f} {time_s}" for name, metric in COUNTERS.items()]


def openmetrics(lines: Iterable[str]) -> str:
    """``lines`` of :func:`counter_samples` as one OpenMetrics document: each series' samples together in time
    order (promtool refuses them otherwise), ending in ``# EOF``."""
    ordered = sorted(lines, key=lambda line: (line.rsplit(" ", 2)[0], int(line.rsplit(" ", 1)[1])))
    return "\n".join(ordered) + "\n# EOF\n"
