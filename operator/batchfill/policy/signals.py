"""Measured load of one BatchedModel over one window: the contract between adapters.metrics and policy.scaling.

Pure data. The adapter fills it from Prometheus (the queries are in adapters/metrics.py); the scaling policy
reads it. Every float is finite: the adapter turns NaN, +-Inf, empty results and query failures into a state,
never into a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class SignalState(StrEnum):
    """What the window says about the load.

    * ``Ok``: series present for the BatchedModel's Ready pods and traffic flowed: requests succeeded, or failed
      (a model whose every request fails is Ok with a request rate of 0 and a failure rate: it has traffic).
    * ``Idle``: series present, no request succeeded or failed in the window (no traffic is a fact, not a gap).
    * ``Unknown``: no usable data (Prometheus down or timing out, no series for the Ready pods, NaN/Inf).
      The scaling policy holds on Unknown; it never treats missing data as zero load
      (docs/field-cases.md#missing-metrics).
    """

    OK = "Ok"
    IDLE = "Idle"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class ModelSignals:
    """Signals of one BatchedModel aggregated over its Ready pods.

    Rates are sums over pods of per-series rates (counter resets handled per series before summing,
    docs/field-cases.md#counter-resets); ratios are ratios of sums (docs/field-cases.md#average-batch-size).
    ``None`` means "not measured in this window" (for example no p99 summary because nothing was served), never
    zero.

    Attributes:
        state: see :class:`SignalState`.
        reason: a :class:`~batchfill.api.reasons.SignalsReason` when ``state`` is Unknown, else "".
        message: human explanation with numbers, for a condition message.
        window_s: the rate window in seconds.
        pods: Ready pods of the BatchedModel with series in the window.
        request_rate_rps: successful requests per second, all pods (Σ rate(nv_inference_request_success)).
        inference_rate_rps: inferences (samples) per second, all pods (Σ rate(nv_inference_count)).
        avg_batch_size: Σ Δnv_inference_count / Σ Δnv_inference_exec_count (samples per executed batch).
        batch_fill: avg_batch_size / the plan's max_batch_size, in [0, 1].
        queue_time_ms: Σ Δnv_inference_queue_duration_us / Σ Δnv_inference_request_success / 1000.
        p99_ms: server-side p99 request latency (largest over the pods), from Triton's summary.
        pending_requests: requests waiting in Triton's queues now (Σ nv_inference_pending_request_count).
        failure_rate_rps: failed requests per second, all pods (Σ rate(nv_inference_request_failure): rejected
            inputs, backend errors, cancellations); None when no counted pod has the counter.
        rate_change_rms: the rate variability (policy/headroom.py): root mean square of the natural-log changes
            of the model's request rate (every pod it had) over 60 s, over the last 30 min; dimensionless (0.1:
            about 10 % per minute); None when too few changes are known. It widens nothing: unknown keeps the
            user's targetUtilization.
    """

    state: SignalState
    reason: str = ""
    message: str = ""
    window_s: float = 60.0
    pods: int = 0
    request_rate_rps: float | None = None
    inference_rate_rps: float | None = None
    avg_batch_size: float | None = None
    batch_fill: float | None = None
    queue_time_ms: float | None = None
    p99_ms: float | None = None
    pending_requests: float | None = None
    failure_rate_rps: float | None = None
    rate_change_rms: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "window_s",
            "request_rate_rps",
            "inference_rate_rps",
            "avg_batch_size",
            "batch_fill",
            "queue_time_ms",
            "p99_ms",
            "pending_requests",
            "failure_rate_rps",
            "rate_change_rms",
        ):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"ModelSignals.{name}={value!r} must be finite and >= 0")

    @property
    def failure_fraction(self) -> float | None:
        """Failed requests / (failed + successful requests) in the window, in [0, 1]; None without a failure
        rate or without any request."""
        failed, succeeded = self.failure_rate_rps, self.request_rate_rps or 0.0
        if failed is None or failed + succeeded <= 0:
            return None
        return failed / (failed + succeeded)

    @classmethod
    def unknown(cls, reason: str, message: str, window_s: float = 60.0) -> ModelSignals:
        """No usable data; ``reason`` is a SignalsReason (it becomes the MetricsAvailable condition's reason)."""
        return cls(state=SignalState.UNKNOWN, reason=reason, message=message, window_s=window_s)
