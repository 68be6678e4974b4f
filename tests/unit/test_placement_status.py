"""status.placement from the joint plan (batchfill.policy.placement_status): where, why, the shares and headroom."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batchfill.api.reasons import PlacementReason
from batchfill.api.spec import PlacementSpec
from batchfill.api.status import PLACEMENT_PODS_MAX
from batchfill.policy.placement import ModelPlacement, Placement, SharedGpu
from batchfill.policy.placement_status import placement_status
from batchfill.policy.plan import Candidate

CFG = Candidate(8, (8,), 1000, 1)


def _model(name: str, rate: float, capacity: float, dedicated: int, shared: int | None) -> ModelPlacement:
    residual = rate - dedicated * capacity
    return ModelPlacement(name=name, rate_rps=rate * 0.85, design_rate_rps=rate, capacity_rps=capacity,
                          target_ms=50.0, config=CFG, dedicated_gpus=dedicated, shared_gpu=shared,
                          shared_rate_rps=residual if shared is not None else 0.0, p99_ms=30.0,
                          memory_mib=1000.0)  # fmt: skip


# a: 20 of 100 req/s, b: 30 of 60 on shared GPU 7 (load 0.2 + 0.5: headroom 0.3); c: 250 of 100 dedicated
PLAN = Placement(
    models=(_model("a", 20, 100, 0, 7), _model("b", 30, 60, 0, 7), _model("c", 250, 100, 2, None)),
    shared=(SharedGpu(7, ("a", "b"), (20.0, 30.0), (20.0, 31.0), 12.0, 2512.0),),
    gpu_memory_mib=10240.0,
    one_model_per_gpu=5,
    fractional_bound=3.2,
)
AUTO = PlacementSpec(mode="Auto", pool="p")


def test_auto_below_one_gpu_is_shared_with_its_share_and_the_gpus_headroom() -> None:
    s = placement_status("b", AUTO, PLAN, pods=["p-pool-z", "p-pool-a"])
    assert (s.mode, s.pool, s.reason) == ("Shared", "p", PlacementReason.SHARED_BELOW_ONE_GPU)
    assert s.gpuShare == 0.5
    assert s.planHeadroom == pytest.approx(0.3)
    assert (s.pods, s.podCount) == (["p-pool-a", "p-pool-z"], 2)
    assert "simulated p99 30 ms of 50" in s.message


def test_a_model_without_load_yet_has_no_simulated_p99_in_its_message() -> None:
    idle = replace(PLAN, models=(replace(PLAN.models[0], rate_rps=0.0, design_rate_rps=0.0, shared_rate_rps=0.0),))
    s = placement_status("a", AUTO, idle)
    assert s.message == "no load yet (0 req/s of 100 one GPU serves at its SLA); p99 target 50 ms"
    assert s.gpuShare == 0


def test_auto_filling_gpus_is_dedicated() -> None:
    s = placement_status("c", AUTO, PLAN)
    assert (s.mode, s.reason, s.gpuShare, s.planHeadroom) == (
        "Dedicated",
        PlacementReason.DEDICATED_FILLS_GPU,
        2.5,
        None,
    )
    # the observed rate (0.85 of the design rate here) is the load; the design rate is named as what was planned
    assert s.message == "its load 212.5 req/s, planned as 250, fills 2 GPU(s) of 100 req/s each at its SLA"


def test_shared_by_spec_and_dedicated_by_spec() -> None:
    assert placement_status("a", PlacementSpec(mode="Shared", pool="p"), PLAN).reason == PlacementReason.SHARED_BY_SPEC
    d = placement_status("a", PlacementSpec(), PLAN, pods=["a-triton-1"])
    assert (d.mode, d.pool, d.reason, d.gpuShare, d.podCount) == ("Dedicated", None, PlacementReason.DEDICATED_BY_SPEC,
                                                                  None, 1)  # fmt: skip


@pytest.mark.parametrize("plan", [None, PLAN])
def test_not_in_a_plan_stays_where_it_was(plan: Placement | None) -> None:
    s = placement_status("zz", AUTO, plan)
    assert (s.mode, s.reason) == ("Dedicated", PlacementReason.NOT_PLACED)


def test_pod_list_is_bounded_and_the_count_is_not() -> None:
    pods = [f"p-pool-{i:03d}" for i in range(40)]
    s = placement_status("a", AUTO, PLAN, pods=pods)
    assert len(s.pods) == PLACEMENT_PODS_MAX
    assert s.podCount == 40


def test_the_shared_plan_is_the_models_plan_with_the_joint_plans_batching() -> None:
    from batchfill.api.pool import GPUPoolSpec
    from batchfill.policy.placement_status import shared_plan_status
    from batchfill.render.pool import load_request

    from .test_pool_api import POOL_DOC
    from .test_render_kube import spec_with
    from .test_render_model_config import make_plan

    solo = make_plan(16, [16], 4000, instanceCount=2)
    model = replace(PLAN.model("a"), config=Candidate(8, (1, 2, 4, 8), 100, 1), p99_ms=12.345)
    shared = shared_plan_status(model, solo)
    assert (shared.maxBatchSize, shared.preferredBatchSizes, shared.maxQueueDelayMicroseconds) == (8, [1, 2, 4, 8], 100)
    assert (shared.instanceCount, shared.serverBudgetMs, shared.predictedP99Ms) == (2, solo.serverBudgetMs, 12.34)
    body = load_request(spec_with(), shared, GPUPoolSpec.model_validate(POOL_DOC["spec"])).body
    assert '"max_queue_delay_microseconds":"100"' in body["parameters"]["config"]
