"""kopf handlers: decorators and error translation only; the work is in reconcile.py.

* create / update / resume run the same reconcile. kopf leaves ``status`` out of its diff base, so the
  operator's own status writes never trigger them (CASES C16); handler progress and the diff base live in
  ``batchfill.io/`` annotations, not in ``status``.
* invalid or infeasible specs -> conditions + one Warning event + ``kopf.PermanentError`` (no retry loop);
  API conflicts, throttling and outages -> ``kopf.TemporaryError`` with a backoff (CASES C18). No handler is
  declared with ``retries=0`` (which kopf reads as "zero attempts").
* delete: nothing to do: every child has an ownerReference, so the API server garbage-collects them. The
  handler is ``optional`` so kopf adds no finalizer for it.
"""

from __future__ import annotations

import logging
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
# kopf reads timer intervals when the decorators run, i.e. at import: `batchfill run` validates the settings
# before it imports this module, so reading them here cannot fail for a running operator.
TIMER_INTERVAL_S = OperatorSettings.from_env().reconcile_interval_s


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
    settings.networking.request_timeout = ours.request_timeout_s
    memo.kube = Kube.from_config()
    # shared by reference with every per-object memo (kopf copies the operator memo shallowly per object)
    memo.signal_hub = SignalHub(
        PrometheusSignals(ours.prometheus_url, window_s=ours.signal_window_s, timeout_s=ours.prometheus_timeout_s),
        max_age_s=ours.reconcile_interval_s / 2,
    )
    operator_metrics.serve(ours.metrics_port)


def _emitter(body: Any) -> Any:
    def emit(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message[:1024])

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


@kopf.timer(GROUP, VERSION, PLURAL, interval=TIMER_INTERVAL_S, initial_delay=min(5.0, TIMER_INTERVAL_S), sharp=False)
def scale(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Status refresh and one scaling decision (reconcile.scale_tick); writes only what changed.

    The per-object ``memo`` keeps the decision history between ticks (lost on restart: the policy then holds
    scale-in for a full stabilization window). Kubernetes trouble postpones the tick; Prometheus trouble is a
    signal state (hold), never an error here, so the timer never piles up errors in the handler progress.
    """
    started, now = time.monotonic(), time.time()
    history = getattr(memo, "scaling_history", ())
    try:
        tick = scale_tick(body, _kube(memo), memo.signal_hub.signals, history, now=now, emit=_emitter(body))
    except (KubeTemporaryError, KubePermanentError) as err:
        log.warning("scaling tick of %s/%s postponed: %s", body.metadata.namespace, body.metadata.name, err)
        return
    finally:
        operator_metrics.RECONCILE.labels("scale").observe(time.monotonic() - started)
    for key, value in tick.status.items():
        patch.status[key] = value
    if tick.decision is not None and tick.signals is not None and tick.desired is not None:
        memo.scaling_history = tick.decision.history
        last = getattr(memo, "last_tick", None)
        memo.last_tick = now
        plan = tick.desired.plan_status
        operator_metrics.observe_tick(
            str(body.metadata.namespace),
            str(body.metadata.name),
            decision=tick.decision,
            signals=tick.signals,
            replicas=tick.replicas,
            ready=tick.ready,
            capacity_rps=plan.capacityPerReplicaRps,
            server_budget_ms=plan.serverBudgetMs,
            gpus_per_replica=tick.desired.spec.triton.gpusPerReplica,
            elapsed_s=0.0 if last is None else max(0.0, now - last),
        )


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def deleted(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    memo.signal_hub.forget(namespace or "", name)
    operator_metrics.forget(namespace or "", name)
    log.info("BatchedModel %s/%s deleted; its children go with it (ownerReferences)", namespace, name)
