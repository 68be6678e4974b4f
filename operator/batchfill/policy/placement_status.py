"""``status.placement`` of one model from the joint plan (pure): where it is served, why, and the plan's numbers.

The shares are loads at SLA capacity, the plan's own unit (:mod:`batchfill.policy.placement`): a model carrying rate
λ on a GPU where it alone serves ``C`` within its SLA takes ``λ / C`` of that GPU; a shared GPU's headroom is
``1 - Σ λ_m / C_m`` over its models, at the planned (design) rates. A model of mode Auto with dedicated GPUs in the
plan is served Dedicated: its own replicas, scaled by the single-model loop, carry all of its load, residual
included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from batchfill.api.reasons import PlacementReason
from batchfill.api.spec import PlacementMode, PlacementSpec
from batchfill.api.status import PLACEMENT_PODS_MAX, PlacementStatus, PlanStatus
from batchfill.policy.placement import ModelPlacement, Placement

#: Decimal places of the shares written to status (a re-plan's jitter below it writes nothing).
SHARE_DECIMALS = 4


def _headroom(placement: Placement, gpu_id: int) -> float:
    """1 - Σ λ_m / C_m over the models of shared GPU ``gpu_id``, clamped to [0, 1]."""
    gpu = next(g for g in placement.shared if g.gpu_id == gpu_id)
    load = sum(
        rate / placement.model(name).capacity_rps
        for name, rate in zip(gpu.tenants, gpu.rates_rps, strict=True)
        if placement.model(name).capacity_rps > 0
    )
    return round(min(1.0, max(0.0, 1.0 - load)), SHARE_DECIMALS)


def placement_status(
    name: str,
    spec: PlacementSpec,
    placement: Placement | None,
    pods: Sequence[str] = (),
    since: str | None = None,
) -> PlacementStatus:
    """``status.placement`` of model ``name`` with spec.placement ``spec`` under the joint plan ``placement``.

    Args:
        name: the model's name in the plan.
        spec: its spec.placement.
        placement: the joint plan of its pool, or None when there is none yet.
        pods: the pods it is loaded and ready on (any order; the first :data:`PLACEMENT_PODS_MAX` sorted are kept).
        since: when it last moved, RFC 3339.

    Returns:
        The status; every float finite and rounded to :data:`SHARE_DECIMALS` places.
    """
    ready = sorted(pods)
    listed, count = ready[:PLACEMENT_PODS_MAX], len(ready)
    if spec.mode is PlacementMode.DEDICATED:
        return PlacementStatus(mode="Dedicated", pods=listed, podCount=count, reason=PlacementReason.DEDICATED_BY_SPEC,
                               since=since)  # fmt: skip
    try:
        m = None if placement is None else placement.model(name)
    except KeyError:
        m = None
    if m is None or placement is None:
        return PlacementStatus(mode="Dedicated", pool=spec.pool, pods=listed, podCount=count,
                               reason=PlacementReason.NOT_PLACED, message="no joint plan holds it yet",
                               since=since)  # fmt: skip
    capacity = m.capacity_rps if m.capacity_rps > 0 else float("inf")
    if m.dedicated_gpus > 0 and spec.mode is PlacementMode.AUTO:
        share = round(m.design_rate_rps / capacity, SHARE_DECIMALS)
        # the observed rate first: the design rate is λ / u, raised while the model is away from the pool
        # (batchfill.controller.pool_plan.held_members), so it is no load anybody measured
        message = (
            f"its load {m.rate_rps:.4g} req/s, planned as {m.design_rate_rps:.4g}, fills {m.dedicated_gpus} GPU(s) "
            f"of {m.capacity_rps:.4g} req/s each at its SLA"
        )
        return PlacementStatus(mode="Dedicated", pool=spec.pool, pods=listed, podCount=count, gpuShare=share,
                               reason=PlacementReason.DEDICATED_FILLS_GPU, message=message, since=since)  # fmt: skip
    share = round(m.shared_rate_rps / capacity, SHARE_DECIMALS)
    headroom = None if m.shared_gpu is None else _headroom(placement, m.shared_gpu)
    reason = (
        PlacementReason.SHARED_BY_SPEC if spec.mode is PlacementMode.SHARED else PlacementReason.SHARED_BELOW_ONE_GPU
    )
    if m.shared_rate_rps > 0:
        message = (
            f"{m.shared_rate_rps:.4g} req/s of {m.capacity_rps:.4g} one GPU serves at its SLA; "
            f"simulated p99 {m.p99_ms:.4g} ms of {m.target_ms:.4g}"
        )
    else:  # a p99 of 0 ms simulated without a request is no figure: say there is no load to judge yet
        message = (
            f"no load yet (0 req/s of {m.capacity_rps:.4g} one GPU serves at its SLA); p99 target {m.target_ms:.4g} ms"
        )
    return PlacementStatus(mode="Shared", pool=spec.pool, pods=listed, podCount=count, gpuShare=share,
                           planHeadroom=headroom, reason=reason, message=message, since=since)  # fmt: skip


def shared_plan_status(model: ModelPlacement, solo: PlanStatus) -> PlanStatus:
    """The plan a model is loaded with on a shared pod (:func:`batchfill.render.pool.load_request` takes it).

    Its own plan ``solo`` (``status.plan``) with the joint plan's batching on the shared GPU (``model.config``:
    work-conserving, every batch size preferred, the least queue delay) and the shared GPU's simulated p99; the
    instance count and the rest stay the model's own.
    """
    c = model.config
    return solo.model_copy(
        update={
            "maxBatchSize": c.max_batch_size,
            "preferredBatchSizes": list(c.preferred_batch_sizes),
            "maxQueueDelayMicroseconds": c.max_queue_delay_us,
            "predictedP99Ms": math.floor(model.p99_ms * 100) / 100,
            "rule": f"shared GPU: the joint plan's batching ({solo.rule})"[:256],
        }
    )
