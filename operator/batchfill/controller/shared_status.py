"""The status of a BatchedModel served on a GPUPool's shared pods (pure).

Such a model has no Deployment: its copies are its loads on pool pods, routed by the pods' per-model label
(:mod:`batchfill.render.pool`). Its status is the one :func:`batchfill.controller.status.desired_status` gives a
dedicated model, with the copies in the place of the Deployment's replicas (each copy was loaded with the plan's
config and is labelled only once READY, so all of them are Ready and up to date) and ``status.placement`` from the
pool loop. The handlers and the pool loop both write it through :func:`shared_status`, so neither undoes the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from batchfill.api.reasons import ConditionReason, ConditionType
from batchfill.api.spec import PlacementMode
from batchfill.api.status import ConditionStatus
from batchfill.controller.desired import Desired
from batchfill.controller.status import desired_status, failing_conditions
from batchfill.policy import conditions as cond
from batchfill.policy.scaling import FAILURE_FRACTION
from batchfill.policy.signals import ModelSignals, SignalState
from batchfill.render.kube import CONFIG_HASH_ANNOTATION


def served_shared(body: Mapping[str, Any]) -> bool:
    """Whether the BatchedModel is served on its pool's pods rather than replicas of its own: spec.placement.mode
    Shared, or Auto while status.placement says Shared (the pool loop's joint plan put it there)."""
    placement = (body.get("spec") or {}).get("placement") or {}
    mode = placement.get("mode")
    if mode == PlacementMode.SHARED:
        return True
    status = (body.get("status") or {}).get("placement") or {}
    return mode == PlacementMode.AUTO and status.get("mode") == "Shared" and status.get("pool") == placement.get("pool")


def member_rate(copies: bool, copies_rate_rps: float | None, body: Mapping[str, Any]) -> float | None:
    """A pool member's request rate this tick, req/s, or None when it is not known (the plan keeps the last one).

    Its pool copies' rate (read from the pool pods' ``model`` series) plus, while it also has replicas of its own,
    ``status.observed.requestRate``, which its own scaling loop writes each tick from those replicas and removes
    when unknown. A model served shared has no scaling loop of its own, so its stored figure is stale and not read;
    one served on its own replicas has no known rate while that figure is missing, whatever its pool copies show.
    Without this, an ``Auto`` model that graduated to its own replicas keeps the rate it left the pool with, and
    never moves back when its load falls.

    Args:
        copies: whether a pool pod is labelled for it.
        copies_rate_rps: the rate over those pods (None, NaN or negative: not known).
        body: the BatchedModel.
    """

    def known(x: Any) -> float | None:
        return float(x) if isinstance(x, int | float) and math.isfinite(x) and x >= 0 else None

    pool = known(copies_rate_rps) if copies else 0.0
    if pool is None:
        return None
    if served_shared(body):
        return pool if copies else None
    own = known(((body.get("status") or {}).get("observed") or {}).get("requestRate"))
    if own is None:
        # away from the pool, its own replicas carry its load (its Service is switched to them once they are
        # ready): a pool copy still draining serves next to nothing, and its rate alone would read as the load
        # falling to 0 and move the model back on data that is not known
        return None
    return pool + own


def copies(pods: int, config_hash: str) -> dict[str, Any]:
    """The model's ``pods`` labelled copies as :func:`desired_status` reads a Deployment: that many replicas, all
    Ready, updated and available, every one serving ``config_hash``."""
    counts = {"replicas": pods, "readyReplicas": pods, "updatedReplicas": pods, "availableReplicas": pods}
    return {
        "spec": {"replicas": pods, "template": {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: config_hash}}}},
        "status": counts,
    }


def shared_status(
    body: Mapping[str, Any], desired: Desired, placement: Mapping[str, Any] | None, *, now: float
) -> dict[str, Any]:
    """The status a shared BatchedModel should have.

    Args:
        body: the BatchedModel as read.
        desired: :func:`batchfill.controller.desired.desired_state` of its spec.
        placement: ``status.placement`` as the API stores it (a :class:`batchfill.api.status.PlacementStatus`
            dumped to JSON), or None to keep the stored one.
        now: seconds since the epoch.
    """
    stored = (body.get("status") or {}).get("placement") or {}
    where = dict(placement if placement is not None else stored)
    out = desired_status(body, desired, copies(int(where.get("podCount") or 0), desired.config_hash), now=now)
    if where:
        out["placement"] = where
    return out


def pooled_conditions(
    signals: ModelSignals | None, stored: Sequence[Mapping[str, Any]] | None
) -> list[cond.ConditionUpdate]:
    """A shared model's MetricsAvailable and RequestsFailing from the signals over its pool copies (None: it has
    no copy this tick). The model has no scaling decision of its own (the pool's plan sizes its copies), so these
    are what :func:`batchfill.controller.status.scaling_conditions` and ``requests_failing_conditions`` say for a
    dedicated model, read from the signals (RequestsFailing through the same
    :func:`batchfill.controller.status.failing_conditions`): True from ``FAILURE_FRACTION`` of the window's
    requests failing, False once they stop (only if it was there), none while the signals are unknown."""
    if signals is None or signals.state == SignalState.UNKNOWN:
        why = "no pool copy serves it this tick" if signals is None else (signals.message or "no usable signals")
        reason = ConditionReason.NO_DATA if signals is None else (signals.reason or ConditionReason.NO_DATA)
        return [cond.ConditionUpdate(ConditionType.METRICS_AVAILABLE, ConditionStatus.FALSE, reason, why)]
    idle = signals.state == SignalState.IDLE
    updates = [
        cond.ConditionUpdate(
            ConditionType.METRICS_AVAILABLE,
            ConditionStatus.TRUE,
            ConditionReason.IDLE if idle else ConditionReason.SIGNALS_OK,
            f"{signals.pods} pool copies reporting" + (", no traffic" if idle else ""),
        )
    ]
    fraction = signals.failure_fraction
    return updates + failing_conditions(
        fraction is not None and fraction >= FAILURE_FRACTION, signals.failure_rate_rps, fraction, stored,
        where=" on its pool copies", advice="; see the pool pods' Triton log for the cause",
    )  # fmt: skip
