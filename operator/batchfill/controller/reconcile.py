"""One reconcile path for create, update and resume: gather -> plan -> act. No decorators (see handlers.py).

* plan: validate the spec, derive the batching plan, render config.pbtxt and the children (pure; the plan is
  cached by spec, so a resume or a status-only event does not re-simulate);
* gather: read what exists (the Deployment's replicas, whether ServiceMonitor is served);
* act: server-side apply the children (an unchanged child is a no-op on the server), then compute the status
  and return only the fields that differ from the stored status, so an idle system writes nothing.

An invalid or infeasible spec writes its conditions, emits one Warning event per generation and raises
:class:`SpecRejectedError`; the handler turns that into ``kopf.PermanentError`` (no retry loop, CASES C18).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchfill.adapters.kube import FIELD_MANAGER, Kube, KubeNotFoundError
from batchfill.adapters.metrics import NO_READY_PODS, NO_SERIES, SignalTarget
from batchfill.api.errors import Problem, SpecError
from batchfill.api.spec import BatchedModelSpec, ProfilePoint, ProfileSource, ScalingMode
from batchfill.api.status import PlanStatus
from batchfill.api.validate import load_model
from batchfill.policy import conditions as cond
from batchfill.policy.plan import PlanResult, first_plan, plan_batching, significant
from batchfill.policy.profile import LatencyProfile
from batchfill.policy.profile_fit import BatchTotals, FittedPoint, decide_replan, fit_profile
from batchfill.policy.scaling import (
    Decision,
    PlanNumbers,
    Recommendation,
    Replicas,
    ScalingInput,
    compact_history,
    decide,
    expand_history,
    history_horizon_s,
    history_to_store,
)
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.render import config_hash, render_model_config
from batchfill.render.kube import (
    CONFIG_HASH_ANNOTATION,
    Owner,
    build_configmap,
    build_deployment,
    build_service,
    build_service_monitor,
    names,
    selector_labels,
)

#: emit(type, reason, message): posts a Kubernetes Event on the BatchedModel.
Emit = Callable[[str, str, str], None]
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")


class SpecRejectedError(Exception):
    """The spec cannot be served; ``status`` holds the conditions to write."""

    def __init__(self, message: str, status: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status


#: status.plannedProfile.source values.
DECLARED, MEASURED, FIRST_PLAN = "Declared", "Measured", "FirstPlan"
#: A measured profile: ((batch size, latency ms), ...).
Measured = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Desired:
    """Everything derived from the spec (and the measured profile the plan uses, if any).

    ``profile_source``: Declared (spec.profile), Measured (status.plannedProfile.points) or FirstPlan (no
    profile yet: capacity unknown).
    """

    spec: BatchedModelSpec
    plan: PlanResult
    plan_status: PlanStatus
    config: str
    config_hash: str
    profile_source: str = DECLARED


def profile_hash(profile: Any) -> str:
    """A short hash of spec.profile as stored (``none`` when absent): adoption of a measured profile holds only
    while the declared one is unchanged, so a user's new profile wins over an older measurement."""
    if not profile:
        return "none"
    return hashlib.sha256(json.dumps(profile, sort_keys=True, default=str).encode()).hexdigest()[:12]


def adopted_profile(spec: Mapping[str, Any], status: Mapping[str, Any]) -> Measured | None:
    """The measured points status.plannedProfile says the plan uses, if they still apply to this spec."""
    planned = status.get("plannedProfile") or {}
    points = planned.get("points") or []
    if (
        planned.get("source") != MEASURED
        or not points
        or planned.get("declaredHash") != profile_hash(spec.get("profile"))
    ):
        return None
    try:
        out = tuple((int(p["batchSize"]), float(p["latencyMs"])) for p in points)
    except (KeyError, TypeError, ValueError):
        return None  # a hand-edited status: plan from the spec
    sizes = [b for b, _ in out]
    if sizes != sorted(set(sizes)) or any(b < 1 or not (math.isfinite(ms) and ms > 0) for b, ms in out):
        return None  # unsorted, duplicate or non-positive points (hand-edited): plan from the spec
    return out


#: Plans kept (one per distinct spec and measured profile). Both loops ask for every model's plan each pass, and
#: a plan costs ~0.35 s of simulation: the cache must hold the whole fleet, or a pass replans every model
#: (benchmarks/scale.py: 600 distinct specs, 0 hits in 1,200 lookups with 512).
PLAN_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def _plan_cached(spec_json: str, measured: Measured | None) -> tuple[BatchedModelSpec, PlanResult, str, str]:
    bm = load_model({"apiVersion": "batchfill.io/v1alpha1", "kind": "BatchedModel", "spec": json.loads(spec_json)})
    spec = bm.spec
    if spec.profiling.source == ProfileSource.DECLARED and not spec.profile:
        raise SpecError([Problem("spec.profiling.source", "=Declared needs spec.profile (or use Measured)")])
    if measured:
        points = [ProfilePoint(batchSize=b, latencyMs=ms) for b, ms in measured]
        result, source = plan_batching(spec.model_copy(update={"profile": points})), MEASURED
    elif spec.profile:
        result, source = plan_batching(spec), DECLARED
    else:
        result, source = first_plan(spec), FIRST_PLAN
    return spec, result, render_model_config(spec, result.to_status()), source


def desired_state(spec: Mapping[str, Any], measured: Measured | None = None) -> Desired:
    """Validate, plan (from ``measured`` points when given, else spec.profile, else the first plan) and render.

    Raises:
        SpecError: field-named problems of a spec that cannot be served.
    """
    model, result, config, source = _plan_cached(json.dumps(spec, sort_keys=True, default=str), measured)
    return Desired(model, result, result.to_status(), config, config_hash(config), source)


def rejection_status(err: SpecError, status: Mapping[str, Any], generation: int | None, now: float) -> dict[str, Any]:
    """Conditions for a spec that cannot be served (the fields named in the message)."""
    message = "; ".join(str(p) for p in err.problems)
    infeasible = err.reason == "SLAInfeasible"
    updates = [
        cond.ConditionUpdate(
            cond.CONFIG_VALID,
            cond.TRUE if infeasible else cond.FALSE,
            "Valid" if infeasible else err.reason,
            "" if infeasible else message,
        ),
        cond.ConditionUpdate(
            cond.SLA_FEASIBLE,
            cond.FALSE if infeasible else cond.UNKNOWN,
            err.reason if infeasible else "InvalidSpec",
            message if infeasible else "",
        ),
        cond.ConditionUpdate(cond.PLANNED, cond.FALSE, err.reason, message),
        cond.ConditionUpdate(cond.READY, cond.FALSE, err.reason, "the spec cannot be served; see Planned"),
    ]
    return {
        "observedGeneration": generation,
        "conditions": cond.apply_conditions(status.get("conditions"), updates, generation=generation, now=now),
    }


def _stored(value: Any) -> Any:
    """``value`` as the API server stores it after a merge patch: None members of objects are removed."""
    if isinstance(value, Mapping):
        return {k: _stored(v) for k, v in value.items() if v is not None}
    return value


def changed_fields(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level status fields of ``wanted`` that differ from ``current`` (empty: write nothing).

    A None (here or inside an object) removes the field in the merge patch, so it equals an absent one.
    """
    return {k: v for k, v in wanted.items() if _stored(current.get(k)) != _stored(v)}


def reconcile(body: Mapping[str, Any], kube: Kube, *, now: float, emit: Emit) -> dict[str, Any]:
    """Bring the children in line with the spec; return the status fields to patch (possibly none).

    Raises:
        SpecRejectedError: invalid or infeasible spec (its conditions are in the exception).
        KubeTemporaryError / KubePermanentError: from the API (adapters.kube).
    """
    meta, spec = body["metadata"], body.get("spec") or {}
    status: Mapping[str, Any] = body.get("status") or {}
    generation = meta.get("generation")
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    try:
        desired = desired_state(spec, adopted_profile(spec, status))
        # a plannable spec may still not be deployable (no repository, an object-store uri): a condition, not a
        # traceback and a retry every minute
        build_deployment(owner, desired.spec, desired.config_hash, desired.spec.scaling.minReplicas)
    except SpecError as err:
        rejected = rejection_status(err, status, generation, now)
        previous = cond.find(status.get("conditions"), cond.PLANNED)
        message = "; ".join(str(p) for p in err.problems)
        if not (previous and previous.get("observedGeneration") == generation and previous.get("message") == message):
            emit("Warning", err.reason, message)  # once per generation, not on every resume
        raise SpecRejectedError(message, rejected) from None

    # gather
    existing = kube.get("apps/v1", "Deployment", names(owner)["deployment"], owner.namespace)
    replicas = (existing or {}).get("spec", {}).get("replicas")
    if replicas is None:
        replicas = desired.spec.scaling.minReplicas
    with_monitor = kube.has_kind(*SERVICE_MONITOR)

    # act
    kube.apply(build_configmap(owner, desired.config, desired.config_hash))
    deployment = kube.apply(build_deployment(owner, desired.spec, desired.config_hash, replicas))
    kube.apply(build_service(owner))
    if with_monitor:
        _apply_service_monitor(kube, owner)
    old_hash = ((existing or {}).get("spec", {}).get("template", {}).get("metadata", {}).get("annotations") or {}).get(
        CONFIG_HASH_ANNOTATION
    )
    if existing is None:
        emit("Normal", "Deployed", f"created Triton Deployment with config {desired.config_hash}")
    elif old_hash != desired.config_hash:
        emit("Normal", "ConfigChanged", f"config.pbtxt {old_hash} -> {desired.config_hash}: rolling the pods once")

    wanted = desired_status(body, desired, deployment, now=now)
    return changed_fields(status, wanted)


def _apply_service_monitor(kube: Kube, owner: Owner) -> None:
    try:
        kube.apply(build_service_monitor(owner))
    except KubeNotFoundError:  # the prometheus-operator CRD went away after discovery cached it
        kube.forget_kinds()


def desired_status(
    body: Mapping[str, Any],
    desired: Desired,
    deployment: Mapping[str, Any] | None,
    *,
    now: float,
    extra: Sequence[cond.ConditionUpdate] = (),
) -> dict[str, Any]:
    """The status a reconciled BatchedModel should have."""
    meta = body["metadata"]
    status: Mapping[str, Any] = body.get("status") or {}
    generation = meta.get("generation")
    dep_status = (deployment or {}).get("status") or {}
    ready = int(dep_status.get("readyReplicas") or 0)
    total = int(dep_status.get("replicas") or 0)
    plan = desired.plan_status
    first = desired.profile_source == FIRST_PLAN
    settings = (
        f"max_batch_size {plan.maxBatchSize}, max_queue_delay_microseconds {plan.maxQueueDelayMicroseconds}, "
        f"config {desired.config_hash}"
    )
    updates = [
        cond.ConditionUpdate(cond.CONFIG_VALID, cond.TRUE, "Valid"),
        cond.ConditionUpdate(
            cond.SLA_FEASIBLE,
            cond.UNKNOWN,
            "ProfileNotMeasured",
            "no profile yet: measuring execution latency per batch size from Triton's statistics",
        )
        if first
        else cond.ConditionUpdate(
            cond.SLA_FEASIBLE,
            cond.TRUE,
            "Feasible",
            f"capacity {plan.capacityPerReplicaRps:g} req/s per replica within {plan.serverBudgetMs:g} ms",
        ),
        cond.ConditionUpdate(
            cond.PLANNED,
            cond.TRUE,
            "FirstPlan"
            if first
            else ("PlannedFromMeasuredProfile" if desired.profile_source == MEASURED else "Planned"),
            f"{settings}; capacity unknown until the profile is measured" if first else settings,
        ),
        cond.ConditionUpdate(
            cond.READY,
            cond.TRUE if ready > 0 else cond.FALSE,
            "ReplicasReady" if ready > 0 else "NoReadyReplicas",
            f"{ready}/{total} Triton replicas ready",
        ),
    ]
    updates += extra
    warnings = [w for w in desired.plan.warnings if w.condition == cond.BATCHING_EFFECTIVE]
    if warnings:
        updates.append(
            cond.ConditionUpdate(cond.BATCHING_EFFECTIVE, cond.UNKNOWN, warnings[0].reason, warnings[0].message)
        )
    conditions = cond.apply_conditions(
        status.get("conditions"),
        updates,
        generation=generation,
        now=now,
        remove=() if warnings or any(u.type == cond.BATCHING_EFFECTIVE for u in extra) else (cond.BATCHING_EFFECTIVE,),
    )
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions,
        "plan": plan.model_dump(mode="json", exclude_none=True),
        "replicas": total,
        "readyReplicas": ready,
    }
    if desired.profile_source != MEASURED:  # a measured profile in use is written by the profiling loop
        # every field, as the API server stores it (CRD defaults included): a partial object would never compare
        # equal (a no-op PATCH every pass), and a merge patch would leave an older measurement's fields behind.
        # ``since`` (the last adoption of a measurement) is kept: editing spec.profile must not restart the
        # replan interval, or each edit would let a measurement replace the new profile at once.
        out["plannedProfile"] = {
            "source": desired.profile_source,
            "points": [],
            "since": (status.get("plannedProfile") or {}).get("since"),
            "reason": "",
            "message": "",
            "declaredHash": profile_hash((body.get("spec") or {}).get("profile")),
        }
    return out


# -- scaling -----------------------------------------------------------------------------------------------------

#: Decision reasons that are posted as Warning events (the rest are Normal).
#: (HoldMetricsUnknown has its own rule: once per MetricsAvailable=False reason, see scale_tick.)
WARNING_REASONS = frozenset({"HoldReplicasPending", "AtMaxReplicas", "HoldNoCapacity"})
_OBSERVED_DIGITS = 3  # significant digits of status.observed: finer noise would rewrite status every tick


@dataclass(frozen=True)
class PodCounts:
    """The BatchedModel's pods now: names of the Ready ones, others starting, and unschedulable ones."""

    ready: frozenset[str]
    starting: int
    pending: int
    pending_reason: str


def pod_counts(pods: Sequence[Mapping[str, Any]]) -> PodCounts:
    """Classify pods (terminating ones do not count): Ready; Pending with PodScheduled=False (the scheduler's
    message, e.g. ``0/2 nodes are available: 2 Insufficient nvidia.com/gpu``); everything else is starting."""
    ready: set[str] = set()
    starting = pending = 0
    reason = ""
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        conds = {c.get("type"): c for c in status.get("conditions") or []}
        if (conds.get("Ready") or {}).get("status") == "True":
            ready.add(meta.get("name", ""))
        elif (conds.get("PodScheduled") or {}).get("status") == "False":
            pending += 1
            reason = reason or str(conds["PodScheduled"].get("message") or conds["PodScheduled"].get("reason") or "")
        else:
            starting += 1
    return PodCounts(frozenset(ready), starting, pending, reason)


def _rounded(x: float | None) -> float | None:
    return None if x is None else significant(x, _OBSERVED_DIGITS)


def observed_status(signals: ModelSignals) -> dict[str, float | None] | None:
    """``status.observed``, rounded; None (the field removed) when the signals are unknown: unknown is not zero.

    Values not measured in the window are None, so a merge patch removes what an earlier tick wrote.
    """
    if signals.state == SignalState.UNKNOWN:
        return None
    return {
        "requestRate": _rounded(signals.request_rate_rps),
        "avgBatchSize": _rounded(signals.avg_batch_size),
        "batchFill": _rounded(signals.batch_fill),
        "queueTimeMs": _rounded(signals.queue_time_ms),
        "p99Ms": _rounded(signals.p99_ms),
    }


@dataclass(frozen=True)
class ScaleTick:
    """Outcome of one scaling tick, for the caller to carry out in this order: patch ``status`` (with the
    object's resourceVersion as a precondition); only if that succeeded, scale the Deployment to ``scale_to``
    and post ``events`` (type, reason, message). A status write that loses the race changes nothing.

    ``holding`` is the number of pods that hold their GPUs now (scheduled, not Pending), for GPU-hours;
    ``monitored``: the ServiceMonitor child is known to exist (the caller passes it back to skip the check).
    """

    status: dict[str, Any]
    decision: Decision | None = None
    signals: ModelSignals | None = None
    replicas: int = 0
    ready: int = 0
    holding: int = 0
    desired: Desired | None = None
    deployment: str = ""
    scale_to: int | None = None
    events: tuple[tuple[str, str, str], ...] = ()
    monitored: bool = False
    drift: str = ""  # why the children must be applied again (the caller reconciles instead of scaling)


def children_drift(deployment: Mapping[str, Any] | None, desired: Desired, status: Mapping[str, Any]) -> str:
    """Why the children no longer serve the handled spec (empty: they do).

    The create/update handlers apply the children once per generation; a Deployment deleted or re-templated by
    hand, or a measured profile adopted in status whose apply then failed (API down, operator killed between the
    two writes), would otherwise wait for the next spec change or operator restart: status writes start no
    handler. Only called once the current generation has been handled.
    """
    if deployment is None:
        return "the Triton Deployment is missing (deleted outside batchfill)"
    annotations = (((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
        "annotations"
    ) or {}
    served = annotations.get(CONFIG_HASH_ANNOTATION)
    if served != desired.config_hash:
        return f"the Deployment's pods carry config {served}, the plan's is {desired.config_hash}"
    wanted = desired.plan_status.model_dump(mode="json", exclude_none=True)
    if _stored(status.get("plan")) != _stored(wanted):
        return "status.plan is not the plan of the adopted profile yet"
    return ""


def replicas_managers(deployment: Mapping[str, Any]) -> list[str]:
    """The field managers that own the Deployment's ``spec.replicas`` (its managedFields; empty when none does).

    Who set the count tells a hand edit (``kubectl``, ``kubectl-edit``, another controller) from batchfill's own
    scale that status recorded but the Deployment never got (the operator killed between the status write and the
    scale call, or the scale refused): then batchfill still owns the field, at its older value.
    """
    owners = []
    for entry in (deployment.get("metadata") or {}).get("managedFields") or []:
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if isinstance(fields, Mapping) and "f:replicas" in fields:
            owners.append(str(entry.get("manager") or "?"))
    return owners


def scale_tick(
    body: Mapping[str, Any],
    kube: Kube,
    read_signals: Callable[[SignalTarget], ModelSignals],
    history: tuple[Recommendation, ...],
    *,
    now: float,
    monitored: bool = False,
    interval_s: float = 15.0,
) -> ScaleTick:
    """Status refresh and one scaling decision for a planned BatchedModel (gather -> decide; the caller acts).

    * gather: the Deployment, the pods (Ready / starting / Pending with the scheduler's reason) and the signals
      of the Ready pods (``read_signals``: Prometheus through the shared SignalHub);
    * decide: :func:`batchfill.policy.scaling.decide` (pure);
    * what to do (:class:`ScaleTick`): ``scaling.mode`` Auto scales through the Deployment's scale subresource
      and records the count in ``status.appliedReplicas``; Advise only writes ``status.desiredReplicas``; Off
      never touches replicas. In Auto the operator owns the replica count: a Deployment whose replicas differ
      from ``appliedReplicas`` was edited by hand and is restored (with an Event); use Off to scale by hand.

    Events: a scale action; a decision reason different from ``status.lastScaleReason``; and
    ``HoldMetricsUnknown`` once per change of the MetricsAvailable=False reason (a Warning for Prometheus
    trouble, Normal for pods not scraped yet). Status holds only the fields that differ from the stored ones.
    ``monitored`` (from the previous tick's result) skips looking for the ServiceMonitor child again.
    ``history`` empty (a restart, a new leader): the votes come from ``status.scalingHistory``, expanded to one
    per ``interval_s`` (the loop's tick, seconds).
    """
    meta = body["metadata"]
    status: Mapping[str, Any] = body.get("status") or {}
    planned = cond.find(status.get("conditions"), cond.PLANNED)
    if not planned or planned.get("status") != cond.TRUE or status.get("observedGeneration") != meta.get("generation"):
        return ScaleTick({})
    try:
        desired = desired_state(body.get("spec") or {}, adopted_profile(body.get("spec") or {}, status))
    except SpecError:
        return ScaleTick({})
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    # prometheus-operator installed after the BatchedModel: its ServiceMonitor appears on the next ticks; once
    # seen, it is not looked for again (one GET per model per tick would be the loop's largest cost)
    if not monitored and kube.has_kind(*SERVICE_MONITOR):
        if kube.get(*SERVICE_MONITOR, names(owner)["servicemonitor"], owner.namespace) is None:
            _apply_service_monitor(kube, owner)
        monitored = kube.has_kind(*SERVICE_MONITOR)
    dep_name = names(owner)["deployment"]
    deployment = kube.get("apps/v1", "Deployment", dep_name, owner.namespace)
    drift = children_drift(deployment, desired, status)
    if drift:  # the generation was handled (checked above), so the handler will not apply them again
        return ScaleTick({}, desired=desired, monitored=monitored, drift=drift)
    assert deployment is not None
    pods = pod_counts(kube.list_pods(owner.namespace, selector_labels(owner)))
    spec, plan = desired.spec, desired.plan_status
    target = SignalTarget(owner.namespace, owner.name, spec.model.name, plan.maxBatchSize, pods.ready)
    signals = read_signals(target)

    current = int((deployment.get("spec") or {}).get("replicas") or 0)
    restored = None
    applied = status.get("appliedReplicas")  # what this operator last set in Auto (absent in Advise/Off)
    auto = spec.scaling.mode == ScalingMode.AUTO
    if auto and isinstance(applied, int) and applied != current:
        restored, current = current, applied
    # A Ready pod whose series Prometheus has not scraped yet serves load the signals do not show: it counts as
    # capacity on the way, not as measured capacity (else its arrival looks like the same load on more pods).
    measured = len(pods.ready) if signals.state == SignalState.UNKNOWN else min(len(pods.ready), signals.pods)
    replicas = Replicas(
        current=current,
        ready=measured,
        starting=pods.starting + len(pods.ready) - measured,
        pending=pods.pending,
        pending_reason=pods.pending_reason,
    )
    horizon = history_horizon_s(spec.scaling.scaleDownStabilizationSeconds, signals.window_s)
    stored_votes = _votes(status.get("scalingHistory"))
    if not history:  # a restarted or newly elected operator continues the window status kept
        history = expand_history(stored_votes, now, horizon, interval_s)
    decision = decide(ScalingInput(now, signals, PlanNumbers.from_status(plan), spec.scaling, replicas, history))
    target_replicas = decision.desired_replicas if decision.apply else current
    events: list[tuple[str, str, str]] = []
    if restored is not None:
        managers = replicas_managers(deployment)
        others = sorted(set(managers) - {FIELD_MANAGER})
        if others or not managers:
            by = f" by {', '.join(others)}" if others else ""
            events.append(("Normal", "ManualScaleReverted", f"Deployment replicas {restored} were set outside "
                           f"batchfill{by}; scaling.mode Auto owns them: set {target_replicas} (use scaling.mode "
                           "Off to scale by hand)"))  # fmt: skip
        else:  # batchfill's own last count: its scale to `applied` was recorded in status but never reached it
            events.append(("Normal", "ScaleResumed", f"{restored} -> {target_replicas}: status recorded a scale to "
                           f"{applied} that had not reached the Deployment (the operator stopped, or the API "
                           "refused it, between the two writes)"))  # fmt: skip
    if decision.apply:
        events.append(("Normal", decision.reason, f"{current} -> {decision.desired_replicas}: {decision.message}"))
    elif decision.reason != status.get("lastScaleReason") and decision.reason != "HoldMetricsUnknown":
        # a first plan has no capacity by design: holding is expected there, not a warning
        expected = decision.reason == "HoldNoCapacity" and desired.profile_source == FIRST_PLAN
        kind = "Warning" if decision.reason in WARNING_REASONS and not expected else "Normal"
        events.append((kind, decision.reason, decision.message))
    conditions = _scaling_conditions(decision, signals)
    metrics = conditions[0]
    before = cond.find(status.get("conditions"), cond.METRICS_AVAILABLE) or {}
    if metrics.status == cond.FALSE and (before.get("status"), before.get("reason")) != (cond.FALSE, metrics.reason):
        # once per outage: Prometheus trouble is a Warning; pods not scraped yet (a new model or pod) are expected
        expected_gap = signals.reason in (NO_SERIES, NO_READY_PODS)
        events.append(("Normal" if expected_gap else "Warning", "HoldMetricsUnknown", decision.message))

    wanted = desired_status(body, desired, deployment, now=now, extra=conditions)
    wanted["desiredReplicas"] = decision.desired_replicas
    wanted["appliedReplicas"] = target_replicas if auto else None
    wanted["lastScaleReason"] = decision.reason
    if decision.apply or restored is not None:
        wanted["lastScaleTime"] = cond.rfc3339(now)
    wanted["observed"] = observed_status(signals)
    store = history_to_store(stored_votes, compact_history(decision.history, now, horizon))
    if store is not None:
        wanted["scalingHistory"] = [
            {"time": cond.rfc3339(v.time), "replicas": v.replicas, "ready": v.ready} for v in store
        ]
    return ScaleTick(
        changed_fields(status, wanted),
        decision=decision,
        signals=signals,
        replicas=target_replicas,
        ready=len(pods.ready),
        holding=len(pods.ready) + pods.starting,
        desired=desired,
        deployment=dep_name,
        scale_to=target_replicas if (restored is not None or decision.apply) else None,
        events=tuple(events),
        monitored=monitored,
    )


def _votes(stored: Any) -> tuple[Recommendation, ...]:
    """status.scalingHistory as votes; malformed entries (a hand-edited status) are skipped."""
    out = []
    for v in stored if isinstance(stored, list) else []:
        try:
            t = _seconds(v.get("time"))
            replicas, ready = int(v["replicas"]), int(v["ready"])
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
        if t is not None and math.isfinite(t) and replicas >= 0 and ready >= 0:
            out.append(Recommendation(t, replicas, ready))
    return tuple(sorted(out))


def _scaling_conditions(decision: Decision, signals: ModelSignals) -> list[cond.ConditionUpdate]:
    if decision.metrics_available:
        ok = signals.state == SignalState.IDLE
        metrics = cond.ConditionUpdate(
            cond.METRICS_AVAILABLE,
            cond.TRUE,
            "Idle" if ok else "SignalsOk",
            f"{signals.pods} Ready pod(s) reporting" + (", no traffic" if ok else ""),
        )
    else:
        metrics = cond.ConditionUpdate(
            cond.METRICS_AVAILABLE,
            cond.FALSE,
            signals.reason or "NoData",
            f"{signals.message or 'no usable signals'}; replicas are held",
        )
    if decision.pending_replicas:
        limited = cond.ConditionUpdate(
            cond.CAPACITY_LIMITED,
            cond.TRUE,
            "ReplicasPending",
            f"{decision.pending_replicas} replica(s) cannot be scheduled: {decision.pending_reason}",
        )
    elif decision.capacity_limited:
        limited = cond.ConditionUpdate(
            cond.CAPACITY_LIMITED, cond.TRUE, "AtMaxReplicas", "the load needs more than maxReplicas"
        )
    else:
        limited = cond.ConditionUpdate(cond.CAPACITY_LIMITED, cond.FALSE, "WithinCapacity", "")
    updates = [metrics, limited]
    if decision.low_concurrency:  # CASES C04: say why batching does nothing, instead of adding GPUs
        updates.append(
            cond.ConditionUpdate(
                cond.BATCHING_EFFECTIVE,
                cond.FALSE,
                "LowConcurrency",
                "batches average under 1.5 requests and requests wait about the configured queue delay for "
                "partners: clients send one request at a time; send concurrently (async or more clients) to let "
                "Triton batch (status.observed.avgBatchSize)",
            )
        )
    return updates


# -- profiling ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileTick:
    """What one profiling pass decided: status fields to patch (empty: none), events, and whether the plan
    now comes from a newly adopted measured profile (the caller then reconciles: the Deployment rolls once)."""

    status: dict[str, Any]
    events: tuple[tuple[str, str, str], ...] = ()
    replan: bool = False
    reason: str = ""


def _points(fitted: Sequence[FittedPoint]) -> list[dict[str, Any]]:
    return [
        {"batchSize": p.batch_size, "latencyMs": significant(p.latency_ms), "executions": p.executions} for p in fitted
    ]


def _seconds(rfc3339: str | None) -> float | None:
    if not rfc3339:
        return None
    try:
        return datetime.datetime.fromisoformat(rfc3339).timestamp()
    except ValueError:
        return None


def profile_tick(body: Mapping[str, Any], totals: Sequence[BatchTotals], pods: int, *, now: float) -> ProfileTick:
    """Fit the profile from the Ready pods' batch statistics and decide whether the plan adopts it.

    Args:
        body: the BatchedModel as read.
        totals: per batch size, executions and execution time summed over pods since each was first seen.
        pods: pods whose statistics were read.
        now: seconds since the epoch.

    ``status.measuredProfile`` is written when the plan adopts a measurement, and otherwise at most once per
    ``spec.profiling.replanIntervalSeconds`` (a fresh measurement every tick would make an idle system write).
    """
    spec_d: Mapping[str, Any] = body.get("spec") or {}
    status: Mapping[str, Any] = body.get("status") or {}
    try:
        desired = desired_state(spec_d, adopted_profile(spec_d, status))
    except SpecError:
        return ProfileTick({})
    spec, plan = desired.spec, desired.plan_status
    prof = spec.profiling
    planned = status.get("plannedProfile") or {}
    adopted = None
    if desired.profile_source == MEASURED:
        adopted = [FittedPoint(int(p["batchSize"]), float(p["latencyMs"]), int(p.get("executions", 0)))
                   for p in planned.get("points") or []]  # fmt: skip
    limit = _batch_limit(spec, plan, adopted)
    fitted = fit_profile(totals, min_executions=prof.minExecutions, up_to=limit)
    declared = None if spec.profile_source == ProfileSource.MEASURED or not spec.profile else spec.profile
    decision = decide_replan(
        declared=LatencyProfile.from_points(declared) if declared else None,
        measured=fitted,
        adopted=adopted,
        tolerance=prof.tolerancePercent / 100.0,
        interval_s=float(prof.replanIntervalSeconds),
        last_replan_s=_seconds(planned.get("since")),
        now_s=now,
        min_sizes=2 if (limit or 1) >= 2 else 1,
    )
    if not fitted:
        return ProfileTick({}, reason=decision.reason)
    measured_status = {"points": _points(fitted), "pods": pods, "measuredAt": cond.rfc3339(now)}
    if decision.replan:
        try:
            desired_state(spec_d, tuple((p.batch_size, p.latency_ms) for p in fitted))
        except SpecError as err:  # the measurement cannot be planned (e.g. l(1) above T): say so, keep the plan
            why = "; ".join(str(p) for p in err.problems)
            message = f"measured profile not adopted: {why}"
            last = _seconds((status.get("measuredProfile") or {}).get("measuredAt"))
            fresh = last is not None and now - last < prof.replanIntervalSeconds
            if fresh:
                return ProfileTick({}, reason="MeasuredProfileInfeasible")
            return ProfileTick({"measuredProfile": measured_status}, (("Warning", "MeasuredProfileInfeasible",
                               message),), reason="MeasuredProfileInfeasible")  # fmt: skip
        new_planned = {
            "source": MEASURED,
            "points": _points(fitted),
            "since": cond.rfc3339(now),
            "reason": decision.reason,
            "message": decision.message,
            "declaredHash": profile_hash(spec_d.get("profile")),
        }
        event = ("Normal", decision.reason, f"re-planning from the measured profile: {decision.message}")
        return ProfileTick(
            {"measuredProfile": measured_status, "plannedProfile": new_planned}, (event,), True, decision.reason
        )
    last = _seconds((status.get("measuredProfile") or {}).get("measuredAt"))
    if last is None or now - last >= prof.replanIntervalSeconds:
        return ProfileTick({"measuredProfile": measured_status}, reason=decision.reason)
    return ProfileTick({}, reason=decision.reason)


def _batch_limit(spec: BatchedModelSpec, plan: PlanStatus, adopted: Sequence[FittedPoint] | None) -> int | None:
    """The largest batch the measured profile is extended to: the model's limit, not the current plan's.

    Triton forms no batch above the plan's ``max_batch_size``, so a measurement stops there; extended only to it,
    a re-plan could never choose a larger batch than the plan it replaces. The limit is
    ``spec.batching.maxBatchSize`` (the largest batch the model accepts) or, without it, the largest batch size
    the declared or adopted profile holds (what the user profiled). None: the model does not batch.
    """
    if spec.batching.maxBatchSize == 0 or plan.maxBatchSize == 0:
        return None
    limit = spec.batching.maxBatchSize
    if limit is None:
        sizes = [p.batchSize for p in spec.profile or []] + [p.batch_size for p in adopted or []]
        limit = max(sizes, default=0)
    return max(limit, plan.maxBatchSize) or None


def ready_pod_ips(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(uid, pod IP) of the pods that are Ready, not terminating and have an IP."""
    out = []
    for pod in pods:
        meta, st = pod.get("metadata") or {}, pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        if ready and not meta.get("deletionTimestamp") and st.get("podIP") and meta.get("uid"):
            out.append((str(meta["uid"]), str(st["podIP"])))
    return out
