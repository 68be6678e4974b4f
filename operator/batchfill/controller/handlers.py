"""kopf handlers: decorators and error translation only; the work is in reconcile.py.

* create / update / resume run the same reconcile. kopf leaves ``status`` out of its diff base, so the
  operator's own status writes never trigger them (CASES C16); handler progress and the diff base live in
  ``batchfill.io/`` annotations, not in ``status``.
* invalid or infeasible specs -> conditions + one Warning event + ``kopf.PermanentError`` (no retry loop);
  API conflicts, throttling and outages -> ``kopf.TemporaryError`` with a backoff (CASES C18). No handler is
  declared with ``retries=0`` (which kopf reads as "zero attempts").
* delete: nothing to do: every child has an ownerReference, so the API server garbage-collects them. The
  handler is ``optional`` and scaling runs in :class:`ScalingLoop`, not in a kopf timer, so kopf adds no
  finalizer: a BatchedModel deletes cleanly even when the operator is not running.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from batchfill.adapters import memory, operator_metrics
from batchfill.adapters.informer import CachedView, ChildCaches
from batchfill.adapters.kube import Kube, KubePermanentError, KubeTemporaryError, RateLimiter
from batchfill.adapters.metrics import PrometheusSignals
from batchfill.adapters.pod_stats import PodBatchStats, PodStatsError, read_pod_batch_stats
from batchfill.adapters.signal_hub import SignalHub
from batchfill.api.errors import Problem, SpecError
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.controller.reconcile import (
    SpecRejectedError,
    changed_fields,
    profile_tick,
    ready_pod_ips,
    reconcile,
    rejection_status,
    scale_tick,
)
from batchfill.controller.settings import OperatorSettings
from batchfill.policy.profile_fit import BatchTotals
from batchfill.render.kube import CHILDREN_SELECTOR, Owner, selector_labels

log = logging.getLogger("batchfill")
ANNOTATION_PREFIX = "batchfill.io"


def _kube(memo: Any) -> Kube:
    kube = getattr(memo, "kube", None)
    if kube is None:
        kube = memo.kube = Kube.from_config()
    return kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours: OperatorSettings = memo.get("settings") or OperatorSettings.from_env()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    settings.posting.level = logging.WARNING  # only warnings and errors become Events; decisions post their own
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    settings.execution.max_workers = ours.max_workers
    if ours.exact_namespaces:
        # exact namespaces: nothing to discover, so no cluster-wide namespace/CRD scans, which the namespaced
        # RBAC of the chart does not allow (kopf would retry them with errors before falling back)
        settings.scanning.disabled = True
    settings.networking.request_timeout = ours.request_timeout_s
    memo.kube = Kube.from_config(limiter=RateLimiter(ours.api_qps, ours.api_burst))
    # shared by reference with every per-object memo (kopf copies the operator memo shallowly per object)
    memo.signal_hub = SignalHub(
        PrometheusSignals(ours.prometheus_url, window_s=ours.signal_window_s, timeout_s=ours.prometheus_timeout_s),
        max_age_s=ours.reconcile_interval_s,  # the scaling loop starts each pass with a fresh query set
    )
    operator_metrics.serve(ours.metrics_port)
    # the loops read every model's Deployment and pods each pass: from watch-backed caches, not a LIST per pass
    scopes = len(ours.exact_namespaces) or 1
    memo.child_caches = ChildCaches(
        memo.kube.watch_client(2 * scopes + 2), CHILDREN_SELECTOR, ours.exact_namespaces,
        max_stale_s=2 * ours.reconcile_interval_s,
    ).start()  # fmt: skip
    memo.scaling_loop = ScalingLoop(memo.kube, memo.signal_hub, ours, memo.child_caches)
    memo.scaling_loop.start()
    memo.profiling_loop = ProfilingLoop(memo.kube, ours, memo.child_caches)
    memo.profiling_loop.start()


def _log_event(namespace: str, name: str, type_: str, reason: str, message: str) -> None:
    log.log(logging.WARNING if type_ == "Warning" else logging.INFO, "%s/%s %s: %s", namespace, name, reason, message)


def _emitter(body: Any, kube: Kube) -> Any:
    # through the operator's own (rate-limited) client, not kopf.event: kopf's requests have no client-side limit
    def emit(type_: str, reason: str, message: str) -> None:
        kube.post_event(body, type_, reason, message)
        _log_event(body["metadata"]["namespace"], body["metadata"]["name"], type_, reason, message)

    return emit


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile_handler(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int, **_: Any) -> None:
    kube = _kube(memo)
    with operator_metrics.RECONCILE.labels("reconcile").time():
        _reconcile(body, patch, kube, retry)


def _reconcile(body: kopf.Body, patch: kopf.Patch, kube: Kube, retry: int) -> None:
    emit = _emitter(body, kube)
    try:
        changes = reconcile(body, kube, now=time.time(), emit=emit)
    except SpecRejectedError as rejected:
        for key, value in rejected.status.items():
            patch.status[key] = value
        raise kopf.PermanentError(str(rejected)) from None
    except KubeTemporaryError as err:
        raise kopf.TemporaryError(str(err), delay=err.delay_s * min(2**retry, 12)) from None
    except KubePermanentError as err:
        emit("Warning", "ApplyRejected", str(err))
        # a condition too, or `kubectl get bm` would show the previous generation's plan as if it were served
        problem = Problem("spec", f"the API server rejected a child object built from it: {err}")
        failed = rejection_status(SpecError([problem], reason="ApplyRejected"), body.get("status") or {},
                                  body["metadata"].get("generation"), time.time())  # fmt: skip
        for key, value in failed.items():
            patch.status[key] = value
        raise kopf.PermanentError(str(err)) from None
    for key, value in changes.items():
        patch.status[key] = value


def _watched(settings: OperatorSettings, namespace: str) -> bool:
    """Whether ``namespace`` matches the operator's namespace patterns (kopf's glob and ``!`` exclusion)."""
    patterns = settings.namespaces
    if not patterns:
        return True
    included = any(fnmatch.fnmatchcase(namespace, p) for p in patterns if not p.startswith("!"))
    excluded = any(fnmatch.fnmatchcase(namespace, p[1:]) for p in patterns if p.startswith("!"))
    return included and not excluded


class _PeriodicLoop:
    """A daemon thread that makes one pass over every BatchedModel the operator serves every ``interval_s``.

    Subclasses define ``_one(body, now)`` (one model; Kube errors are theirs to handle) and ``_forget(seen)``
    (drop state of models that are gone). A bug in one pass is logged and the next pass runs anyway.
    """

    name = "loop"
    #: What a pass reads of every model's children (their caches must be current for the pass to run).
    kinds: tuple[str, ...] = ("pods", "deployments")

    def __init__(self, kube: Kube, settings: OperatorSettings, interval_s: float, caches: ChildCaches) -> None:
        self.kube, self.settings, self.interval_s = kube, settings, interval_s
        self.view = CachedView(kube, caches)  # the Deployments' and pods' reads: from the watch caches
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
        """One pass over every BatchedModel the operator serves."""
        try:
            models = self.kube.list_batched_models(self.settings.exact_namespaces)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("%s pass postponed: %s", self.name, err)
            return
        try:
            self.view.check(self.kinds)  # the children's caches are listed and their watches current
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("%s pass postponed: %s", self.name, err)
            return
        self._begin_pass()
        seen = set()
        for body in models:
            meta = body["metadata"]
            if meta.get("deletionTimestamp") or not _watched(self.settings, meta["namespace"]):
                continue
            seen.add(meta["uid"])
            try:
                self._one(body, now)
            except (KubeTemporaryError, KubePermanentError):
                raise
            except Exception:  # one model's bad data (a hand-edited status) must not stop the pass for the others
                log.exception("%s of %s/%s failed", self.name, meta["namespace"], meta["name"])
        self._forget(seen)

    def _event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = body["metadata"]
        self.kube.post_event(body, type_, reason, message)
        _log_event(meta["namespace"], meta["name"], type_, reason, message)

    def _reconcile(self, name: str, ns: str) -> None:
        """Apply the children again (the object is read again: its status may have just changed)."""
        fresh = self.kube.get_batched_model(name, ns)
        if fresh is None:
            return
        try:
            changed = reconcile(fresh, self.kube, now=time.time(), emit=lambda *e: self._event(fresh, *e))
        except SpecRejectedError as err:
            # e.g. a measured profile that makes the SLA infeasible: the conditions say so with the numbers, and
            # the running pods keep their config (children are applied only for a plan that serves)
            self.kube.patch_status(fresh, changed_fields(fresh.get("status") or {}, err.status))
            return
        if changed:
            self.kube.patch_status(fresh, changed)

    def _begin_pass(self) -> None:
        """Called once at the start of each pass, after the models were listed."""

    def _one(self, body: dict[str, Any], now: float) -> None:
        raise NotImplementedError

    def _forget(self, seen: set[str]) -> None:
        raise NotImplementedError


class ScalingLoop(_PeriodicLoop):
    """Every ``interval_s``: one list of BatchedModels, one Prometheus query set, one decision per model.

    A thread of the operator rather than a kopf timer: kopf puts a finalizer on every object that has a timer,
    and a BatchedModel would then hang in deletion whenever the operator is not running (uninstalled first,
    crash-looping). Deletion stays pure garbage collection. Status is written with the object's
    resourceVersion as a precondition, so a tick computed from an older state never overwrites what a
    create/update handler wrote since (a 409 skips the model until the next tick). Events are posted through the
    API (kopf.event works only inside handlers).
    """

    name = "scaling"

    def __init__(self, kube: Kube, hub: SignalHub, settings: OperatorSettings, caches: ChildCaches) -> None:
        super().__init__(kube, settings, settings.reconcile_interval_s, caches)
        self.hub = hub
        self.history: dict[str, tuple[Any, ...]] = {}  # uid -> decision history (lost on restart: see policy)
        self.last_tick: dict[str, float] = {}
        self.holding: dict[str, int] = {}  # uid -> pods holding GPUs at the last tick (charged for the interval)
        self.monitored: set[str] = set()  # uids whose ServiceMonitor child was seen

    def _begin_pass(self) -> None:
        self.hub.new_pass()

    def _forget(self, seen: set[str]) -> None:
        for uid in (set(self.history) | set(self.last_tick) | self.monitored) - seen:
            self.history.pop(uid, None)
            self.last_tick.pop(uid, None)
            self.holding.pop(uid, None)
            self.monitored.discard(uid)

    def _one(self, body: dict[str, Any], now: float) -> None:
        meta = body["metadata"]
        uid, ns, name = meta["uid"], meta["namespace"], meta["name"]

        started = time.monotonic()
        try:
            tick = scale_tick(
                body,
                self.view,
                self.hub.signals,
                self.history.get(uid, ()),
                now=now,
                monitored=uid in self.monitored,
                interval_s=self.interval_s,
            )
            written = not tick.status or self.kube.patch_status(body, tick.status)
            if written and tick.scale_to is not None:
                self.kube.scale_deployment(tick.deployment, ns, tick.scale_to)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("scaling tick of %s/%s postponed: %s", ns, name, err)
            return
        finally:
            operator_metrics.RECONCILE.labels("scale").observe(time.monotonic() - started)
        if tick.drift:
            log.warning("%s/%s: %s: applying its children again", ns, name, tick.drift)
            try:
                self._reconcile(name, ns)
            except (KubeTemporaryError, KubePermanentError) as err:
                log.warning("re-applying the children of %s/%s postponed: %s", ns, name, err)
            return
        if tick.monitored:
            self.monitored.add(uid)
        else:
            self.monitored.discard(uid)
        if tick.decision is None or tick.signals is None or tick.desired is None or not written:
            return  # a status computed from an older state: nothing was done, the next tick recomputes
        for type_, reason, message in tick.events:
            self.kube.post_event(body, type_, reason, message)
            _log_event(ns, name, type_, reason, message)
        self.history[uid] = tick.decision.history
        last = self.last_tick.get(uid)
        self.last_tick[uid] = now
        plan = tick.desired.plan_status
        operator_metrics.observe_tick(
            ns,
            name,
            decision=tick.decision,
            signals=tick.signals,
            replicas=tick.replicas,
            ready=tick.ready,
            capacity_rps=plan.capacityPerReplicaRps,
            server_budget_ms=plan.serverBudgetMs,
            gpus_per_replica=tick.desired.spec.triton.gpusPerReplica,
            gpu_holding_replicas=self.holding.get(uid, 0),
            elapsed_s=0.0 if last is None else max(0.0, now - last),
        )
        self.holding[uid] = tick.holding


#: Per-pod timeout of a statistics read, seconds (reads run in parallel; an unreachable pod costs this once).
PROFILE_READ_TIMEOUT_S = 2.0
#: How long no Ready pod's statistics may be unreadable before a StatisticsUnavailable Warning, seconds.
UNREAD_WARNING_S = 120.0


class ProfilingLoop(_PeriodicLoop):
    """Every ``profile_interval_s``: Triton's batch statistics of every BatchedModel's Ready pods, the fitted
    profile, and a re-plan when :func:`batchfill.controller.reconcile.profile_tick` adopts it (spec.profiling).

    A thread of its own, so slow or unreachable pods never delay a scaling decision; pod reads run in parallel.
    """

    name = "profiling"
    kinds = ("pods",)

    def __init__(self, kube: Kube, settings: OperatorSettings, caches: ChildCaches) -> None:
        super().__init__(kube, settings, settings.profile_interval_s, caches)
        self.baselines: dict[str, dict[str, PodBatchStats]] = {}  # model uid -> pod uid -> first statistics read
        self.unread: set[tuple[str, str]] = set()  # (model uid, pod IP) whose last statistics read failed
        self.unread_warned: dict[str, float] = {}  # model uid -> when StatisticsUnavailable was last posted
        self.unread_since: dict[str, float] = {}  # model uid -> since when no Ready pod's statistics could be read
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="batchfill-stats")

    def stop(self) -> None:
        super().stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, body: dict[str, Any], now: float) -> None:
        meta = body["metadata"]
        try:
            self._profile(body, now)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("profiling of %s/%s postponed: %s", meta["namespace"], meta["name"], err)

    def _forget(self, seen: set[str]) -> None:
        for uid in set(self.baselines) - seen:
            del self.baselines[uid]
        for uid in set(self.unread_warned) - seen:
            del self.unread_warned[uid]
        for uid in set(self.unread_since) - seen:
            del self.unread_since[uid]
        self.unread = {k for k in self.unread if k[0] in seen}

    def _profile(self, body: dict[str, Any], now: float) -> None:
        """Read Triton's batch statistics of the Ready pods; adopt a measured profile when the rule says so.

        Each pod's first read is its baseline (model warm-up excluded); a pod whose counters fell (its Triton
        restarted) is re-baselined. The status write uses the object as read after the statistics (a read takes
        up to 2 s per pod, and the scaling loop writes status too), and an adoption is then reconciled: the new
        config.pbtxt rolls the Deployment once. An adoption whose reconcile did not happen (API trouble, a
        restart in between) is applied by the scaling loop (:func:`batchfill.controller.reconcile.children_drift`).
        """
        meta, spec = body["metadata"], body.get("spec") or {}
        uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
        model = (spec.get("model") or {}).get("name")
        if not model:
            return
        owner = Owner(name=name, namespace=ns, uid=uid)
        pods = ready_pod_ips(self.view.list_pods(ns, selector_labels(owner)))
        bases = self.baselines.setdefault(uid, {})
        for gone in set(bases) - {p for p, _ in pods}:
            del bases[gone]
        sums: dict[int, list[int]] = {}
        read = 0
        port = self.settings.triton_http_port

        def one(ip: str) -> PodBatchStats | PodStatsError:
            try:
                return read_pod_batch_stats(f"{_host(ip)}:{port}", model, timeout_s=PROFILE_READ_TIMEOUT_S)
            except PodStatsError as err:
                return err

        results = list(self.pool.map(one, [ip for _, ip in pods]))
        failed = [(ip, r) for (_, ip), r in zip(pods, results, strict=True) if isinstance(r, PodStatsError)]
        self._report_unread(body, failed, len(pods), now)
        for (pod_uid, _ip), stats in zip(pods, results, strict=True):
            if isinstance(stats, PodStatsError):
                continue
            base = bases.get(pod_uid)
            if base is None or any(stats.batches.get(b, (0, 0))[0] < n for b, (n, _) in base.batches.items()):
                bases[pod_uid] = stats  # first sight or a restarted Triton: measure from here
                continue
            read += 1
            for b, (n, total) in stats.batches.items():
                n0, t0 = base.batches.get(b, (0, 0))
                acc = sums.setdefault(b, [0, 0])
                acc[0] += n - n0
                acc[1] += total - t0
        totals = [BatchTotals(b, n, t) for b, (n, t) in sums.items()]
        tick = profile_tick(body, totals, read, now=now)
        if not tick.status:
            return
        # decide again on the object as it is now: the pass's list is seconds old, and a write against its
        # resourceVersion would lose to every status write made since (HTTP 409, the measurement dropped)
        fresh = self.kube.get_batched_model(name, ns)
        if fresh is None or fresh["metadata"].get("uid") != uid:
            return
        tick = profile_tick(fresh, totals, read, now=now)
        if not tick.status or not self.kube.patch_status(fresh, tick.status):
            return
        for type_, reason, message in tick.events:
            self._event(fresh, type_, reason, message)
        if tick.replan:
            self._reconcile(name, ns)

    def _report_unread(
        self, body: dict[str, Any], failed: list[tuple[str, PodStatsError]], ready: int, now: float
    ) -> None:
        """A Warning event when no Ready pod's statistics could be read for :data:`UNREAD_WARNING_S` (once per
        replan interval per model), and a log line for each pod that turns unreadable: silence would look like a
        model never measured. The delay keeps a roll or a scale-out (a pod Ready a moment before its server
        answers) from raising an alarm."""
        meta = body["metadata"]
        uid = meta["uid"]
        for ip, err in failed:
            if (uid, ip) not in self.unread:
                log.info("statistics of %s/%s pod %s not read: %s", meta["namespace"], meta["name"], ip, err)
        self.unread = {k for k in self.unread if k[0] != uid} | {(uid, ip) for ip, _ in failed}
        if not failed or len(failed) < ready:
            self.unread_since.pop(uid, None)
            return
        since = self.unread_since.setdefault(uid, now)
        interval = float(((body.get("spec") or {}).get("profiling") or {}).get("replanIntervalSeconds") or 600)
        if now - since < UNREAD_WARNING_S or now - self.unread_warned.get(uid, -math.inf) < interval:
            return
        self.unread_warned[uid] = now
        ip, err = failed[0]
        self._event(body, "Warning", "StatisticsUnavailable", (
            f"for {now - since:.0f} s Triton statistics of none of the {ready} Ready pod(s) could be read on port "
            f"{self.settings.triton_http_port} (e.g. {ip}: {err}); the profile is not being measured"
        ))  # fmt: skip


def _host(ip: str) -> str:
    """A pod IP as the host part of a URL (IPv6 in brackets)."""
    return f"[{ip}]" if ":" in ip else ip


@kopf.on.cleanup()
def stop_scaling(memo: kopf.Memo, **_: Any) -> None:
    for attr in ("scaling_loop", "profiling_loop", "child_caches"):
        loop = getattr(memo, attr, None)
        if loop is not None:
            loop.stop()


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def deleted(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    hub = getattr(memo, "signal_hub", None)
    if hub is not None:
        hub.forget(namespace or "", name)
    operator_metrics.forget(namespace or "", name)
    log.info("BatchedModel %s/%s deleted; its children go with it (ownerReferences)", namespace, name)
