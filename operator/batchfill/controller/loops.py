"""The operator's two loops: daemon threads that make one pass over every BatchedModel it serves per interval.

Threads of the operator rather than kopf timers: kopf puts a finalizer on every object that has a timer or a
daemon, and a BatchedModel would then hang in deletion whenever the operator is not running (uninstalled first,
crash-looping); deletion stays pure garbage collection. Events are posted through the API (kopf.event works
only inside handlers).

A pass lists the BatchedModels once, checks that the children's informer caches are current, and runs one tick
per model: :class:`ScalingLoop` the tick of :mod:`batchfill.controller.scaling`, :class:`ProfilingLoop` that of
:mod:`batchfill.controller.profiling`. All a loop keeps of a model between passes is that tick's memory
(:class:`~batchfill.controller.scaling.ScalingMemory`, :class:`~batchfill.controller.profiling.ProfilingMemory`),
replaced by the one the tick returns and dropped when the model is gone.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, ClassVar, Generic, TypeVar

from batchfill.adapters import memory, operator_metrics
from batchfill.adapters.informer import CachedView
from batchfill.adapters.kube import Kube, KubePermanentError, KubeTemporaryError
from batchfill.adapters.metrics import SignalTarget
from batchfill.adapters.pod_stats import read_pod_batch_stats
from batchfill.adapters.signal_hub import SignalHub
from batchfill.api.reasons import EventReason
from batchfill.controller.profiling import (
    PROFILE_READ_TIMEOUT_S,
    ProfilingMemory,
    ReadStats,
    act_adoption,
    act_measurement,
    decide_adoption,
    gather_profile,
    measure_profile,
)
from batchfill.controller.reconcile import log_event, reapply
from batchfill.controller.scaling import ScalingMemory, act_scale, decide_scale, gather_scale
from batchfill.controller.settings import OperatorSettings
from batchfill.controller.shared_status import served_shared
from batchfill.policy.conditions import GenerationLag, generation_lag, generation_unhandled

log = logging.getLogger("batchfill")

MemoryT = TypeVar("MemoryT")


def watched(settings: OperatorSettings, namespace: str) -> bool:
    """Whether ``namespace`` matches the operator's namespace patterns (kopf's glob and ``!`` exclusion)."""
    patterns = settings.namespaces
    if not patterns:
        return True
    included = any(fnmatch.fnmatchcase(namespace, p) for p in patterns if not p.startswith("!"))
    excluded = any(fnmatch.fnmatchcase(namespace, p[1:]) for p in patterns if p.startswith("!"))
    return included and not excluded


def expected_target(body: Mapping[str, Any]) -> SignalTarget | None:
    """``body`` as a pass names it to the signal hub before its tick (``SignalHub.new_pass``; pure): its namespace
    and Triton model name, the stored plan's max_batch_size (1 before there is one), no Ready pods. None for a model
    whose spec has no model name (it is rejected, and its tick asks for nothing)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    model = (spec.get("model") or {}).get("name") if isinstance(spec.get("model"), Mapping) else None
    if not isinstance(model, str) or not model:
        return None
    stored = ((body.get("status") or {}).get("plan") or {}).get("maxBatchSize")
    mbs = stored if isinstance(stored, int) and not isinstance(stored, bool) and stored >= 1 else 1
    return SignalTarget(str(meta["namespace"]), str(meta["name"]), model, mbs)


class PeriodicLoop(Generic[MemoryT]):
    """A daemon thread that makes one pass over every BatchedModel the operator serves every ``interval_s``.

    Args:
        kube: the operator's API client (lists, object reads, every write).
        view: the children's reads, answered from the informer caches.
        settings: the operator's settings (namespaces).
        interval_s: seconds from the start of one pass to the next.

    Subclasses define ``_one(body, now)``: one model's tick (its API errors are its own to handle). A bug in one
    model's tick is logged and the pass goes on; a bug in a pass is logged and the next pass runs anyway.
    """

    name = "loop"
    #: What a pass reads of every model's children (their caches must be current for the pass to run).
    kinds: ClassVar[tuple[str, ...]] = ("pods", "deployments")

    def __init__(self, kube: Kube, view: CachedView, settings: OperatorSettings, interval_s: float) -> None:
        self.kube, self.view, self.settings, self.interval_s = kube, view, settings, interval_s
        self.memory: dict[str, MemoryT] = {}  # model uid -> what its last tick left for the next one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"batchfill-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        self._stop.wait(min(5.0, self.interval_s))
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick(time.time())
            except Exception:  # a bug in one pass must not end the loop for good
                log.exception("%s pass failed", self.name)
            operator_metrics.observe_pass(self.name, time.monotonic() - started)
            memory.release_free_memory()  # the pass's garbage: back to the OS, not kept in a thread's arena
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def tick(self, now: float) -> None:
        """One pass over every BatchedModel the operator serves (``now``: seconds since the epoch)."""
        try:
            models = self.kube.list_batched_models(self.settings.exact_namespaces)
            self.view.check(self.kinds)  # the children's caches are listed and their watches current
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("%s pass postponed: %s", self.name, err)
            return
        self._begin_pass(models)
        seen = set()
        for body in models:
            meta = body["metadata"]
            if meta.get("deletionTimestamp") or not watched(self.settings, meta["namespace"]):
                continue
            seen.add(meta["uid"])
            try:
                self._one(body, now)
            except (KubeTemporaryError, KubePermanentError):
                raise
            except Exception:  # one model's bad data (a hand-edited status) must not stop the pass for the others
                log.exception("%s of %s/%s failed", self.name, meta["namespace"], meta["name"])
        for uid in set(self.memory) - seen:  # deleted, or no longer served
            del self.memory[uid]
        self._forget(seen)

    def _begin_pass(self, models: list[dict[str, Any]]) -> None:
        """Called once at the start of each pass with the models listed (deleted and unwatched ones included)."""

    def _forget(self, seen: set[str]) -> None:
        """Called at the end of each pass with the uids of the models it served: drop what is kept of the others."""

    def _one(self, body: dict[str, Any], now: float) -> None:
        raise NotImplementedError


class ScalingLoop(PeriodicLoop[ScalingMemory]):
    """Every ``settings.reconcile_interval_s``: one list of BatchedModels, one Prometheus query set, one scaling
    tick per model (:mod:`batchfill.controller.scaling`).

    Status is written with the object's resourceVersion as a precondition, so a tick computed from an older state
    never overwrites what a create/update handler wrote since (a 409 skips the model until the next tick).

    A generation that status has not observed for ``settings.unhandled_generation_s`` (kopf's watch stalled, or its
    handler is stuck: a healthy handler observes it within seconds) is reconciled here instead of the tick, with
    one ``GenerationUnhandled`` Event per generation (:func:`batchfill.policy.conditions.generation_unhandled`),
    unless other generations of the same watch were observed within the bound (a busy queue, not a stall).
    """

    name = "scaling"

    def __init__(self, kube: Kube, view: CachedView, hub: SignalHub, settings: OperatorSettings) -> None:
        super().__init__(kube, view, settings, settings.reconcile_interval_s)
        self.hub = hub
        self.lags: dict[str, GenerationLag] = {}  # model uid -> its generation that status does not observe yet
        # watch stream (a namespace, or "" for kopf's cluster-wide watch) -> when a lag of it last ended
        self.progress: dict[str, float] = {}

    def _begin_pass(self, models: list[dict[str, Any]]) -> None:
        # every model this pass may ask for: the pass's one query set covers those whose pods turned Ready since
        # their last tick too (adapters/signal_hub.py says why); a shared model's copies are the pool loop's
        self.hub.new_pass(
            t
            for b in models
            if not b["metadata"].get("deletionTimestamp")
            and watched(self.settings, b["metadata"]["namespace"])
            and not served_shared(b)
            and (t := expected_target(b)) is not None
        )

    def _forget(self, seen: set[str]) -> None:
        for uid in set(self.lags) - seen:
            del self.lags[uid]

    def _one(self, body: dict[str, Any], now: float) -> None:
        meta = body["metadata"]
        uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
        if self._reconciled_unhandled(body, now) or served_shared(body):
            return  # a shared model's copies are the pool loop's (controller/pool_loop.py)
        memory = self.memory.get(uid, ScalingMemory())
        started = time.monotonic()
        try:
            inputs = gather_scale(self.view, self.hub.signals, body, memory)
            plan = decide_scale(inputs, memory, now=now, interval_s=self.interval_s)
            outcome = act_scale(self.kube, body, plan)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("scaling tick of %s/%s postponed: %s", ns, name, err)
            return  # the memory stays: the next tick decides from the same history
        finally:
            operator_metrics.RECONCILE.labels("scale").observe(time.monotonic() - started)
        self.memory[uid] = plan.memory_after(outcome)

    def _reconciled_unhandled(self, body: dict[str, Any], now: float) -> bool:
        """Reconcile ``body`` when its generation has waited for a handler past the bound; whether it did."""
        meta = body["metadata"]
        uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
        observed = (body.get("status") or {}).get("observedGeneration")
        lag = generation_lag(self.lags.get(uid), meta.get("generation"), observed, now)
        stream = ns if self.settings.namespaces else ""
        if lag is None:
            if self.lags.pop(uid, None) is not None:
                self.progress[stream] = now
            return False
        self.lags[uid] = lag
        if not generation_unhandled(lag, now, self.settings.unhandled_generation_s, self.progress.get(stream)):
            return False
        try:
            if not lag.reconciled:
                message = (
                    f"generation {lag.generation} was not handled for {now - lag.since:.0f} s (observed: "
                    f"{observed}; a stalled watch or a stuck handler): the scaling loop reconciles it"
                )
                self.kube.post_event(body, "Warning", EventReason.GENERATION_UNHANDLED, message)
                log_event(ns, name, "Warning", EventReason.GENERATION_UNHANDLED, message)
                self.lags[uid] = replace(lag, reconciled=True)
            reapply(self.kube, name, ns, now=now)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("reconcile of the unhandled generation of %s/%s postponed: %s", ns, name, err)
        return True


class ProfilingLoop(PeriodicLoop[ProfilingMemory]):
    """Every ``settings.profile_interval_s``: Triton's batch statistics of every BatchedModel's Ready pods, the
    fitted profile, and a re-plan when the profile decision adopts it (:mod:`batchfill.controller.profiling`).

    A thread of its own, so slow or unreachable pods never delay a scaling decision; pod reads run in parallel.
    ``read_stats`` reads one pod (default: :func:`batchfill.adapters.pod_stats.read_pod_batch_stats` with
    :data:`~batchfill.controller.profiling.PROFILE_READ_TIMEOUT_S`).
    """

    name = "profiling"
    kinds = ("pods",)

    def __init__(
        self, kube: Kube, view: CachedView, settings: OperatorSettings, read_stats: ReadStats | None = None
    ) -> None:
        super().__init__(kube, view, settings, settings.profile_interval_s)
        self.read_stats: ReadStats = read_stats or functools.partial(
            read_pod_batch_stats, timeout_s=PROFILE_READ_TIMEOUT_S
        )
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="batchfill-stats")

    def stop(self) -> None:
        super().stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, body: dict[str, Any], now: float) -> None:
        meta = body["metadata"]
        if served_shared(body):
            return  # no pods of its own to read: measuring on shared pods is not done yet
        try:
            self._profile(body, now)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("profiling of %s/%s postponed: %s", meta["namespace"], meta["name"], err)

    def _profile(self, body: dict[str, Any], now: float) -> None:
        """Round 1 (measure) and, when it changes status, round 2 (adopt) of the model's profiling tick."""
        meta = body["metadata"]
        port = self.settings.triton_http_port
        inputs = gather_profile(self.view, body, self.read_stats, port=port, pool=self.pool)
        measured = measure_profile(body, inputs, self.memory.get(meta["uid"], ProfilingMemory()), now=now, port=port)
        self.memory[meta["uid"]] = measured.memory  # kept whatever round 2 meets: the reads happened
        act_measurement(self.kube, body, measured)
        if not measured.tick.status:
            return
        stored = self.kube.get_batched_model(meta["name"], meta["namespace"])
        act_adoption(self.kube, decide_adoption(body, measured, stored, now=now))
