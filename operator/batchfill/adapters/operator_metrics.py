"""The operator's own Prometheus metrics (prometheus-client), served on ``/metrics`` of ``BATCHFILL_METRICS_PORT``.

Per BatchedModel (labels ``namespace``, ``name``): desired, recommended and actual replicas, observed batch fill,
queue time and p99, p99 headroom against the server budget T, scaling decisions by reason, and GPU-hours (replicas x
units of the GPU resource per replica integrated over time; a MIG slice is a unit) so cost sits next to latency.
Models on a shared pool are charged their share of its pods' GPU-hours (:func:`observe_cost`). Reconcile durations by
handler; the duration of each whole pass of the scaling and profiling loops (``loop`` label). A private registry, so
importing this module twice (tests) registers nothing globally.

With ``scaling.mode`` Off the desired count is the current one (:func:`batchfill.policy.scaling.decide`), so an
external autoscaler scales on the recommended replicas or on the capacity per replica instead (README "Keeping your
autoscaler").
"""

from __future__ import annotations

import contextlib
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from batchfill.api.spec import GPU_RESOURCE
from batchfill.policy.cost import CostSplit, add_splits
from batchfill.policy.scaling import Decision
from batchfill.policy.signals import ModelSignals

REGISTRY = CollectorRegistry(auto_describe=True)
_REASONS: dict[tuple[str, str], set[str]] = {}  # decision reasons seen per model, to remove their series
_RESOURCES: dict[tuple[str, str], str] = {}  # the GPU resource last exported per model, to replace its series
_LABELS = ("namespace", "name")

DESIRED = Gauge("batchfill_desired_replicas", "Replicas the scaling decision wants.", _LABELS, registry=REGISTRY)
RECOMMENDED = Gauge(
    "batchfill_recommended_replicas",
    "Load-proportional replicas ceil(load / (the targetUtilization in effect x capacity at SLA)), load and capacity "
    "in req/s, before bounds, tolerance and stabilization; in every scaling.mode (absent while the load is not "
    "measurable).",
    _LABELS, registry=REGISTRY,
)  # fmt: skip
REPLICAS = Gauge("batchfill_replicas", "Triton replicas of the Deployment (spec).", _LABELS, registry=REGISTRY)
READY = Gauge("batchfill_ready_replicas", "Ready Triton replicas.", _LABELS, registry=REGISTRY)
FILL = Gauge("batchfill_batch_fill", "Observed average batch size / max_batch_size.", _LABELS, registry=REGISTRY)
QUEUE = Gauge("batchfill_queue_time_seconds", "Observed queue time per request.", _LABELS, registry=REGISTRY)
P99 = Gauge("batchfill_p99_seconds", "Observed server-side p99 (largest over pods).", _LABELS, registry=REGISTRY)
HEADROOM = Gauge(
    "batchfill_p99_headroom_seconds", "Server budget T minus the observed p99 (negative: SLA missed).", _LABELS,
    registry=REGISTRY,
)  # fmt: skip
REQUEST_RATE = Gauge("batchfill_request_rate", "Observed requests per second.", _LABELS, registry=REGISTRY)
CAPACITY = Gauge(
    "batchfill_capacity_per_replica",
    "Capacity at SLA per replica of the config the pods run (the plan's; while a hand rollback holds, the served "
    "config's), req/s.",
    _LABELS,
    registry=REGISTRY,
)
SLA = Gauge("batchfill_server_budget_seconds", "Server budget T = latencyP99Ms - networkOverheadMs.", _LABELS,
            registry=REGISTRY)  # fmt: skip
METRICS_AVAILABLE = Gauge("batchfill_metrics_available", "1 when the last signals were usable.", _LABELS,
                          registry=REGISTRY)  # fmt: skip
DECISIONS = Counter("batchfill_scaling_decisions", "Scaling decisions by reason.", (*_LABELS, "reason"),
                    registry=REGISTRY)  # fmt: skip
GPU_HOURS = Counter(
    "batchfill_gpu_hours",
    "Replicas x units of the GPU resource per replica (spec.triton.gpuResource: whole GPUs, or MIG slices), "
    "integrated over time (hours); batchfill_gpu_resource names the unit.", _LABELS, registry=REGISTRY,
)  # fmt: skip
GPU_RESOURCE_UNITS = Gauge(
    "batchfill_gpu_resource", "Units of the GPU resource (label resource) each replica holds: what a GPU-hour counts.",
    (*_LABELS, "resource"), registry=REGISTRY,
)  # fmt: skip
MODEL_GPU_HOURS = Counter(
    "batchfill_model_gpu_hours",
    "GPU-hours of shared pool pods attributed to the model by its share of their execution time (Triton's "
    "compute input + infer + output duration counters; batchfill.policy.cost).", _LABELS, registry=REGISTRY,
)  # fmt: skip
MODEL_GPU_SHARE = Gauge(
    "batchfill_model_gpu_share",
    "The model's fraction of its pool's GPU time in the last attributed interval (0-1).", _LABELS, registry=REGISTRY,
)  # fmt: skip
POOL_UNATTRIBUTED = Counter(
    "batchfill_pool_unattributed_gpu_hours",
    "GPU-hours of a pool's pods charged to no model (reason: UnknownCounter, ModelUnloaded, NoModelLoaded).",
    ("namespace", "pool", "reason"), registry=REGISTRY,
)  # fmt: skip
RECONCILE = Histogram(
    "batchfill_reconcile_duration_seconds", "Handler durations.", ("handler",), registry=REGISTRY,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)  # fmt: skip
PASS_DURATION = Histogram(
    "batchfill_loop_pass_duration_seconds",
    "Duration of one whole pass of an operator loop over every BatchedModel (loop: scaling or profiling).",
    ("loop",), registry=REGISTRY, buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600),
)  # fmt: skip
LAST_PASS = Gauge(
    "batchfill_loop_last_pass_duration_seconds", "Duration of the loop's last completed pass.", ("loop",),
    registry=REGISTRY,
)  # fmt: skip
LEADER = Gauge(
    "batchfill_operator_leader", "1 while this operator replica holds the leader-election Lease (acts), else 0.",
    registry=REGISTRY,
)  # fmt: skip
_SERVED: set[int] = set()
_SERVE_LOCK = threading.Lock()


def serve(port: int) -> None:
    """Serve ``/metrics`` on ``port`` (0: off). Idempotent: `batchfill run` serves it before waiting for the Lease
    (a standby replica answers scrapes too) and the startup handler asks again."""
    with _SERVE_LOCK:
        if port and port not in _SERVED:
            start_http_server(port, registry=REGISTRY)
            _SERVED.add(port)


def observe_tick(
    namespace: str,
    name: str,
    *,
    decision: Decision,
    signals: ModelSignals,
    replicas: int,
    ready: int,
    capacity_rps: float,
    server_budget_ms: float,
    gpus_per_replica: int,
    elapsed_s: float,
    gpu_holding_replicas: int = 0,
    gpu_resource: str = GPU_RESOURCE,
) -> None:
    """Record one scaling tick; ``elapsed_s`` since the previous tick of this model (0 on the first).

    GPU-hours charge the interval that just ended with ``gpu_holding_replicas``: the pods that held their GPUs
    during it (scheduled, not Pending), as counted at the previous tick.
    """
    labels = (namespace, name)
    DESIRED.labels(*labels).set(decision.desired_replicas)
    REPLICAS.labels(*labels).set(replicas)
    READY.labels(*labels).set(ready)
    CAPACITY.labels(*labels).set(capacity_rps)
    SLA.labels(*labels).set(server_budget_ms / 1000.0)
    METRICS_AVAILABLE.labels(*labels).set(1 if decision.metrics_available else 0)
    DECISIONS.labels(*labels, decision.reason).inc()
    _REASONS.setdefault(labels, set()).add(decision.reason)
    GPU_HOURS.labels(*labels).inc(max(0, gpu_holding_replicas) * gpus_per_replica * max(0.0, elapsed_s) / 3600.0)
    previous = _RESOURCES.get(labels)
    if previous is not None and previous != gpu_resource:
        with contextlib.suppress(KeyError):
            GPU_RESOURCE_UNITS.remove(*labels, previous)
    _RESOURCES[labels] = gpu_resource
    GPU_RESOURCE_UNITS.labels(*labels, gpu_resource).set(gpus_per_replica)
    for gauge, value, scale in (
        (FILL, signals.batch_fill, 1.0),
        (QUEUE, signals.queue_time_ms, 1e-3),
        (P99, signals.p99_ms, 1e-3),
        (REQUEST_RATE, signals.request_rate_rps, 1.0),
    ):
        if value is not None:
            gauge.labels(*labels).set(value * scale)
        else:  # not measured (idle, unknown): no series rather than a stale or fake value
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
    if decision.recommendation is not None:
        RECOMMENDED.labels(*labels).set(decision.recommendation)
    else:  # Prometheus down or no series: no count rather than one an autoscaler would act on
        with contextlib.suppress(KeyError):
            RECOMMENDED.remove(*labels)
    if signals.p99_ms is not None:
        HEADROOM.labels(*labels).set((server_budget_ms - signals.p99_ms) / 1000.0)
    else:
        with contextlib.suppress(KeyError):
            HEADROOM.remove(*labels)


def observe_cost(namespace: str, pool: str, splits: list[CostSplit]) -> None:
    """Record one interval of a pool's GPU time split among its models (one :class:`CostSplit` per pod).

    Models' GPU-hours grow by their attributed GPU-seconds; the rest goes to the pool's unattributed counter by
    reason, so per-model and unattributed hours add up to what the pool's pods held. A model's share gauge is set
    only when the interval had GPU time and nothing of it was unattributed (no share rather than a wrong one).
    """
    per_model, unattributed = add_splits(splits)
    for model, seconds in per_model.items():
        MODEL_GPU_HOURS.labels(namespace, model).inc(seconds / 3600.0)
    for s in splits:
        if s.unattributed_gpu_seconds > 0:
            POOL_UNATTRIBUTED.labels(namespace, pool, s.reason).inc(s.unattributed_gpu_seconds / 3600.0)
    total = sum(per_model.values()) + unattributed
    for model, seconds in per_model.items():
        if total > 0 and unattributed == 0:
            MODEL_GPU_SHARE.labels(namespace, model).set(seconds / total)
        else:
            with contextlib.suppress(KeyError):
                MODEL_GPU_SHARE.remove(namespace, model)


def observe_pass(loop: str, seconds: float) -> None:
    """Record the duration of one whole pass of ``loop`` (scaling or profiling), failed passes included."""
    PASS_DURATION.labels(loop).observe(seconds)
    LAST_PASS.labels(loop).set(seconds)


def forget(namespace: str, name: str) -> None:
    """Drop the series of a deleted BatchedModel."""
    for metric in (DESIRED, RECOMMENDED, REPLICAS, READY, FILL, QUEUE, P99, HEADROOM, REQUEST_RATE, CAPACITY, SLA,
                   METRICS_AVAILABLE, GPU_HOURS, MODEL_GPU_HOURS, MODEL_GPU_SHARE):  # fmt: skip
        with contextlib.suppress(KeyError):
            metric.remove(namespace, name)
    resource = _RESOURCES.pop((namespace, name), None)
    if resource is not None:
        with contextlib.suppress(KeyError):
            GPU_RESOURCE_UNITS.remove(namespace, name, resource)
    for reason in _REASONS.pop((namespace, name), set()):
        with contextlib.suppress(KeyError):
            DECISIONS.remove(namespace, name, reason)
