"""One scaling tick of one BatchedModel: :func:`gather_scale` (I/O) -> :func:`decide_scale` (pure) ->
:func:`act_scale` (I/O). The loop around it is :class:`batchfill.controller.loops.ScalingLoop`.

* gather: the Deployment and pods (from the informer caches), the signals of the Ready pods (Prometheus through
  the shared SignalHub) and, until the model's ServiceMonitor has been seen, whether it exists;
* decide: :func:`batchfill.policy.scaling.decide` and everything it implies, as a :class:`ScalePlan`: the status
  patch, the replica count to set, the events, the operator's metrics, a ServiceMonitor to apply, children to
  re-apply, and the :class:`ScalingMemory` to carry to the next tick;
* act: the writes, in the order :func:`act_scale` documents; the memory kept depends only on whether the status
  write landed (:meth:`ScalePlan.memory_after`).

``scaling.mode`` Auto scales through the Deployment's scale subresource and records the count in
``status.appliedReplicas``; Advise only writes ``status.desiredReplicas``; Off never touches replicas. In Auto the
operator owns the replica count: a Deployment whose replicas differ from ``appliedReplicas`` was edited by hand
and is restored (with an Event); use Off to scale by hand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from batchfill.adapters import operator_metrics
from batchfill.adapters.kube import Kube, KubePermanentError, KubeTemporaryError
from batchfill.adapters.metrics import SignalTarget
from batchfill.api.errors import SpecError
from batchfill.api.reasons import ConditionType, EventReason
from batchfill.api.spec import GPU_RESOURCE, ScalingMode
from batchfill.api.status import ConditionStatus
from batchfill.controller.desired import Desired, adopted_profile, desired_state
from batchfill.controller.pods import PodCounts, pod_counts
from batchfill.controller.readiness import sla_risk
from batchfill.controller.reconcile import SERVICE_MONITOR, Event, apply_service_monitor, log_event, reapply
from batchfill.controller.rollout import in_place_reason
from batchfill.controller.scale_events import rollback_events, scale_events
from batchfill.controller.served_config import ServedNumbers, config_text, served_batch_size, served_numbers
from batchfill.controller.status import (
    changed_fields,
    children_drift,
    desired_status,
    hand_rollback,
    observed_status,
    requests_failing_conditions,
    scaling_conditions,
    stored_votes,
)
from batchfill.policy import conditions as cond
from batchfill.policy.scaling import (
    Decision,
    Recommendation,
    Replicas,
    Saturation,
    ScalingInput,
    compact_history,
    decide,
    expand_history,
    history_horizon_s,
    history_to_store,
)
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.render.kube import (
    CONFIG_KEY,
    Owner,
    build_service_monitor,
    configmap_name,
    names,
    selector_labels,
)

log = logging.getLogger("batchfill")

#: The signals of one model's Ready pods (SignalHub.signals); never raises for Prometheus trouble.
ReadSignals = Callable[[SignalTarget], ModelSignals]


@dataclass(frozen=True)
class ScalingMemory:
    """What the scaling loop carries from one tick of a model to the next (lost on restart, see ``history``).

    Attributes:
        history: the decision's votes (``Decision.history``); empty after a restart or a new leader, when the
            votes come from ``status.scalingHistory``.
        last_tick: when the last decision whose status landed was made, seconds since the epoch (None: none yet).
        holding: pods holding GPUs at that tick (scheduled, not Pending): GPU-hours charge the next interval
            with them.
        monitored: the model's ServiceMonitor was seen: it is not looked for again (one GET per model per tick
            would be the loop's largest cost).
        saturation: the decision's ``Decision.saturation`` (lost on restart: the next saturation is seen again).
    """

    history: tuple[Recommendation, ...] = ()
    last_tick: float | None = None
    holding: int = 0
    monitored: bool = False
    saturation: Saturation | None = None


@dataclass(frozen=True)
class ScaleInputs:
    """What one tick read of a model (:func:`gather_scale`), objects as the adapters return them.

    Attributes:
        body: the BatchedModel as listed.
        desired: its plan; None when there is nothing to do this tick (the generation is not planned yet, or the
            spec cannot be planned) and nothing else was read.
        monitor_served: whether the API serves ServiceMonitor; None when not asked (``ScalingMemory.monitored``).
        monitor: the model's ServiceMonitor as stored (None: absent, or not asked).
        deployment: the Triton Deployment (informer cache, trimmed: adapters/informer.py), None when missing.
        pods: the model's pods (informer cache, trimmed).
        signals: the signals of its Ready pods.
        rolled_back: the digest of the config a hand rollback put the pods on ("" when none holds).
        served_config: that config's config.pbtxt, from its ConfigMap (None: no rollback, or not found).
    """

    body: Mapping[str, Any]
    desired: Desired | None = None
    monitor_served: bool | None = None
    monitor: Mapping[str, Any] | None = None
    deployment: Mapping[str, Any] | None = None
    pods: tuple[Mapping[str, Any], ...] = ()
    signals: ModelSignals | None = None
    rolled_back: str = ""
    served_config: str | None = None


@dataclass(frozen=True)
class TickMetrics:
    """The operator's metrics of one tick: the arguments of
    :func:`batchfill.adapters.operator_metrics.observe_tick`."""

    decision: Decision
    signals: ModelSignals
    replicas: int
    ready: int
    capacity_rps: float
    server_budget_ms: float
    gpus_per_replica: int
    gpu_holding_replicas: int
    elapsed_s: float
    gpu_resource: str = GPU_RESOURCE


@dataclass(frozen=True)
class ScaleOutcome:
    """What :func:`act_scale` found out: whether the status write landed (or there was none), and whether the
    ServiceMonitor's kind turned out not to be served when it was applied."""

    written: bool
    monitor_gone: bool = False


@dataclass(frozen=True)
class ScalePlan:
    """Everything one tick writes, for :func:`act_scale`, and the memory for the next tick.

    Attributes:
        status: status fields to merge-patch, with the listed object's resourceVersion as a precondition (empty:
            no write).
        service_monitor: a ServiceMonitor to server-side apply (prometheus-operator installed after the model).
        scale: (Deployment name, replicas) to set through the scale subresource, once the status write landed.
        events: (type, reason, message) to post once the status write landed.
        metrics: what the operator's metrics record once the status write landed.
        reapply: why the children must be applied again (empty: they serve the handled spec).
        in_place: re-apply the Deployment with the in-place rollout strategy (no GPU for a surge pod).
        memory: the memory to keep when the status write lands.
        memory_if_stale: the memory to keep when it loses the race (HTTP 409: the decision came from an older
            state; only what the reads showed is kept); None: ``memory``.
    """

    status: dict[str, Any] = field(default_factory=dict)
    service_monitor: dict[str, Any] | None = None
    scale: tuple[str, int] | None = None
    events: tuple[Event, ...] = ()
    metrics: TickMetrics | None = None
    reapply: str = ""
    in_place: bool = False
    memory: ScalingMemory = ScalingMemory()
    memory_if_stale: ScalingMemory | None = None

    def memory_after(self, outcome: ScaleOutcome) -> ScalingMemory:
        """The memory for the next tick, given what :func:`act_scale` found out."""
        kept = self.memory if outcome.written or self.memory_if_stale is None else self.memory_if_stale
        return replace(kept, monitored=False) if outcome.monitor_gone else kept


def _owner(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def planned_desired(body: Mapping[str, Any]) -> Desired | None:
    """The plan a scaling tick works with: None unless the current generation was handled and planned."""
    meta, spec = body["metadata"], body.get("spec") or {}
    status: Mapping[str, Any] = body.get("status") or {}
    planned = cond.find(status.get("conditions"), ConditionType.PLANNED)
    if (
        not planned
        or planned.get("status") != ConditionStatus.TRUE
        or status.get("observedGeneration") != meta.get("generation")
    ):
        return None
    try:
        return desired_state(spec, adopted_profile(spec, status))
    except SpecError:
        return None


def gather_scale(view: Kube, read_signals: ReadSignals, body: Mapping[str, Any], memory: ScalingMemory) -> ScaleInputs:
    """Read what a scaling decision of ``body`` needs (I/O only; which reads follows from ``body`` and ``memory``).

    Args:
        view: the children's reads (in the operator, a :class:`batchfill.adapters.informer.CachedView`).
        read_signals: the signals of the model's Ready pods (``SignalHub.signals``).
        body: the BatchedModel as listed.
        memory: this model's memory (``monitored`` skips looking for the ServiceMonitor).

    Raises:
        KubeTemporaryError / KubePermanentError: from the API or a stale cache.
    """
    desired = planned_desired(body)
    if desired is None:
        return ScaleInputs(body)
    owner = _owner(body)
    served = monitor = None
    if not memory.monitored:
        served = view.has_kind(*SERVICE_MONITOR)
        if served:
            monitor = view.get(*SERVICE_MONITOR, names(owner)["servicemonitor"], owner.namespace)
    deployment = view.get("apps/v1", "Deployment", names(owner)["deployment"], owner.namespace)
    pods = tuple(view.list_pods(owner.namespace, selector_labels(owner)))
    max_batch_size = desired.plan_status.maxBatchSize
    # a hand rollback: the pods batch as the config they run says (controller/served_config.py)
    rolled_back, _ = hand_rollback(deployment, desired)
    text = None
    if rolled_back:
        text = config_text(view.get("v1", "ConfigMap", configmap_name(owner, rolled_back), owner.namespace), CONFIG_KEY)
        max_batch_size = served_batch_size(text, max_batch_size)
    target = SignalTarget(owner.namespace, owner.name, desired.spec.model.name, max_batch_size, pod_counts(pods).ready)
    return ScaleInputs(body, desired, served, monitor, deployment, pods, read_signals(target), rolled_back, text)


def decide_scale(inputs: ScaleInputs, memory: ScalingMemory, *, now: float, interval_s: float) -> ScalePlan:
    """Status refresh and one scaling decision (pure): a function of ``inputs``, ``memory`` and ``now`` only.

    Args:
        inputs: :func:`gather_scale`'s reads.
        memory: what the previous tick of this model left (empty ``history``: the votes come from
            ``status.scalingHistory``, expanded to one per ``interval_s``).
        now: seconds since the epoch.
        interval_s: the loop's tick, seconds.

    Events: a scale action; a decision reason different from ``status.lastScaleReason``; and
    ``HoldMetricsUnknown`` once per change of the MetricsAvailable=False reason (a Warning for Prometheus
    trouble, Normal for pods not scraped yet). Status holds only the fields that differ from the stored ones.
    """
    desired = inputs.desired
    if desired is None:
        return ScalePlan(memory=replace(memory, monitored=False))
    monitor = None
    monitored = memory.monitored or bool(inputs.monitor_served)
    if not memory.monitored and inputs.monitor_served and inputs.monitor is None:
        monitor = build_service_monitor(_owner(inputs.body))
    status: Mapping[str, Any] = inputs.body.get("status") or {}
    drift = children_drift(inputs.deployment, desired, status)
    if drift:  # the generation was handled (planned_desired), so the handler will not apply them again
        return ScalePlan(service_monitor=monitor, reapply=drift, memory=memory)
    deployment, signals = inputs.deployment, inputs.signals
    assert deployment is not None  # a missing one is drift
    assert signals is not None  # gather_scale reads them whenever it reads the Deployment
    pods = pod_counts(inputs.pods)
    spec, plan, served = desired.spec, desired.plan_status, _served(inputs, desired, status)
    current = int((deployment.get("spec") or {}).get("replicas") or 0)
    restored = None
    applied = status.get("appliedReplicas")  # what this operator last set in Auto (absent in Advise/Off)
    auto = spec.scaling.mode == ScalingMode.AUTO
    if auto and isinstance(applied, int) and applied != current:
        restored, current = current, applied
    horizon = history_horizon_s(spec.scaling.scaleDownStabilizationSeconds, signals.window_s)
    votes = stored_votes(status.get("scalingHistory"))
    # a restarted or newly elected operator continues the window status kept
    history = memory.history or expand_history(votes, now, horizon, interval_s)
    replicas = _replicas(current, pods, signals)
    decision = decide(ScalingInput(now, signals, served.numbers, spec.scaling, replicas, history, memory.saturation))
    target = decision.desired_replicas if decision.apply else current
    in_place = in_place_reason(deployment, inputs.pods, now, spec.triton.gpuResource)
    events = (
        *scale_events(status, deployment, signals, desired, decision, current, target, restored),
        *rollback_events(status, deployment, desired, served),
        *([("Warning", EventReason.ROLLING_IN_PLACE, in_place)] if in_place else []),
    )
    extra = [*scaling_conditions(decision, signals), *requests_failing_conditions(decision, status.get("conditions"))]
    risk = sla_risk(decision)
    wanted = desired_status(inputs.body, desired, deployment, now=now, extra=extra, failing=pods.failing, sla_risk=risk)
    wanted["desiredReplicas"] = decision.desired_replicas
    wanted["appliedReplicas"] = target if auto else None
    wanted["lastScaleReason"] = decision.reason
    if decision.apply or restored is not None:
        wanted["lastScaleTime"] = cond.rfc3339(now)
    wanted["observed"] = observed_status(signals)
    wanted["effectiveTargetUtilization"] = round(decision.target_utilization or spec.scaling.targetUtilization, 2)
    store = history_to_store(votes, compact_history(decision.history, now, horizon))
    if store is not None:
        wanted["scalingHistory"] = [
            {"time": cond.rfc3339(v.time), "replicas": v.replicas, "ready": v.ready} for v in store
        ]
    elapsed_s = 0.0 if memory.last_tick is None else max(0.0, now - memory.last_tick)
    metrics = TickMetrics(decision=decision, signals=signals, replicas=target, ready=len(pods.ready),
                          capacity_rps=served.numbers.capacity_rps, server_budget_ms=plan.serverBudgetMs,
                          gpus_per_replica=spec.triton.gpusPerReplica, gpu_holding_replicas=memory.holding,
                          elapsed_s=elapsed_s, gpu_resource=spec.triton.gpuResource)  # fmt: skip
    return ScalePlan(
        status=changed_fields(status, wanted),
        service_monitor=monitor,
        scale=(names(_owner(inputs.body))["deployment"], target) if (restored is not None or decision.apply) else None,
        events=events,
        metrics=metrics,
        reapply=in_place,
        in_place=bool(in_place),
        memory=ScalingMemory(decision.history, now, len(pods.ready) + pods.starting, monitored, decision.saturation),
        memory_if_stale=replace(memory, monitored=monitored),
    )


def status_before_first_tick(
    body: Mapping[str, Any],
    desired: Desired,
    deployment: Mapping[str, Any],
    wanted: dict[str, Any],
    now: float,
    *,
    signals: ModelSignals,
    interval_s: float,
) -> dict[str, Any]:
    """``wanted``, the status a handler writes for a model no scaling tick has seen yet, with the fields that first
    tick would write while none of the model's pods is Ready (pure; ``reconcile``'s ``first_tick``).

    ``signals``: what the signal hub answers for a model without Ready pods (NoReadyPods). With these fields in
    place the first tick writes nothing unless something changed meanwhile (a pod Ready, or Pending). At 1,000 new
    models that first write was a third of the scaling loop's status writes during creation (benchmarks/scale.py).
    """
    written = {**body, "status": {**(body.get("status") or {}), **wanted}}
    inputs = ScaleInputs(written, desired, None, None, deployment, (), signals)
    plan = decide_scale(inputs, ScalingMemory(), now=now, interval_s=interval_s)
    return {**wanted, **plan.status}


def _served(inputs: ScaleInputs, desired: Desired, status: Mapping[str, Any]) -> ServedNumbers:
    """The plan numbers of the config the pods run (controller/served_config.py)."""
    measured = adopted_profile(inputs.body.get("spec") or {}, status)
    return served_numbers(desired, measured, inputs.rolled_back, inputs.served_config)


def _replicas(current: int, pods: PodCounts, signals: ModelSignals) -> Replicas:
    """The Deployment as the decision sees it.

    A Ready pod whose series Prometheus has not scraped yet serves load the signals do not show: it counts as
    capacity on the way, not as measured capacity (else its arrival looks like the same load on more pods).
    """
    measured = len(pods.ready) if signals.state == SignalState.UNKNOWN else min(len(pods.ready), signals.pods)
    return Replicas(
        current=current,
        ready=measured,
        starting=pods.starting + len(pods.ready) - measured,
        pending=pods.pending,
        pending_reason=pods.pending_reason,
        failing=len(pods.failing),
        failing_reason=pods.failing[0] if pods.failing else "",
    )


def act_scale(
    kube: Kube, body: Mapping[str, Any], plan: ScalePlan, *, clock: Callable[[], float] = time.time
) -> ScaleOutcome:
    """Carry out ``plan`` for ``body`` (I/O only), in this order:

    1. apply the ServiceMonitor;
    2. patch status (with ``body``'s resourceVersion as a precondition); a write that loses the race (409) ends
       the tick here: a status computed from an older state changes nothing, the next tick recomputes it;
    3. set the replicas through the scale subresource (after status, so ``status.appliedReplicas`` always
       records a scale before it happens: a restart between the two resumes it, see ``ScaleResumed``);
    4. post the events, record the operator's metrics;
    5. re-apply the children (its API errors are logged: the next tick finds the drift again).

    Raises:
        KubeTemporaryError / KubePermanentError: from steps 1-3 (the writes before it stand).
    """
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    gone = plan.service_monitor is not None and not apply_service_monitor(kube, plan.service_monitor)
    written = not plan.status or kube.patch_status(body, plan.status)
    if written:
        if plan.scale is not None:
            kube.scale_deployment(plan.scale[0], ns, plan.scale[1])
        for type_, reason, message in plan.events:
            kube.post_event(body, type_, reason, message)
            log_event(ns, name, type_, reason, message)
        if plan.metrics is not None:
            _observe(ns, name, plan.metrics)
    if plan.reapply:
        log.warning("%s/%s: %s: applying its children again", ns, name, plan.reapply)
        try:
            reapply(kube, name, ns, now=clock(), in_place=plan.in_place)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("re-applying the children of %s/%s postponed: %s", ns, name, err)
    return ScaleOutcome(written, gone)


def _observe(namespace: str, name: str, m: TickMetrics) -> None:
    operator_metrics.observe_tick(
        namespace,
        name,
        decision=m.decision,
        signals=m.signals,
        replicas=m.replicas,
        ready=m.ready,
        capacity_rps=m.capacity_rps,
        server_budget_ms=m.server_budget_ms,
        gpus_per_replica=m.gpus_per_replica,
        gpu_holding_replicas=m.gpu_holding_replicas,
        elapsed_s=m.elapsed_s,
        gpu_resource=m.gpu_resource,
    )
