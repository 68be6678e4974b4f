"""kopf handlers: decorators, startup and cleanup, and error translation only; the work is elsewhere.

* create / update / resume run the same reconcile (controller/reconcile.py). kopf leaves ``status`` out of the
  object's "essence" it diffs against (https://github.com/nolar/kopf/blob/main/kopf/_cogs/configs/diffbase.py),
  so the operator's own status writes never trigger them; handler progress and the diff base live in
  ``batchfill.io/`` annotations, not in ``status``.
* invalid or infeasible specs -> conditions + one Warning event + ``kopf.PermanentError`` (no retry loop);
  API conflicts, throttling and outages -> ``kopf.TemporaryError`` with a backoff
  (https://docs.kopf.dev/en/stable/errors/). No handler is declared with ``retries=0``, which kopf reads as
  "zero attempts" rather than "no retries".
* delete: nothing to do: every child has an ownerReference, so the API server garbage-collects them. The
  handler is ``optional`` and scaling and profiling run in threads of their own (controller/loops.py), not in
  kopf timers, so kopf adds no finalizer: a BatchedModel deletes cleanly even when the operator is not running.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf

from batchfill.adapters import operator_metrics
from batchfill.adapters.informer import CachedView, ChildCaches
from batchfill.adapters.kube import Kube, KubePermanentError, KubeTemporaryError, RateLimiter
from batchfill.adapters.metrics import PrometheusSignals, SignalTarget
from batchfill.adapters.signal_hub import SignalHub
from batchfill.api.errors import Problem, SpecError
from batchfill.api.reasons import SpecReason
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.controller.desired import render_on_cpu
from batchfill.controller.loops import ProfilingLoop, ScalingLoop
from batchfill.controller.pool_loop import PoolModelsLoop
from batchfill.controller.reconcile import FirstTick, SpecRejectedError, emitter, reconcile
from batchfill.controller.scaling import status_before_first_tick
from batchfill.controller.settings import OperatorSettings
from batchfill.controller.status import rejection_status
from batchfill.render.kube import CHILDREN_SELECTOR
from batchfill.render.pool import POOL_CHILDREN_SELECTOR

log = logging.getLogger("batchfill")
ANNOTATION_PREFIX = GROUP  # kopf's progress and diff-base annotations: batchfill.io/...


def _kube(memo: Any) -> Kube:
    kube = getattr(memo, "kube", None)
    if kube is None:
        kube = memo.kube = Kube.from_config()
    return kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours: OperatorSettings = memo.get("settings") or OperatorSettings.from_env()
    memo.settings = ours
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
    watch_timeouts(settings, ours)
    render_on_cpu(ours.triton_cpu_image)
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
    memo.scaling_loop = ScalingLoop(memo.kube, CachedView(memo.kube, memo.child_caches), memo.signal_hub, ours)
    memo.scaling_loop.start()
    memo.profiling_loop = ProfilingLoop(memo.kube, CachedView(memo.kube, memo.child_caches), ours)
    memo.profiling_loop.start()
    # GPUPools' pods and Deployments carry the pool label, not a BatchedModel's: caches of their own
    memo.pool_caches = ChildCaches(
        memo.kube.watch_client(2 * scopes + 2), POOL_CHILDREN_SELECTOR, ours.exact_namespaces,
        max_stale_s=2 * ours.reconcile_interval_s,
    ).start()  # fmt: skip
    memo.pool_loop = PoolModelsLoop(memo.kube, CachedView(memo.kube, memo.pool_caches), ours, hub=memo.signal_hub)
    memo.pool_loop.start()


def watch_timeouts(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    """Finite timeouts on kopf's WATCH requests (kopf leaves them unset: a connection that goes silent without
    closing would then hold the stream until kopf's inactivity timeout, if the kopf version has one).

    The server timeout makes a healthy API server end each request (kopf watches again from the last
    resourceVersion); the client timeout ends it on the client side whatever the server or the network does.
    """
    settings.watching.server_timeout = ours.watch_server_timeout_s
    settings.watching.client_timeout = ours.watch_client_timeout_s
    settings.watching.connect_timeout = ours.watch_connect_timeout_s


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile_handler(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int, **kwargs: Any) -> None:
    kube = _kube(memo)
    first = kwargs.get("reason") == kopf.Reason.CREATE and retry == 0  # kopf's cause: a create, first attempt
    with operator_metrics.RECONCILE.labels("reconcile").time():
        _reconcile(body, patch, kube, retry, first=first, first_tick=_first_tick(memo))


def _first_tick(memo: kopf.Memo) -> FirstTick | None:
    """The scaling fields of a model's first tick, from the signal hub's answer for a model without Ready pods
    (:func:`batchfill.controller.scaling.status_before_first_tick`); None before the operator's start-up ran."""
    hub: SignalHub | None = getattr(memo, "signal_hub", None)
    ours: OperatorSettings | None = getattr(memo, "settings", None)
    if hub is None or ours is None:
        return None

    def first_tick(body: Any, desired: Any, deployment: Any, wanted: dict[str, Any], now: float) -> dict[str, Any]:
        meta = body["metadata"]
        target = SignalTarget(meta["namespace"], meta["name"], desired.spec.model.name,
                              desired.plan_status.maxBatchSize)  # fmt: skip
        return status_before_first_tick(body, desired, deployment, wanted, now, signals=hub.signals(target),
                                        interval_s=ours.reconcile_interval_s)  # fmt: skip

    return first_tick


def _reconcile(body: kopf.Body, patch: kopf.Patch, kube: Kube, retry: int, *, first: bool = False,
               first_tick: FirstTick | None = None) -> None:  # fmt: skip
    emit = emitter(kube, body)
    try:
        changes = reconcile(body, kube, now=time.time(), emit=emit, first=first, first_tick=first_tick)
    except SpecRejectedError as rejected:
        for key, value in rejected.status.items():
            patch.status[key] = value
        raise kopf.PermanentError(str(rejected)) from None
    except KubeTemporaryError as err:
        raise kopf.TemporaryError(str(err), delay=err.delay_s * min(2**retry, 12)) from None
    except KubePermanentError as err:
        emit("Warning", SpecReason.APPLY_REJECTED, str(err))
        # a condition too, or `kubectl get bm` would show the previous generation's plan as if it were served
        problem = Problem("spec", f"the API server rejected a child object built from it: {err}")
        failed = rejection_status(SpecError([problem], reason=SpecReason.APPLY_REJECTED), body.get("status") or {},
                                  body["metadata"].get("generation"), time.time())  # fmt: skip
        for key, value in failed.items():
            patch.status[key] = value
        raise kopf.PermanentError(str(err)) from None
    for key, value in changes.items():
        patch.status[key] = value


@kopf.on.cleanup()
def stop_scaling(memo: kopf.Memo, **_: Any) -> None:
    for attr in ("scaling_loop", "profiling_loop", "pool_loop", "child_caches", "pool_caches"):
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
