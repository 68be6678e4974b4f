"""Which models to load, route, drain and unload on a GPUPool's pods (pure; time is passed in).

One tick: gather (the pool's pods from the cache, each Ready pod's repository index through
:mod:`batchfill.adapters.triton_repository`) -> :func:`decide_pool_models` (this module: every write) -> act (the
loads, the pod patches, the unloads; their outcomes go through :func:`remember` into the next tick's memory).

Per pod and model, from what the pod shows (Triton's index, the pod's ``models.batchfill.io/<model>`` label and the
annotation of the same key, which holds the hash of the config the label was set for):

* wanted here, not loaded: load (at most once per :data:`LOAD_RETRY_S` for a config whose load failed);
* wanted here, READY after our load of the wanted config: label it (the Service now routes there);
* wanted here, READY with another or an unknown config (changed plan, operator restarted after a load): load again.
  Triton keeps the loaded version serving until the new one is ready, and keeps it if the new one fails
  (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_management.md);
* labelled where it cannot serve (not loaded): unlabel at once, it only fails requests there;
* not wanted here, labelled: unlabel, except on the model's last labelled READY pod while it is wanted at all;
* not wanted here, loaded, unlabelled: unload once it has been seen so for :data:`DRAIN_S`, unless no pod serves
  the model while it is wanted (that copy is all there is), or a stale label is still on the pod.

A move is therefore: load on the new pod -> READY -> label -> (next tick) unlabel the old -> drain -> unload. A pod
that is not Ready, has no IP, or whose index could not be read is never acted on, and its labels count as no
copy: unknown is not absent. The memory is a cache, not the truth: an operator that restarts with none starts each
drain again and reloads a READY, unlabelled model once before labelling it; no state leaves a wanted model unrouted
or an unwanted one loaded.

A model leaving the pool for dedicated replicas stays wanted with ``pods`` empty until its own replicas are Ready
(its last pool copy keeps its label meanwhile); then the caller drops it and its last copy drains and unloads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from batchfill.adapters.triton_repository import IndexEntry, ModelState, TritonCallError
from batchfill.api.pool import GPUPoolSpec
from batchfill.api.reasons import PoolModelReason as Why
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.status import PlanStatus
from batchfill.render.kube import HTTP_PORT, PRESTOP_DELAY_S
from batchfill.render.model_config import InstanceKind, config_hash
from batchfill.render.pool import (
    LOADED,
    LOADED_LABEL_PREFIX,
    POD_DELETION_COST,
    TritonRequest,
    load_request,
    loaded_label,
)

#: Seconds a model stays loaded on a pod after its label was seen off, before the unload. The label's removal takes
#: the pod out of the model's EndpointSlice, but kube-proxy, load balancers and client-side balancers see that only
#: later (https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/ ; the same propagation that
#: PRESTOP_DELAY_S covers for a deleted pod, render/kube.py); a request sent meanwhile arrives after the unload and
#: fails. Requests already at the pod are not the concern: Triton 2.51 answers them after an unload
#: (tests/component/test_pool_models_real.py). So PRESTOP_DELAY_S, plus 5 s for a request sent at its end.
DRAIN_S = PRESTOP_DELAY_S + 5.0
#: Seconds before a load of the same config that failed on the same pod is tried again (a Warning each time): the
#: same files and config fail the same way, and one load a minute bounds what a broken model costs the pod.
LOAD_RETRY_S = 60.0
Key = tuple[str, str]  # (pod name, Triton model name)


@dataclass(frozen=True)
class PoolPod:
    """A pool pod as gathered: ``address`` its Triton HTTP ``ip:port`` ("" without an IP); ``index`` its repository
    index by Triton model name, None when it could not be read."""

    name: str
    address: str
    ready: bool
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    index: Mapping[str, IndexEntry] | None

    @property
    def known(self) -> bool:
        """Whether this tick may act on the pod: Ready, reachable, and its index read."""
        return self.ready and bool(self.address) and self.index is not None


def pool_pod(pod: Mapping[str, Any], index: Mapping[str, IndexEntry] | TritonCallError | None) -> PoolPod:
    """A :class:`PoolPod` from a pod object as the API server returns it and its index (an error: unread)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = not meta.get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    ip = str(status.get("podIP") or "")
    return PoolPod(
        name=str(meta.get("name") or ""),
        address=f"{ip}:{HTTP_PORT}" if ip else "",
        ready=bool(ready),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        index=None if index is None or isinstance(index, TritonCallError) else index,
    )


@dataclass(frozen=True)
class WantedModel:
    """A model the pool serves: BatchedModel ``name`` (its label), Triton ``model`` (spec.model.name), the load
    ``request`` (:func:`batchfill.render.pool.load_request`), its config's hash, and the pool pods to serve it on."""

    name: str
    model: str
    request: TritonRequest
    config_hash: str
    pods: frozenset[str]


def wanted_model(
    name: str,
    spec: BatchedModelSpec,
    plan: PlanStatus,
    pool: GPUPoolSpec,
    pods: frozenset[str],
    *,
    instance_kind: InstanceKind | None = None,
) -> WantedModel:
    """BatchedModel ``name`` served with ``plan`` on ``pods`` of ``pool``: its load request and the hash of the
    request's config (a changed plan is a changed hash, so the model is loaded again).

    Raises:
        ValueError: as :func:`batchfill.render.pool.load_request`.
    """
    request = load_request(spec, plan, pool, instance_kind=instance_kind)
    digest = config_hash(str(request.body["parameters"]["config"]))
    return WantedModel(name, spec.model.name, request, digest, pods)


@dataclass(frozen=True)
class LoadFailure:
    """The last failed load of a (pod, model): the config's hash, when (epoch s), and the error's line."""

    config_hash: str
    at: float
    message: str


@dataclass(frozen=True)
class PoolModelsMemory:
    """What earlier ticks started, by (pod, Triton model): ``loaded`` the config hash of a load that succeeded and is
    not labelled yet; ``failed`` the last failed load; ``draining`` when the model was first seen loaded, unwanted
    and unlabelled there (epoch s); ``unload_failed`` the last unload error (one Warning per new message)."""

    loaded: Mapping[Key, str] = field(default_factory=dict)
    failed: Mapping[Key, LoadFailure] = field(default_factory=dict)
    draining: Mapping[Key, float] = field(default_factory=dict)
    unload_failed: Mapping[Key, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Load:
    """Execute ``request`` on ``pod`` (Triton at ``address``) for BatchedModel ``name``; ``replaces``: the model is
    READY there already (another or an unknown config), so the index cannot show how an unanswered load ended."""

    pod: str
    address: str
    name: str
    model: str
    request: TritonRequest
    config_hash: str
    replaces: bool = False


@dataclass(frozen=True)
class Unload:
    """Unload Triton model ``model`` from ``pod``."""

    pod: str
    address: str
    model: str


@dataclass(frozen=True)
class Route:
    """One label of a :class:`PodPatch`: ``key`` set for ``config_hash``, or removed (``config_hash`` None);
    ``name``/``model`` are "" for a stale label of a model no longer wanted."""

    key: str
    name: str
    model: str
    config_hash: str | None


@dataclass(frozen=True)
class PodPatch:
    """Label (and annotation) changes of one pod, applied as one merge patch (:attr:`body`)."""

    pod: str
    routes: tuple[Route, ...]
    serving: int | None = None  # models the pod is labelled for after the patch: its pod-deletion-cost

    @property
    def body(self) -> dict[str, Any]:
        """``{"metadata": {"labels": ..., "annotations": ...}}``: None deletes a key (JSON merge patch).

        With ``serving``, the annotation ``controller.kubernetes.io/pod-deletion-cost`` says it: when the pool's
        Deployment shrinks, its ReplicaSet deletes the pods of lowest cost first
        (https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#pod-deletion-cost), so a pod that
        serves no model goes before one that does; 0 removes it (the default cost).
        """
        labels = {r.key: LOADED if r.config_hash else None for r in self.routes}
        annotations: dict[str, str | None] = {r.key: r.config_hash for r in self.routes}
        if self.serving is not None:
            annotations[POD_DELETION_COST] = str(self.serving) if self.serving else None
        return {"metadata": {"labels": labels, "annotations": annotations}}


@dataclass(frozen=True)
class Hold:
    """Nothing done for ``model`` ("" for the whole pod) on ``pod`` this tick, and why."""

    pod: str
    model: str
    reason: Why
    message: str


@dataclass(frozen=True)
class PoolModelsPlan:
    """Every write of one tick, in the order to act: loads, pod patches, unloads; the holds; the memory to keep
    (before the outcomes: :func:`remember`)."""

    loads: tuple[Load, ...]
    patches: tuple[PodPatch, ...]
    unloads: tuple[Unload, ...]
    holds: tuple[Hold, ...]
    memory: PoolModelsMemory


@dataclass
class _Tick:
    """The decisions being built (mutable within one tick only)."""

    now: float
    drain_s: float
    retry_s: float
    memory: PoolModelsMemory
    serving: dict[str, set[str]]
    loads: list[Load] = field(default_factory=list)
    routes: dict[str, list[Route]] = field(default_factory=dict)
    unloads: list[Unload] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    loaded: dict[Key, str] = field(default_factory=dict)
    draining: dict[Key, float] = field(default_factory=dict)

    def hold(self, pod: str, model: str, reason: Why, message: str) -> None:
        self.holds.append(Hold(pod, model, reason, message))

    def route(self, pod: str, route: Route) -> None:
        self.routes.setdefault(pod, []).append(route)


def _by_model(wanted: Sequence[WantedModel]) -> dict[str, WantedModel]:
    """``wanted`` by Triton model name.

    Raises:
        ValueError: two wanted models share a BatchedModel name or a Triton model name (one pod serves one model
            of a name).
    """
    out = {w.model: w for w in wanted}
    if len(out) != len(wanted) or len({w.name for w in wanted}) != len(wanted):
        raise ValueError(f"wanted models must have distinct names: {sorted((w.name, w.model) for w in wanted)}")
    return out


def _serving(pods: Sequence[PoolPod], by_model: Mapping[str, WantedModel]) -> dict[str, set[str]]:
    """Triton model -> the known pods where it is READY and labelled (unknown pods count as no copy)."""
    out: dict[str, set[str]] = {m: set() for m in by_model}
    for pod in pods:
        if not pod.known or pod.index is None:
            continue
        for m, w in by_model.items():
            entry = pod.index.get(m)
            if entry is not None and entry.state == ModelState.READY and loaded_label(w.name) in pod.labels:
                out[m].add(pod.name)
    return out


def _load(t: _Tick, pod: PoolPod, w: WantedModel, state: ModelState) -> None:
    failure = t.memory.failed.get((pod.name, w.model))
    if failure is not None and failure.config_hash == w.config_hash and t.now - failure.at < t.retry_s:
        wait = t.retry_s - (t.now - failure.at)
        t.hold(pod.name, w.model, Why.HOLD_LOAD_BACKOFF, f"load failed: {failure.message}; again in {wait:.0f} s")
        return
    replaces = state == ModelState.READY
    t.loads.append(Load(pod.name, pod.address, w.name, w.model, w.request, w.config_hash, replaces))


def _wanted_here(t: _Tick, pod: PoolPod, w: WantedModel, state: ModelState) -> None:
    key = loaded_label(w.name)
    labelled, on_pod = key in pod.labels, pod.annotations.get(key)
    if state in (ModelState.LOADING, ModelState.UNLOADING):
        t.hold(pod.name, w.model, Why.HOLD_IN_TRANSITION, f"Triton reports {state}")
        if (pod.name, w.model) in t.memory.loaded:
            t.loaded[pod.name, w.model] = t.memory.loaded[pod.name, w.model]
        return
    if state == ModelState.READY:
        if labelled and on_pod == w.config_hash:
            return  # served here with the wanted config
        if t.memory.loaded.get((pod.name, w.model)) == w.config_hash:
            t.loaded[pod.name, w.model] = w.config_hash  # until the label is seen
            t.route(pod.name, Route(key, w.name, w.model, w.config_hash))
            return
    elif labelled:  # labelled where it is not loaded: every request routed there fails
        t.route(pod.name, Route(key, w.name, w.model, None))
        t.serving[w.model].discard(pod.name)
    _load(t, pod, w, state)


def _unwanted_here(t: _Tick, pod: PoolPod, m: str, w: WantedModel | None, state: ModelState, stale: bool) -> None:
    key = loaded_label(w.name) if w is not None else ""
    if w is not None and key in pod.labels:
        if state == ModelState.READY and not t.serving[m] - {pod.name}:
            t.hold(pod.name, m, Why.HOLD_LAST_COPY, "the model's last labelled READY pod while it is wanted")
            return
        t.route(pod.name, Route(key, w.name, m, None))
        t.serving[m].discard(pod.name)
        return
    if state == ModelState.LOADING:
        t.hold(pod.name, m, Why.HOLD_IN_TRANSITION, f"Triton reports {state}")
        return
    if state != ModelState.READY:
        return  # unloading or unloaded: nothing left to do
    if stale:
        t.hold(pod.name, m, Why.HOLD_STALE_LABEL, "a label of a model no longer wanted is still on the pod")
        return
    since = t.draining[pod.name, m] = t.memory.draining.get((pod.name, m), t.now)
    if t.now - since < t.drain_s:
        t.hold(pod.name, m, Why.HOLD_DRAINING, f"unlabelled {t.now - since:.0f} s of {t.drain_s:.0f} s")
    elif w is not None and not t.serving[m]:
        t.hold(pod.name, m, Why.HOLD_NO_OTHER_COPY, "no pod serves the model: this copy stays loaded")
    else:
        t.unloads.append(Unload(pod.name, pod.address, m))


def _decide_pod(t: _Tick, pod: PoolPod, by_model: Mapping[str, WantedModel]) -> None:
    index = pod.index or {}
    keys = {loaded_label(w.name) for w in by_model.values()}
    stale = sorted(k for k in pod.labels if k.startswith(LOADED_LABEL_PREFIX) and k not in keys)
    for k in stale:
        t.route(pod.name, Route(k, "", "", None))
    present = {m for m, e in index.items() if e.state != ModelState.UNAVAILABLE}
    for m in sorted(set(by_model) | present):
        w = by_model.get(m)
        state = index[m].state if m in index else ModelState.UNAVAILABLE
        if w is not None and pod.name in w.pods:
            _wanted_here(t, pod, w, state)
        else:
            _unwanted_here(t, pod, m, w, state, bool(stale))


def _kept(memory: Mapping[Key, Any], unknown: set[str], fresh: Mapping[Key, Any]) -> dict[Key, Any]:
    """``fresh`` plus the entries of pods not acted on this tick (unknown pods keep what they had)."""
    return {**{k: v for k, v in memory.items() if k[0] in unknown}, **fresh}


def decide_pool_models(
    pods: Sequence[PoolPod],
    wanted: Sequence[WantedModel],
    memory: PoolModelsMemory,
    now: float,
    *,
    drain_s: float = DRAIN_S,
    retry_s: float = LOAD_RETRY_S,
) -> PoolModelsPlan:
    """Every load, label change and unload of one tick on a pool's ``pods`` (see the module docstring).

    ``now`` in epoch seconds; ``drain_s`` and ``retry_s`` in seconds. Memory of pods that are gone is dropped.

    Raises:
        ValueError: two wanted models share a name (:func:`_by_model`).
    """
    by_model = _by_model(wanted)
    t = _Tick(now, drain_s, retry_s, memory, _serving(pods, by_model))
    unknown: set[str] = set()
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.known:
            _decide_pod(t, pod, by_model)
        else:
            unknown.add(pod.name)
            why = "not Ready" if not pod.ready else "no IP" if not pod.address else "repository index unreadable"
            t.hold(pod.name, "", Why.HOLD_POD_UNKNOWN, why)
    present = {p.name for p in pods}
    kept = PoolModelsMemory(
        loaded=_kept(memory.loaded, unknown, t.loaded),
        failed={k: v for k, v in memory.failed.items() if k[0] in present and now - v.at < retry_s},
        draining=_kept(memory.draining, unknown, t.draining),
        unload_failed={k: v for k, v in memory.unload_failed.items() if k in t.draining or k[0] in unknown},
    )
    labels = {p.name: {k for k in p.labels if k.startswith(LOADED_LABEL_PREFIX)} for p in pods}
    patches = tuple(PodPatch(p, tuple(r), _serving_after(labels.get(p, set()), r)) for p, r in sorted(t.routes.items()))
    return PoolModelsPlan(tuple(t.loads), patches, tuple(t.unloads), tuple(t.holds), kept)


def _serving_after(labelled: set[str], routes: Sequence[Route]) -> int:
    """How many models a pod is labelled for once ``routes`` are patched onto its ``labelled`` label keys."""
    on = {r.key for r in routes if r.config_hash}
    off = {r.key for r in routes if not r.config_hash}
    return len((labelled | on) - off)


@dataclass(frozen=True)
class Outcome:
    """What one write of a plan did: ``error`` None when it succeeded, else its one-line error; ``at`` epoch s.
    ``answered`` False: no answer came (refused, timed out), so the write may still be under way: a load that timed
    out goes on in Triton, whose index says ``LOADING`` until it ends."""

    write: Load | PodPatch | Unload
    error: str | None
    at: float
    answered: bool = True


@dataclass(frozen=True)
class PoolEvent:
    """An Event to post: ``type`` Normal or Warning, about BatchedModel ``name`` ("" when not known) on ``pod``."""

    type: str
    reason: Why
    name: str
    pod: str
    message: str


def _load_outcome(mem: PoolModelsMemory, o: Outcome, w: Load) -> tuple[PoolModelsMemory, PoolEvent | None]:
    key = (w.pod, w.model)
    failed = {k: v for k, v in mem.failed.items() if k != key}
    if o.error is not None and not o.answered and not w.replaces:
        # not known to have failed: if Triton finishes it READY, it is this config (labelled then, no reload); if it
        # ends not loaded, the index says so and the next tick loads again, without a backoff or a Warning. (A load
        # over a READY copy is a failure when unanswered: READY then may be the old version, kept by Triton.)
        return replace(mem, loaded={**mem.loaded, key: w.config_hash}, failed=failed), None
    if o.error is None:
        loaded = {**mem.loaded, key: w.config_hash}
        event = PoolEvent("Normal", Why.MODEL_LOADED, w.name, w.pod, f"loaded on pod {w.pod} (config {w.config_hash})")
        return replace(mem, loaded=loaded, failed=failed), event
    failed[key] = LoadFailure(w.config_hash, o.at, o.error)
    loaded = {k: v for k, v in mem.loaded.items() if k != key}
    event = PoolEvent("Warning", Why.MODEL_LOAD_FAILED, w.name, w.pod, o.error)
    return replace(mem, loaded=loaded, failed=failed), event


def _unload_outcome(mem: PoolModelsMemory, o: Outcome, w: Unload) -> tuple[PoolModelsMemory, PoolEvent | None]:
    key = (w.pod, w.model)
    if o.error is None:
        gone = {k: v for k, v in mem.draining.items() if k != key}
        failures = {k: v for k, v in mem.unload_failed.items() if k != key}
        event = PoolEvent("Normal", Why.MODEL_UNLOADED, "", w.pod, f"{w.model} unloaded from pod {w.pod}")
        return replace(mem, draining=gone, unload_failed=failures), event
    if mem.unload_failed.get(key) == o.error:
        return mem, None  # the same failure as last tick: no second Warning
    event = PoolEvent("Warning", Why.MODEL_UNLOAD_FAILED, "", w.pod, o.error)
    return replace(mem, unload_failed={**mem.unload_failed, key: o.error}), event


def _patch_events(o: Outcome, w: PodPatch) -> list[PoolEvent]:
    if o.error is not None:
        return []  # the next tick sees the labels unchanged and decides again
    out = []
    for r in w.routes:
        if r.config_hash:
            out.append(PoolEvent("Normal", Why.MODEL_ROUTED, r.name, w.pod, f"pod {w.pod} serves {r.model}"))
        else:
            what = r.model or f"label {r.key}"
            out.append(PoolEvent("Normal", Why.MODEL_DRAINING, r.name, w.pod, f"pod {w.pod} no longer routes {what}"))
    return out


def remember(memory: PoolModelsMemory, outcomes: Sequence[Outcome]) -> tuple[PoolModelsMemory, list[PoolEvent]]:
    """The memory for the next tick after the act step's ``outcomes`` (of ``plan.memory``), and the Events."""
    events: list[PoolEvent] = []
    for o in outcomes:
        if isinstance(o.write, Load):
            memory, maybe = _load_outcome(memory, o, o.write)
            events.extend([maybe] if maybe else [])
        elif isinstance(o.write, Unload):
            memory, maybe = _unload_outcome(memory, o, o.write)
            events.extend([maybe] if maybe else [])
        else:
            events.extend(_patch_events(o, o.write))
    return memory, events
