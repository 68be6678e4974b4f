"""The pool model-control loop: every interval, one tick of :mod:`batchfill.controller.pool_models` per GPUPool.

A pass lists the GPUPools and the BatchedModels once (through the adapter, as :class:`~batchfill.controller.loops.
ScalingLoop` lists BatchedModels) and, per pool:

1. gather: the pool's pods from the cache view (:func:`batchfill.render.pool.pool_selector_labels`); each Ready pod's
   repository index, read in parallel, at most :data:`WORKERS` at a time and all within :data:`INDEX_DEADLINE_S`
   (a pod not answered by then is unread: not acted on this tick); the wanted models (:func:`pool_members`);
2. decide: :func:`~batchfill.controller.pool_models.decide_pool_models`;
3. act, in the plan's order: the loads (parallel, the same bound, within :data:`LOAD_DEADLINE_S`), the pod patches
   (one per pod, under the pod's resourceVersion as gathered: :meth:`batchfill.adapters.kube.Kube.
   patch_pod_metadata`), the unloads (parallel, within :data:`INDEX_DEADLINE_S`); the outcomes go through
   :func:`~batchfill.controller.pool_models.remember` into the pool's memory and its Events are posted.

A failed call is that write's outcome, never the tick's end: the other pods and models go on, and the next tick
decides again from what the pods show.

Around that, the pool's joint plan (:mod:`batchfill.controller.pool_plan`: its pods, which pod serves which model)
and its writes besides the loads (:mod:`batchfill.controller.pool_sync`: the pool's Deployment, each member's
status, the GPUPool's status). ``batchfill run`` starts it with its own caches of the pool pods and Deployments
(the children's select the BatchedModel label, which pool pods do not carry).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pydantic import ValidationError

from batchfill.adapters import operator_metrics, triton_repository
from batchfill.adapters.informer import CachedView
from batchfill.adapters.kube import Kube, KubeNotFoundError, KubePermanentError, KubeTemporaryError
from batchfill.adapters.metrics import SignalTarget
from batchfill.adapters.signal_hub import SignalHub
from batchfill.adapters.triton_repository import IndexEntry, TritonCallError
from batchfill.api.pool import POOL_PLURAL, GPUPoolSpec
from batchfill.api.reasons import SpecReason
from batchfill.api.spec import BatchedModelSpec, PlacementMode
from batchfill.api.status import PlanStatus
from batchfill.api.validate import pool_problems, problems_from_validation_error
from batchfill.controller.desired import Desired
from batchfill.controller.loops import PeriodicLoop, watched
from batchfill.controller.pool_cost import CostMemory, decide_cost
from batchfill.controller.pool_models import (
    Load,
    Outcome,
    PodPatch,
    PoolEvent,
    PoolModelsMemory,
    PoolModelsPlan,
    PoolPod,
    Unload,
    WantedModel,
    decide_pool_models,
    pool_pod,
    remember,
    wanted_model,
)
from batchfill.controller.pool_plan import Member, PoolPlan, PoolPlanMemory, decide_pool_plan
from batchfill.controller.pool_sync import (
    POOL_MESSAGE_MAX,
    labelled,
    member,
    member_writes,
    pool_deployment,
    pool_status,
    pool_validity,
)
from batchfill.controller.reconcile import SERVICE_MONITOR, apply_service_monitor, log_event, reapply
from batchfill.controller.settings import OperatorSettings
from batchfill.controller.shared_status import member_rate
from batchfill.policy.cost import ExecutionCounters
from batchfill.policy.signals import ModelSignals
from batchfill.render.model_config import InstanceKind
from batchfill.render.pool import (
    PoolOwner,
    TritonRequest,
    build_pool_service,
    build_pool_service_monitor,
    pool_deployment_name,
    pool_selector_labels,
)

log = logging.getLogger("batchfill")

#: Repository calls in flight at once (index reads, loads, unloads: one pool at a time).
WORKERS = 8
#: Seconds for all of a pool's index reads (or unloads); each call's own timeout is READ_TIMEOUT_S.
INDEX_DEADLINE_S = triton_repository.READ_TIMEOUT_S + 2.0
#: Seconds for all of a pool's loads of one tick; each load's own timeout is LOAD_TIMEOUT_S.
LOAD_DEADLINE_S = triton_repository.LOAD_TIMEOUT_S + 5.0
_T = TypeVar("_T")
#: model names, pod names -> the pods each model is to be served on (a model left out: on none).
Assign = Callable[[Sequence[str], Sequence[str]], Mapping[str, frozenset[str]]]


@dataclass(frozen=True)
class Repository:
    """Triton's repository API on one pod (default: :mod:`batchfill.adapters.triton_repository`, whose calls never
    raise for what a pod answers); the unit tests pass fakes."""

    index: Callable[[str, str], Mapping[str, IndexEntry] | TritonCallError] = triton_repository.repository_index
    load: Callable[[str, str, TritonRequest], TritonCallError | None] = triton_repository.load
    unload: Callable[[str, str, str], TritonCallError | None] = triton_repository.unload
    counters: Callable[[str, str], Mapping[str, ExecutionCounters] | TritonCallError] | None = (
        triton_repository.execution_counters
    )  # None: no cost split (the tests of loads and labels)


def every_pod(models: Sequence[str], pods: Sequence[str]) -> dict[str, frozenset[str]]:
    """Each shared model on every pod of the pool: the assignment until the joint plan's shared GPUs map to pods."""
    return {m: frozenset(pods) for m in models}


def _shared_here(body: Mapping[str, Any], pool: str) -> bool | None:
    """Whether the BatchedModel is served on ``pool`` now (True), is leaving or never joined it (False), or is not
    the pool's at all (None): spec.placement.mode Shared, or Auto that status.placement resolved to Shared there."""
    placement = (body.get("spec") or {}).get("placement") or {}
    if placement.get("pool") != pool:
        return None
    if placement.get("mode") == PlacementMode.SHARED:
        return True
    status = (body.get("status") or {}).get("placement") or {}
    return placement.get("mode") == PlacementMode.AUTO and status.get("mode") == "Shared" and status.get("pool") == pool


def pool_members(
    pool: Mapping[str, Any],
    spec: GPUPoolSpec,
    models: Sequence[Mapping[str, Any]],
    pods: Sequence[str],
    *,
    assign: Assign = every_pod,
    instance_kind: InstanceKind | None = None,
) -> tuple[list[WantedModel], list[str]]:
    """The models ``pool`` serves, with the config to load (``status.plan``, the plan the model's status states),
    and notes on the models left out.

    A model whose spec.placement names the pool is wanted on the pods ``assign`` gives while it is shared there; one
    leaving the pool (spec Dedicated, Auto resolved to Dedicated) stays wanted on no pod, so its last labelled copy
    keeps serving, until ``status.readyReplicas`` says its own replicas are Ready. Left out, each with a note:
    no plan yet, a spec or plan that does not parse or render, a Triton model name already taken by another
    member, and the members beyond ``spec.maxModelsPerPod`` (by name).
    """
    meta = pool["metadata"]
    notes: list[str] = []
    found: dict[str, tuple[str, BatchedModelSpec, PlanStatus, bool]] = {}
    for body in sorted(models, key=lambda b: str(b["metadata"]["name"])):
        m = body["metadata"]
        shared = _shared_here(body, meta["name"])
        if m.get("namespace") != meta["namespace"] or m.get("deletionTimestamp") or shared is None:
            continue
        status = body.get("status") or {}
        if not shared and status.get("readyReplicas"):
            continue  # its own replicas serve it: its pool copies drain
        if not status.get("plan"):
            notes.append(f"{m['name']}: no plan in status yet")
            continue
        try:
            model_spec = BatchedModelSpec.model_validate(body["spec"])
            plan = PlanStatus.model_validate(status["plan"])
        except ValidationError as err:
            notes.append(f"{m['name']}: {err.error_count()} invalid field(s), first: {err.errors()[0]['loc']}")
            continue
        taken = next((n for n, (t, *_) in found.items() if t == model_spec.model.name), None)
        if taken is not None:
            notes.append(f"{m['name']}: Triton model {model_spec.model.name!r} is already {taken}'s on this pool")
            continue
        found[m["name"]] = (model_spec.model.name, model_spec, plan, shared)
    kept = sorted(found)[: spec.maxModelsPerPod]
    notes += [f"{n}: beyond maxModelsPerPod={spec.maxModelsPerPod}" for n in sorted(found)[spec.maxModelsPerPod :]]
    where = assign([n for n in kept if found[n][3]], pods)
    wanted = []
    for name in kept:
        _, model_spec, plan, shared = found[name]
        try:
            on = where.get(name, frozenset()) if shared else frozenset()
            wanted.append(wanted_model(name, model_spec, plan, spec, on, instance_kind=instance_kind))
        except ValueError as err:
            notes.append(f"{name}: its plan does not render: {err}")
    return wanted, notes


def _bounded(
    pool: ThreadPoolExecutor, calls: Sequence[Callable[[], _T]], deadline_s: float, late: Callable[[int], _T]
) -> list[_T]:
    """Each call's result, run on ``pool``; a call not done within ``deadline_s`` (or that raised) is ``late(i)``."""
    futures: list[Future[_T]] = [pool.submit(c) for c in calls]
    wait(futures, timeout=deadline_s)
    out = []
    for i, f in enumerate(futures):
        if f.done() and not f.cancelled() and f.exception() is None:
            out.append(f.result())
        else:
            f.cancel()
            if f.done() and not f.cancelled():
                log.warning("pool repository call %d failed: %s", i, f.exception())
            out.append(late(i))
    return out


class PoolModelsLoop(PeriodicLoop[PoolModelsMemory]):
    """Every ``settings.reconcile_interval_s``: one pool model-control tick per GPUPool the operator serves.

    Args:
        kube: the API (GPUPools and BatchedModels listed, pods patched, Events).
        view: the pods' cache.
        settings: namespaces; ``triton_cpu_image`` set loads KIND_CPU instance groups (clusters without GPUs).
        repository: the Triton repository calls (default: the adapter).
        assign: which pods serve each shared model (default: :func:`every_pod`).
    """

    name = "pool-models"
    kinds = ("pods", "deployments")

    def __init__(
        self,
        kube: Kube,
        view: CachedView,
        settings: OperatorSettings,
        repository: Repository | None = None,
        assign: Assign | None = None,
        hub: SignalHub | None = None,
    ) -> None:
        super().__init__(kube, view, settings, settings.reconcile_interval_s)
        self.repository = repository or Repository()
        self.assign = assign  # None: the joint plan's (pool_plan); tests pass every_pod
        self.hub = hub
        self.plans: dict[str, PoolPlanMemory] = {}  # pool uid -> its joint plan's memory
        self.serviced: set[str] = set()  # pool uids whose metrics Service this run has applied
        self.costs: dict[str, CostMemory] = {}  # pool uid -> its pods' last execution counters
        self.no_crd = False  # the GPUPool CRD was found missing (said once)
        self.kind: InstanceKind | None = "KIND_CPU" if settings.triton_cpu_image else None
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="batchfill-pool")

    def stop(self) -> None:
        super().stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def tick(self, now: float) -> None:
        """One pass over every GPUPool (``now``: seconds since the epoch)."""
        try:
            pools = self.kube.list_gpu_pools(self.settings.exact_namespaces)
            # no pool: nothing to list the models for (a LIST of every BatchedModel per pass saved)
            models = self.kube.list_batched_models(self.settings.exact_namespaces) if pools else []
            self.view.check(self.kinds)
        except KubeNotFoundError as err:  # the GPUPool CRD is not installed: no pools, said once
            if not self.no_crd:
                log.info("%s: no GPUPools served (%s); passes go on in case the CRD is installed", self.name, err)
            self.no_crd, pools, models = True, [], []
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("%s pass postponed: %s", self.name, err)
            return
        seen = set()
        for body in pools:
            meta = body["metadata"]
            if meta.get("deletionTimestamp") or not watched(self.settings, meta["namespace"]):
                continue
            seen.add(meta["uid"])
            try:
                self._pool(body, models, now)
            except (KubeTemporaryError, KubePermanentError) as err:
                log.warning("%s tick of %s/%s postponed: %s", self.name, meta["namespace"], meta["name"], err)
            except Exception:  # a bug on one pool must not stop the others
                log.exception("%s tick of %s/%s failed", self.name, meta["namespace"], meta["name"])
        for uid in set(self.memory) - seen:
            del self.memory[uid]
        for uid in set(self.plans) - seen:
            del self.plans[uid]
        self.serviced &= seen
        for uid in set(self.costs) - seen:
            del self.costs[uid]

    def _pool(self, body: dict[str, Any], models: Sequence[Mapping[str, Any]], now: float) -> None:
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        try:
            spec = GPUPoolSpec.model_validate(body.get("spec") or {})
            problems = pool_problems(spec)
        except ValidationError as err:
            problems = problems_from_validation_error(err)
        if problems:
            # the pool's pods are left as they are: a spec that cannot be served changes nothing it runs
            self._refuse(body, SpecReason.INVALID_SPEC, "; ".join(str(p) for p in problems), now)
            return
        raw = self.view.list_pods(ns, pool_selector_labels(name))
        pods = self._gather(raw, spec.maxPods + 1)
        members, signals = self._members(name, ns, models, raw)
        pool_plan = decide_pool_plan(spec, [m for _, m, _ in members], [p.name for p in pods if p.known],
                                     self.plans.get(meta["uid"], PoolPlanMemory()), now)  # fmt: skip
        self.plans[meta["uid"]] = pool_plan.memory
        assign = self.assign or (lambda _names, _pods: pool_plan.where)
        wanted, notes = pool_members(body, spec, models, [p.name for p in pods], assign=assign,
                                     instance_kind=self.kind)  # fmt: skip
        for note in notes:
            log.warning("pool %s/%s: %s", ns, name, note)
        plan = decide_pool_models(pods, wanted, self.memory.get(meta["uid"], PoolModelsMemory()), now)
        versions = {str(p["metadata"].get("name")): str(p["metadata"].get("resourceVersion") or "") for p in raw}
        outcomes = self._act(ns, plan, versions, now)
        self.memory[meta["uid"]], events = remember(plan.memory, outcomes)
        by_name = {m["metadata"]["name"]: m for m in models if m["metadata"].get("namespace") == ns}
        for e in events:
            self._post(by_name.get(e.name, body), e)
        try:
            self._sync(body, spec, raw, members, pool_plan, signals, now)
        except KubePermanentError as err:  # an admission rule, a quota, a limit range refused what the pool renders
            self._refuse(body, SpecReason.APPLY_REJECTED, f"the API server refused the pool's objects: {err}", now)
            return
        self._charge(body, spec, pods, members, now)

    def _refuse(self, body: Mapping[str, Any], reason: SpecReason, why: str, now: float) -> None:
        """ConfigValid=False on the GPUPool, naming the fields; one Warning event each time the message changes."""
        meta = body["metadata"]
        changed = pool_validity(body, why, reason, now)
        if not changed:
            return
        if self.kube.patch_status(body, changed, plural=POOL_PLURAL):
            self.kube.post_event(body, "Warning", reason, why[:POOL_MESSAGE_MAX])
            log_event(meta["namespace"], meta["name"], "Warning", reason, why[:POOL_MESSAGE_MAX])

    def _charge(
        self,
        body: Mapping[str, Any],
        spec: GPUPoolSpec,
        pods: Sequence[PoolPod],
        members: Sequence[tuple[Mapping[str, Any], Member, Desired]],
        now: float,
    ) -> None:
        """The pods' GPU time since the last tick, split among their models and exported (controller/pool_cost.py):
        each read pod's execution counters, read in parallel within the index deadline."""
        read = self.repository.counters
        if read is None:
            return
        meta = body["metadata"]
        known = [p for p in pods if p.known]
        calls = [lambda p=p: read(p.address, p.name) for p in known]
        late = f"no answer within {INDEX_DEADLINE_S:.0f} s"
        answers = _bounded(
            self.pool, calls, INDEX_DEADLINE_S, lambda i: TritonCallError(known[i].name, "", "stats", None, late)
        )
        reads = {p.name: None if isinstance(a, TritonCallError) else a for p, a in zip(known, answers, strict=True)}
        names = {m.spec.model.name: m.name for _, m, _ in members}
        listed = [p.name for p in pods]  # a pod read before and unread now still held its GPU
        splits, self.costs[meta["uid"]] = decide_cost(
            reads, names, float(spec.gpusPerPod), self.costs.get(meta["uid"], CostMemory()), now, listed
        )
        operator_metrics.observe_cost(meta["namespace"], meta["name"], splits)

    def _members(
        self, pool: str, namespace: str, models: Sequence[Mapping[str, Any]], raw: Sequence[Mapping[str, Any]]
    ) -> tuple[list[tuple[Mapping[str, Any], Member, Desired]], dict[str, ModelSignals]]:
        """The models that name the pool (Shared or Auto), each with its observed rate and plan; and the signals
        of those with pool copies, read over those copies."""
        out = []
        signals: dict[str, ModelSignals] = {}
        for body in sorted(models, key=lambda b: str(b["metadata"]["name"])):
            meta, placement = body["metadata"], (body.get("spec") or {}).get("placement") or {}
            if meta.get("namespace") != namespace or meta.get("deletionTimestamp") or placement.get("pool") != pool:
                continue
            if placement.get("mode") not in (PlacementMode.SHARED, PlacementMode.AUTO):
                continue
            found = member(body, None)
            if isinstance(found, str):
                log.warning("pool %s/%s: %s %s", namespace, pool, meta["name"], found)
                continue
            m, desired = found
            copies = frozenset(labelled(raw, m.name))
            pooled = None
            if self.hub is not None and copies:
                target = SignalTarget(namespace, m.name, m.spec.model.name, desired.plan_status.maxBatchSize, copies)
                signals[m.name] = self.hub.signals(target)
                pooled = signals[m.name].request_rate_rps
            m = replace(m, rate_rps=member_rate(bool(copies), pooled, body))
            out.append((body, m, desired))
        return out, signals

    def _sync(
        self,
        body: Mapping[str, Any],
        spec: GPUPoolSpec,
        raw: Sequence[Mapping[str, Any]],
        members: Sequence[tuple[Mapping[str, Any], Member, Desired]],
        plan: PoolPlan,
        signals: Mapping[str, ModelSignals],
        now: float,
    ) -> None:
        """The pool's Deployment, its members' statuses (and their re-apply), the GPUPool's status."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        cached = self.view.get("apps/v1", "Deployment", pool_deployment_name(name), ns)
        owner = PoolOwner(name, ns, meta["uid"])
        deployment = pool_deployment(owner, spec, cached, plan.pods, raw, cpu_image=self.settings.triton_cpu_image)
        if deployment is not None:
            self.kube.apply(deployment)
        if deployment is not None or meta["uid"] not in self.serviced:
            # its metrics Service (the pool's one scrape target) with the Deployment, and once per operator run
            self.kube.apply(build_pool_service(owner))
            if self.kube.has_kind(*SERVICE_MONITOR):
                apply_service_monitor(self.kube, build_pool_service_monitor(owner))
            self.serviced.add(meta["uid"])
        observed = signals if self.hub is not None else None
        for w in member_writes(members, plan, raw, now=now, signals=observed):
            m = w.body["metadata"]
            if w.status and not self.kube.patch_status(w.body, w.status):
                continue  # changed meanwhile: the next tick writes from the newer copy
            if w.reapply:
                reapply(self.kube, m["name"], m["namespace"], now=now)
        changed = {**pool_status(body, plan, raw, len(members)), **pool_validity(body, None, "", now)}
        if changed:
            self.kube.patch_status(body, changed, plural=POOL_PLURAL)

    def _gather(self, raw: Sequence[Mapping[str, Any]], most: int) -> list[PoolPod]:
        """The pods with the index of each one that may be acted on (Ready, with an IP), read in parallel; at most
        ``most`` (spec.maxPods and a rolling update's surge pod, by name): the others stay unknown this tick."""
        seen = [pool_pod(p, None) for p in raw]
        readable = sorted((p for p in seen if p.ready and p.address), key=lambda p: p.name)[:most]
        if len(readable) < sum(p.ready and bool(p.address) for p in seen):
            log.warning("%s: more Ready pool pods than maxPods + 1 = %d: the rest are not read", self.name, most)
        index = self.repository.index
        calls = [lambda p=p: index(p.address, p.name) for p in readable]
        late = f"no answer within {INDEX_DEADLINE_S:.0f} s"
        reads = _bounded(
            self.pool, calls, INDEX_DEADLINE_S, lambda i: TritonCallError(readable[i].name, "", "index", None, late)
        )
        by_pod = {p.name: r for p, r in zip(readable, reads, strict=True)}
        for r in by_pod.values():
            if isinstance(r, TritonCallError):
                log.warning("%s: %s (the pod is not acted on this tick)", self.name, r)
        return [pool_pod(p, by_pod.get(s.name)) for p, s in zip(raw, seen, strict=True)]

    def _act(self, namespace: str, plan: PoolModelsPlan, versions: Mapping[str, str], now: float) -> list[Outcome]:
        """The plan's writes, in order (loads, patches, unloads); each one's outcome."""
        repo = self.repository
        loads = [lambda w=w: repo.load(w.address, w.pod, w.request) for w in plan.loads]
        done = _bounded(self.pool, loads, LOAD_DEADLINE_S, lambda i: _late(plan.loads[i], LOAD_DEADLINE_S))
        outcomes = [_outcome(w, r, now) for w, r in zip(plan.loads, done, strict=True)]
        outcomes += [Outcome(p, self._patch(namespace, p, versions.get(p.pod, "")), now) for p in plan.patches]
        unloads = [lambda w=w: repo.unload(w.address, w.pod, w.model) for w in plan.unloads]
        gone = _bounded(self.pool, unloads, INDEX_DEADLINE_S, lambda i: _late(plan.unloads[i], INDEX_DEADLINE_S))
        return outcomes + [_outcome(w, r, now) for w, r in zip(plan.unloads, gone, strict=True)]

    def _patch(self, namespace: str, patch: PodPatch, version: str) -> str | None:
        """Apply one pod's label and annotation changes: None, or why not (the next tick decides again)."""
        if not version:
            return f"pod {patch.pod}: no resourceVersion in the cache: not patched"
        meta = patch.body["metadata"]
        try:
            self.kube.patch_pod_metadata(patch.pod, namespace, version, meta["labels"], meta["annotations"])
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("%s: %s (decided again next tick)", self.name, err)
            return str(err)
        return None

    def _post(self, body: Mapping[str, Any], e: PoolEvent) -> None:
        meta = body["metadata"]
        self.kube.post_event(body, e.type, e.reason, e.message)
        log_event(meta["namespace"], meta["name"], e.type, e.reason, e.message)


def _late(write: Load | Unload, deadline_s: float) -> TritonCallError:
    model = write.model
    return TritonCallError(write.pod, model, type(write).__name__.lower(), None, f"no answer within {deadline_s:.0f} s")


def _outcome(write: Load | Unload, result: TritonCallError | None, now: float) -> Outcome:
    if result is None:
        return Outcome(write, None, now)
    if result.status is None:
        log.warning("pool-models: %s (its outcome is read from the index next tick)", result)
    return Outcome(write, str(result), now, answered=result.status is not None)
