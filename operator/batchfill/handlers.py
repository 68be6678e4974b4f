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
import threading
import time
from typing import Any

import kopf

from batchfill.adapters import operator_metrics
from batchfill.adapters.kube import Kube, KubePermanentError, KubeTemporaryError
from batchfill.adapters.metrics import PrometheusSignals
from batchfill.adapters.signal_hub import SignalHub
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.reconcile import SpecRejectedError, reconcile, scale_tick
from batchfill.settings import OperatorSettings

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
    memo.kube = Kube.from_config()
    # shared by reference with every per-object memo (kopf copies the operator memo shallowly per object)
    memo.signal_hub = SignalHub(
        PrometheusSignals(ours.prometheus_url, window_s=ours.signal_window_s, timeout_s=ours.prometheus_timeout_s),
        max_age_s=ours.reconcile_interval_s / 2,
    )
    operator_metrics.serve(ours.metrics_port)
    memo.scaling_loop = ScalingLoop(memo.kube, memo.signal_hub, ours)
    memo.scaling_loop.start()


def _log_event(namespace: str, name: str, type_: str, reason: str, message: str) -> None:
    log.log(logging.WARNING if type_ == "Warning" else logging.INFO, "%s/%s %s: %s", namespace, name, reason, message)


def _emitter(body: Any) -> Any:
    def emit(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message[:1024])
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
    try:
        changes = reconcile(body, kube, now=time.time(), emit=_emitter(body))
    except SpecRejectedError as rejected:
        for key, value in rejected.status.items():
            patch.status[key] = value
        raise kopf.PermanentError(str(rejected)) from None
    except KubeTemporaryError as err:
        raise kopf.TemporaryError(str(err), delay=err.delay_s * min(2**retry, 12)) from None
    except KubePermanentError as err:
        kopf.event(body, type="Warning", reason="ApplyRejected", message=str(err)[:1024])
        raise kopf.PermanentError(str(err)) from None
    for key, value in changes.items():
        patch.status[key] = value


class ScalingLoop:
    """Every ``interval_s``: one list of BatchedModels, one Prometheus query set, one decision per model.

    A thread of the operator rather than a kopf timer: kopf puts a finalizer on every object that has a timer,
    and a BatchedModel would then hang in deletion whenever the operator is not running (uninstalled first,
    crash-looping). Deletion stays pure garbage collection. Status is written with the object's
    resourceVersion as a precondition, so a tick computed from an older state never overwrites what a
    create/update handler wrote since (a 409 skips the model until the next tick). Events are posted through the
    API (kopf.event works only inside handlers).
    """

    def __init__(self, kube: Kube, hub: SignalHub, settings: OperatorSettings) -> None:
        self.kube, self.hub, self.settings = kube, hub, settings
        self.history: dict[str, tuple[Any, ...]] = {}  # uid -> decision history (lost on restart: see policy)
        self.last_tick: dict[str, float] = {}
        self.holding: dict[str, int] = {}  # uid -> pods holding GPUs at the last tick (charged for the interval)
        self.monitored: set[str] = set()  # uids whose ServiceMonitor child was seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchfill-scaling", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        self._stop.wait(min(5.0, self.settings.reconcile_interval_s))
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick(time.time())
            except Exception:  # a bug in one tick must not end scaling for good
                log.exception("scaling tick failed")
            self._stop.wait(max(0.0, self.settings.reconcile_interval_s - (time.monotonic() - started)))

    def _watched(self, namespace: str) -> bool:
        patterns = self.settings.namespaces
        if not patterns:
            return True
        included = any(fnmatch.fnmatchcase(namespace, p) for p in patterns if not p.startswith("!"))
        excluded = any(fnmatch.fnmatchcase(namespace, p[1:]) for p in patterns if p.startswith("!"))
        return included and not excluded

    def tick(self, now: float) -> None:
        """One pass over every BatchedModel the operator serves."""
        try:
            models = self.kube.list_batched_models(self.settings.exact_namespaces)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("scaling tick postponed: %s", err)
            return
        seen = set()
        for body in models:
            meta = body["metadata"]
            if meta.get("deletionTimestamp") or not self._watched(meta["namespace"]):
                continue
            seen.add(meta["uid"])
            self._one(body, now)
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
                body, self.kube, self.hub.signals, self.history.get(uid, ()), now=now, monitored=uid in self.monitored
            )
            written = not tick.status or self.kube.patch_status(body, tick.status)
            if written and tick.scale_to is not None:
                self.kube.scale_deployment(tick.deployment, ns, tick.scale_to)
        except (KubeTemporaryError, KubePermanentError) as err:
            log.warning("scaling tick of %s/%s postponed: %s", ns, name, err)
            return
        finally:
            operator_metrics.RECONCILE.labels("scale").observe(time.monotonic() - started)
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


@kopf.on.cleanup()
def stop_scaling(memo: kopf.Memo, **_: Any) -> None:
    loop = getattr(memo, "scaling_loop", None)
    if loop is not None:
        loop.stop()


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def deleted(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    hub = getattr(memo, "signal_hub", None)
    if hub is not None:
        hub.forget(namespace or "", name)
    operator_metrics.forget(namespace or "", name)
    log.info("BatchedModel %s/%s deleted; its children go with it (ownerReferences)", namespace, name)
