"""One profiling tick of one BatchedModel: Triton's batch statistics of its Ready pods, the fitted profile, and
its adoption by the plan (spec.profiling). The loop around it is :class:`batchfill.controller.loops.ProfilingLoop`.

A tick is two rounds of gather (I/O) -> decide (pure) -> act (I/O):

1. measure: :func:`gather_profile` reads the statistics of every Ready pod (in parallel);
   :func:`measure_profile` turns the cumulative counters into totals since each pod's baseline
   (:func:`counter_deltas`), keeps the unreadable-pods bookkeeping, and decides against the object as listed
   (:func:`profile_tick`); :func:`act_measurement` logs and posts its warnings.
2. adopt, only when the measurement changes status: the object is read again (the pass's list is seconds old,
   and a write against its resourceVersion would lose to every status write made since: HTTP 409, the
   measurement dropped; reading it for every model would cost a GET per model per pass);
   :func:`decide_adoption` decides again on it; :func:`act_adoption` writes status, posts the events and, for
   a newly adopted profile, re-applies the children (the new config.pbtxt rolls the Deployment once).

An adoption whose re-apply did not happen (API trouble, a restart in between) is applied by the scaling loop
(:func:`batchfill.controller.status.children_drift`). What the loop keeps per model between ticks is a
:class:`ProfilingMemory`, which :func:`measure_profile` takes and returns.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any

from batchfill.adapters.kube import Kube
from batchfill.adapters.pod_stats import PodBatchStats, PodStatsError
from batchfill.api.errors import SpecError
from batchfill.api.reasons import EventReason, ReplanReason
from batchfill.api.spec import BatchedModelSpec, ProfileSource
from batchfill.api.status import PlannedProfileSource, PlanStatus
from batchfill.controller.desired import adopted_profile, desired_state, profile_hash
from batchfill.controller.pods import ready_pod_ips
from batchfill.controller.reconcile import Event, log_event, reapply
from batchfill.policy import conditions as cond
from batchfill.policy.plan import significant
from batchfill.policy.profile import LatencyProfile
from batchfill.policy.profile_fit import BatchTotals, FittedPoint, decide_replan, fit_profile
from batchfill.render.kube import Owner, selector_labels

log = logging.getLogger("batchfill")

#: Per-pod timeout of a statistics read, seconds (reads run in parallel; an unreachable pod costs this once).
PROFILE_READ_TIMEOUT_S = 2.0
#: How long no Ready pod's statistics may be unreadable before a StatisticsUnavailable Warning, seconds.
UNREAD_WARNING_S = 120.0

#: read_stats(address "host:port", Triton model name): the model's cumulative batch statistics on one pod
#: (batchfill.adapters.pod_stats.read_pod_batch_stats). Raises PodStatsError.
ReadStats = Callable[[str, str], PodBatchStats]


@dataclass(frozen=True)
class ProfilingMemory:
    """What the profiling loop carries from one tick of a model to the next.

    Attributes:
        baselines: pod uid -> the statistics its totals count from: its first read (model warm-up excluded), or
            its first read after its Triton restarted.
        unread: IPs of the Ready pods whose last statistics read failed (a pod is logged once when it turns
            unreadable).
        unread_since: since when no Ready pod's statistics could be read, seconds since the epoch (None: some
            could, or there are no Ready pods).
        warned_at: when StatisticsUnavailable was last posted, seconds since the epoch (None: never).
    """

    baselines: Mapping[str, PodBatchStats] = field(default_factory=dict)
    unread: frozenset[str] = frozenset()
    unread_since: float | None = None
    warned_at: float | None = None


# -- counters ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CounterDeltas:
    """Executions and execution time per batch size since each pod's baseline, summed over the pods counted.

    Attributes:
        baselines: the baselines to keep (pods gone dropped; new and restarted pods set to their read).
        totals: per batch size, executions and nanoseconds summed over the counted pods.
        pods: pods counted (read now, and not new or restarted).
    """

    baselines: dict[str, PodBatchStats]
    totals: tuple[BatchTotals, ...]
    pods: int


def restarted(baseline: PodBatchStats, stats: PodBatchStats) -> bool:
    """Whether ``stats`` were counted by a Triton started after ``baseline`` was read: an execution count of a
    batch size fell (Triton's statistics are cumulative since the model loaded and only grow)."""
    return any(stats.batches.get(b, (0, 0))[0] < n for b, (n, _) in baseline.batches.items())


def counter_deltas(
    baselines: Mapping[str, PodBatchStats], ready: Sequence[str], reads: Mapping[str, PodBatchStats]
) -> CounterDeltas:
    """Turn cumulative per-pod batch statistics into totals since each pod's baseline (pure).

    Args:
        baselines: pod uid -> baseline statistics (:attr:`ProfilingMemory.baselines`).
        ready: uids of the Ready pods now; the baseline of a pod not among them is dropped (it is gone).
        reads: pod uid -> statistics read now; a Ready pod whose read failed is absent and keeps its baseline.

    A pod read for the first time, or whose counters fell (its Triton restarted), becomes its own baseline and
    is not counted: its counters since the model loaded include warm-up, or belong to another process.
    """
    present = set(ready)
    kept = {uid: base for uid, base in baselines.items() if uid in present}
    sums: dict[int, list[int]] = {}
    counted = 0
    for uid, stats in reads.items():
        base = kept.get(uid)
        if base is None or restarted(base, stats):
            kept[uid] = stats
            continue
        counted += 1
        for b, (n, total) in stats.batches.items():
            n0, t0 = base.batches.get(b, (0, 0))
            acc = sums.setdefault(b, [0, 0])
            acc[0] += n - n0
            acc[1] += total - t0
    return CounterDeltas(kept, tuple(BatchTotals(b, n, t) for b, (n, t) in sums.items()), counted)


# -- round 1: measure --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileInputs:
    """What :func:`gather_profile` read of one model.

    Attributes:
        model: the Triton model name (spec.model.name); "" when the spec has none, and nothing was read.
        pods: (uid, IP) of the Ready pods (informer cache).
        reads: per pod, in the same order, its statistics or why they could not be read.
    """

    model: str
    pods: tuple[tuple[str, str], ...] = ()
    reads: tuple[PodBatchStats | PodStatsError, ...] = ()


def _host(ip: str) -> str:
    """A pod IP as the host part of a URL (IPv6 in brackets)."""
    return f"[{ip}]" if ":" in ip else ip


def gather_profile(
    view: Kube, body: Mapping[str, Any], read_stats: ReadStats, *, port: int, pool: Executor
) -> ProfileInputs:
    """Read Triton's batch statistics of the model's Ready pods at ``<pod IP>:<port>``, in parallel on ``pool``.

    Raises:
        KubeTemporaryError / KubePermanentError: the pods' cache is unusable. A pod's failed read is not raised:
        it is that pod's entry of ``reads``.
    """
    meta = body["metadata"]
    model = str(((body.get("spec") or {}).get("model") or {}).get("name") or "")
    if not model:
        return ProfileInputs("")
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    pods = tuple(ready_pod_ips(view.list_pods(owner.namespace, selector_labels(owner))))

    def one(ip: str) -> PodBatchStats | PodStatsError:
        try:
            return read_stats(f"{_host(ip)}:{port}", model)
        except PodStatsError as err:
            return err

    return ProfileInputs(model, pods, tuple(pool.map(one, [ip for _, ip in pods])))


@dataclass(frozen=True)
class Measurement:
    """What :func:`measure_profile` decided.

    Attributes:
        memory: the model's memory for the next tick.
        totals, pods: :class:`CounterDeltas` ``totals`` and ``pods``.
        notes: log lines (a pod whose statistics turned unreadable).
        warnings: events to post on the listed object (StatisticsUnavailable).
        tick: the profile decision against the listed object; a non-empty ``tick.status`` starts round 2.
    """

    memory: ProfilingMemory
    totals: tuple[BatchTotals, ...] = ()
    pods: int = 0
    notes: tuple[str, ...] = ()
    warnings: tuple[Event, ...] = ()
    tick: ProfileTick = field(default_factory=lambda: ProfileTick({}))


def measure_profile(
    body: Mapping[str, Any], inputs: ProfileInputs, memory: ProfilingMemory, *, now: float, port: int
) -> Measurement:
    """Round 1's decision (pure): totals since the baselines, the unreadable-pods bookkeeping, the profile decision.

    Args:
        body: the BatchedModel as listed.
        inputs: :func:`gather_profile`'s reads.
        memory: what the previous tick of this model left.
        now: seconds since the epoch.
        port: Triton's HTTP port (named in the warning).
    """
    if not inputs.model:
        return Measurement(memory)
    failed = [(ip, r) for (_, ip), r in zip(inputs.pods, inputs.reads, strict=True) if isinstance(r, PodStatsError)]
    memory, notes, warnings = _unread(body, memory, failed, len(inputs.pods), now=now, port=port)
    reads = {uid: r for (uid, _), r in zip(inputs.pods, inputs.reads, strict=True) if isinstance(r, PodBatchStats)}
    deltas = counter_deltas(memory.baselines, [uid for uid, _ in inputs.pods], reads)
    memory = replace(memory, baselines=deltas.baselines)
    tick = profile_tick(body, deltas.totals, deltas.pods, now=now)
    return Measurement(memory, deltas.totals, deltas.pods, notes, warnings, tick)


def _unread(
    body: Mapping[str, Any],
    memory: ProfilingMemory,
    failed: Sequence[tuple[str, PodStatsError]],
    ready: int,
    *,
    now: float,
    port: int,
) -> tuple[ProfilingMemory, tuple[str, ...], tuple[Event, ...]]:
    """A Warning event when no Ready pod's statistics could be read for :data:`UNREAD_WARNING_S` (once per
    replan interval per model), and a log line for each pod that turns unreadable: silence would look like a
    model never measured. The delay keeps a roll or a scale-out (a pod Ready a moment before its server
    answers) from raising an alarm."""
    meta = body["metadata"]
    notes = tuple(
        f"statistics of {meta['namespace']}/{meta['name']} pod {ip} not read: {err}"
        for ip, err in failed
        if ip not in memory.unread
    )
    memory = replace(memory, unread=frozenset(ip for ip, _ in failed))
    if not failed or len(failed) < ready:
        return replace(memory, unread_since=None), notes, ()
    since = now if memory.unread_since is None else memory.unread_since
    memory = replace(memory, unread_since=since)
    interval = float(((body.get("spec") or {}).get("profiling") or {}).get("replanIntervalSeconds") or 600)
    last = -math.inf if memory.warned_at is None else memory.warned_at
    if now - since < UNREAD_WARNING_S or now - last < interval:
        return memory, notes, ()
    ip, err = failed[0]
    warning = ("Warning", EventReason.STATISTICS_UNAVAILABLE, (
        f"for {now - since:.0f} s Triton statistics of none of the {ready} Ready pod(s) could be read on port "
        f"{port} (e.g. {ip}: {err}); the profile is not being measured"
    ))  # fmt: skip
    return replace(memory, warned_at=now), notes, (warning,)


def act_measurement(kube: Kube, body: Mapping[str, Any], measured: Measurement) -> None:
    """Round 1's writes: log the notes, post the warnings on the listed object (an event is never raised)."""
    meta = body["metadata"]
    for note in measured.notes:
        log.info("%s", note)
    for type_, reason, message in measured.warnings:
        kube.post_event(body, type_, reason, message)
        log_event(meta["namespace"], meta["name"], type_, reason, message)


# -- round 2: adopt ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Adoption:
    """What :func:`decide_adoption` decided: the status to write on ``target`` (the object as stored now,
    whose resourceVersion is the write's precondition), the events to post once it landed, and whether to
    re-apply the children then. ``target`` None: nothing to write."""

    target: Mapping[str, Any] | None = None
    status: dict[str, Any] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    replan: bool = False


def decide_adoption(
    body: Mapping[str, Any], measured: Measurement, stored: Mapping[str, Any] | None, *, now: float
) -> Adoption:
    """Round 2's decision (pure): :func:`profile_tick` again, on ``stored`` (the object read again after round 1;
    None: it is gone). A different uid is another object of the same name: nothing is written to it."""
    if not measured.tick.status or stored is None or stored["metadata"].get("uid") != body["metadata"]["uid"]:
        return Adoption()
    tick = profile_tick(stored, measured.totals, measured.pods, now=now)
    if not tick.status:
        return Adoption()
    return Adoption(stored, tick.status, tick.events, tick.replan)


def act_adoption(kube: Kube, adoption: Adoption, *, clock: Callable[[], float] = time.time) -> None:
    """Round 2's writes, in this order: patch status (precondition: ``target``'s resourceVersion; a lost race
    ends here), post the events, re-apply the children for a newly adopted profile.

    Raises:
        KubeTemporaryError / KubePermanentError: from the API.
    """
    target = adoption.target
    if target is None or not adoption.status or not kube.patch_status(target, adoption.status):
        return
    meta = target["metadata"]
    for type_, reason, message in adoption.events:
        kube.post_event(target, type_, reason, message)
        log_event(meta["namespace"], meta["name"], type_, reason, message)
    if adoption.replan:
        reapply(kube, meta["name"], meta["namespace"], now=clock())


# -- the profile decision ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileTick:
    """What one profile decision says: status fields to patch (empty: none), events, and whether the plan
    now comes from a newly adopted measured profile (the children are then re-applied: the Deployment rolls
    once); ``reason`` is the replan rule's (policy/profile_fit.py), for tests and logs."""

    status: dict[str, Any]
    events: tuple[Event, ...] = ()
    replan: bool = False
    reason: str = ""


def _points(fitted: Sequence[FittedPoint]) -> list[dict[str, Any]]:
    return [
        {"batchSize": p.batch_size, "latencyMs": significant(p.latency_ms), "executions": p.executions} for p in fitted
    ]


def profile_tick(body: Mapping[str, Any], totals: Sequence[BatchTotals], pods: int, *, now: float) -> ProfileTick:
    """Fit the profile from the Ready pods' batch statistics and decide whether the plan adopts it.

    Args:
        body: the BatchedModel as read.
        totals: per batch size, executions and execution time summed over pods since each pod's baseline
            (:func:`counter_deltas`).
        pods: pods counted in ``totals``.
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
    if desired.profile_source == PlannedProfileSource.MEASURED:
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
        last_replan_s=cond.parse_rfc3339(planned.get("since")),
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
            last = cond.parse_rfc3339((status.get("measuredProfile") or {}).get("measuredAt"))
            fresh = last is not None and now - last < prof.replanIntervalSeconds
            if fresh:
                return ProfileTick({}, reason=ReplanReason.MEASURED_PROFILE_INFEASIBLE)
            warning = ("Warning", ReplanReason.MEASURED_PROFILE_INFEASIBLE, message)
            return ProfileTick({"measuredProfile": measured_status}, (warning,), reason=warning[1])
        new_planned = {
            "source": PlannedProfileSource.MEASURED,
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
    last = cond.parse_rfc3339((status.get("measuredProfile") or {}).get("measuredAt"))
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
