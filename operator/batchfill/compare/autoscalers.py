"""Autoscalers for the fleet simulator: batchfill's own policy and the baselines it is measured against.

* :class:`BatchfillAutoscaler` calls :func:`batchfill.policy.scaling.decide`, the code the operator runs, with
  signals built from the simulated window exactly as the operator's Prometheus adapter builds them; the rate
  variability (policy/headroom.py) from the window rates of its past ticks, which stand for the model's rate
  over the 60 s before each (the simulated window is 60 s, Options.window_s, and the rates of replicas removed
  within it are not kept: a small difference from the operator's Prometheus subquery).
* :class:`HorizontalPodAutoscaler` follows the documented algorithm of the Kubernetes HPA (autoscaling/v2,
  kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ and pkg/controller/podautoscaler's
  replica calculator): ``desired = ceil(current · metric / target)``; a ratio within 10 % keeps the count;
  scale-up at most ``max(100 %, 4 pods)`` per 15 s period (the default ``behavior.scaleUp``), no scale-up
  stabilization; scale-down to the highest recommendation of the last 300 s (default
  ``behavior.scaleDown.stabilizationWindowSeconds``), at most 100 % per period. A metric that cannot be computed
  (a queue time without requests, KEDA's query returning no value) keeps the count, as the HPA does when a
  metric fetch fails. Three metric sources are provided:

  - :func:`gpu_utilization_metric`: a ``Pods`` metric with ``averageValue`` (DCGM_FI_DEV_GPU_UTIL through
    prometheus-adapter, averaged over 1 min): the mean over running pods, starting pods reporting 0 as DCGM does
    for a GPU that is loading a model; ``desired = ceil(n_pods · mean / target)``.
  - :func:`request_rate_metric`: KEDA's Prometheus scaler with the default ``AverageValue``, query
    ``sum(rate(nv_inference_request_success[1m]))``: an external metric divided by the per-replica target,
    ``desired = ceil(total / target)``, tolerance against ``status.replicas``.
  - :func:`queue_time_metric`: KEDA's Prometheus scaler with ``metricType: Value`` on
    ``sum(increase(nv_inference_queue_duration_us[1m])) / sum(increase(nv_inference_request_success[1m]))``:
    ``desired = ceil(ready · value / target)``.

* :class:`StaticAutoscaler`: a fixed count (static provisioning).

Pure: decisions depend only on the observations passed in, in order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from batchfill.api.spec import ScalingSpec
from batchfill.api.status import PlanStatus
from batchfill.policy import headroom
from batchfill.policy.scaling import (
    Decision,
    PlanNumbers,
    Recommendation,
    Replicas,
    Saturation,
    ScalingInput,
    decide,
)
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.sim.fleet import Observation, ScaleDecision

#: HPA defaults (kube-controller-manager and autoscaling/v2 behavior).
HPA_SYNC_PERIOD_S = 15.0
HPA_TOLERANCE = 0.1
HPA_SCALE_DOWN_STABILIZATION_S = 300.0
HPA_SCALE_UP_PERCENT = 100
HPA_SCALE_UP_PODS = 4


class HpaReason(StrEnum):
    """Why the simulated HPA chose its count (``ScaleDecision.reason``, in the fleet's ticks and the tests)."""

    SCALING_DISABLED = "ScalingDisabled"  # a Deployment at 0 replicas: the HPA does not act on it
    FAILED_GET_METRIC = "FailedGetMetric"
    SCALE_DOWN = "ScaleDown"
    SCALE_DOWN_STABILIZED = "ScaleDownStabilized"
    SCALE_UP = "ScaleUp"
    SCALE_UP_LIMITED = "ScaleUpLimited"
    WITHIN_TOLERANCE = "WithinTolerance"


@dataclass
class BatchfillAutoscaler:
    """batchfill's scaling policy (``policy.scaling.decide``) fed with the simulated signals.

    Args:
        plan: ``status.plan`` of the BatchedModel.
        scaling: ``spec.scaling``.
    """

    plan: PlanStatus
    scaling: ScalingSpec
    name: str = "batchfill"
    history: tuple[Recommendation, ...] = ()
    saturation: Saturation | None = None
    #: ``{tick time, whole seconds: window rate, req/s}`` of the rate variability's horizon and lag
    rates: dict[int, float] = field(default_factory=dict)

    def decide(self, obs: Observation) -> ScaleDecision:
        return self.step(obs, self.scaling, PlanNumbers.from_status(self.plan), decide)

    def step(
        self, obs: Observation, scaling: ScalingSpec, plan: PlanNumbers, decide_fn: Callable[[ScalingInput], Decision]
    ) -> ScaleDecision:
        """One tick of ``decide_fn`` (``decide`` or a variant of it) on ``obs`` with ``scaling`` and ``plan``,
        carrying the history and saturation memory to the next tick."""
        signals = signals_from(obs, self.plan.maxBatchSize, self.rate_variability(obs))
        replicas = Replicas(current=obs.current, ready=obs.ready, starting=obs.starting)
        d = decide_fn(ScalingInput(obs.now_s, signals, plan, scaling, replicas, self.history, self.saturation))
        self.history, self.saturation = d.history, d.saturation
        return ScaleDecision(d.desired_replicas, d.reason)

    def rate_variability(self, obs: Observation) -> float | None:
        """Records ``obs``'s window rate and returns the rate variability at ``obs.now_s``
        (:func:`~batchfill.policy.headroom.rate_change_rms`); keeps only the rates it can still use."""
        now = round(obs.now_s)
        self.rates[now] = obs.request_rate_rps
        oldest = now - headroom.RATE_CHANGE_HORIZON_S - headroom.RATE_CHANGE_LAG_S
        if min(self.rates) <= oldest:
            self.rates = {t: r for t, r in self.rates.items() if t > oldest}
        return headroom.rate_change_rms(self.rates, now)[0]


def signals_from(obs: Observation, max_batch_size: int, rate_change_rms: float | None = None) -> ModelSignals:
    """The operator's :class:`ModelSignals` for one observation: Ok with traffic, Idle without (the simulated
    series always exist, so never Unknown). One sample per request, so the inference rate is the request rate.
    ``rate_change_rms``: the rate variability (:meth:`BatchfillAutoscaler.rate_variability`)."""
    if obs.completed == 0:
        return ModelSignals(
            state=SignalState.IDLE,
            window_s=obs.window_s,
            pods=obs.ready,
            request_rate_rps=0.0,
            inference_rate_rps=0.0,
            pending_requests=float(obs.pending_requests),
            rate_change_rms=rate_change_rms,
        )
    fill = None
    if obs.avg_batch_size is not None and max_batch_size > 0:
        fill = min(1.0, obs.avg_batch_size / max_batch_size)
    return ModelSignals(
        state=SignalState.OK,
        window_s=obs.window_s,
        pods=obs.ready,
        request_rate_rps=obs.request_rate_rps,
        inference_rate_rps=obs.request_rate_rps,
        avg_batch_size=obs.avg_batch_size,
        batch_fill=fill,
        queue_time_ms=obs.queue_time_ms,
        p99_ms=obs.p99_ms,
        pending_requests=float(obs.pending_requests),
        rate_change_rms=rate_change_rms,
    )


#: A metric source: the observation -> the raw recommendation before tolerance (None: no value) and the
#: usage ratio the tolerance applies to.
MetricSource = Callable[[Observation], tuple[float, float] | None]


def gpu_utilization_metric(target_fraction: float) -> MetricSource:
    """HPA ``Pods`` metric, target ``averageValue`` GPU busy fraction (0-1): returns (desired, ratio).

    The metric is DCGM's ``DCGM_FI_DEV_GPU_UTIL`` (NVML's ``utilization.gpu``): the fraction of the sample period
    during which one or more kernels ran on the GPU. The simulator's equivalent (``Observation.gpu_utilization``)
    is each replica's execution time in the window over the window (per GPU), averaged over the replicas, a
    starting one counting 0: a batch of one occupies the GPU for ``l(1)`` as fully as a full batch for ``l(B)``,
    so the metric says how often the GPU runs, not how much of its batch capacity is used.
    """

    def source(obs: Observation) -> tuple[float, float] | None:
        if obs.gpu_utilization is None or obs.current == 0:
            return None
        ratio = obs.gpu_utilization / target_fraction
        return ratio * obs.current, ratio

    return source


def request_rate_metric(target_rps_per_replica: float) -> MetricSource:
    """KEDA Prometheus scaler, ``AverageValue`` (HPA external metric per pod): returns (desired, ratio)."""

    def source(obs: Observation) -> tuple[float, float] | None:
        total = obs.request_rate_rps
        ratio = total / (target_rps_per_replica * obs.current) if obs.current else math.inf
        return total / target_rps_per_replica, ratio

    return source


def queue_time_metric(target_ms: float) -> MetricSource:
    """KEDA Prometheus scaler, ``metricType: Value`` on the mean queue time: returns (desired, ratio)."""

    def source(obs: Observation) -> tuple[float, float] | None:
        if obs.queue_time_ms is None:
            return None
        ratio = obs.queue_time_ms / target_ms
        return ratio * obs.ready, ratio

    return source


@dataclass
class HorizontalPodAutoscaler:
    """The Kubernetes HPA algorithm (module docstring) on one metric source."""

    name: str
    metric: MetricSource
    min_replicas: int
    max_replicas: int
    tolerance: float = HPA_TOLERANCE
    scale_down_stabilization_s: float = HPA_SCALE_DOWN_STABILIZATION_S
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)

    def decide(self, obs: Observation) -> ScaleDecision:
        current = obs.current
        value = self.metric(obs)
        if current == 0:
            return ScaleDecision(current, HpaReason.SCALING_DISABLED)
        if value is None:
            return ScaleDecision(current, HpaReason.FAILED_GET_METRIC)
        raw, ratio = value
        rec = current if abs(ratio - 1.0) <= self.tolerance else math.ceil(raw - 1e-9)
        rec = max(self.min_replicas, min(self.max_replicas, rec))
        # scale-down stabilization: the highest recommendation of the window (this one included)
        self.recommendations.append((obs.now_s, rec))
        while self.recommendations and self.recommendations[0][0] <= obs.now_s - self.scale_down_stabilization_s:
            self.recommendations.popleft()
        if rec < current:
            stabilized = min(current, max(r for _, r in self.recommendations))
            reason = HpaReason.SCALE_DOWN if stabilized < current else HpaReason.SCALE_DOWN_STABILIZED
            return ScaleDecision(stabilized, reason)
        if rec > current:
            limit = max(current + current * HPA_SCALE_UP_PERCENT // 100, current + HPA_SCALE_UP_PODS)
            return ScaleDecision(min(rec, limit), HpaReason.SCALE_UP if rec <= limit else HpaReason.SCALE_UP_LIMITED)
        return ScaleDecision(current, HpaReason.WITHIN_TOLERANCE)


@dataclass
class StaticAutoscaler:
    """A fixed replica count."""

    replicas: int
    name: str = "static"

    def decide(self, obs: Observation) -> ScaleDecision:
        return ScaleDecision(self.replicas, "Static")
