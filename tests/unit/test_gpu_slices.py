"""GPU slices (nvidia.com/mig-* or any configured extended resource) as a replica's GPU: rendered in the pod's
requests and limits, instance groups KIND_GPU, and GPU-hours counted in units of that resource."""

from __future__ import annotations

import pytest

from batchfill.controller.rollout import SURGE_BLOCKED_AFTER_S, gpu_blocked_since, in_place_reason
from batchfill.render import render_model_config
from batchfill.render.kube import build_deployment

from .test_controller_loops import T0
from .test_render_kube import OWNER, container, spec_with
from .test_render_model_config import make_plan
from .test_rollout import _dep, _pending

MIG = "nvidia.com/mig-1g.10gb"


@pytest.mark.parametrize("slices", [1, 2])
def test_a_mig_slice_is_requested_and_limited(slices: int) -> None:
    spec = spec_with(gpuResource=MIG, gpusPerReplica=slices, resources={"limits": {"memory": "4Gi"}})
    res = container(build_deployment(OWNER, spec, "h", 1))["resources"]
    assert res["limits"] == {"memory": "4Gi", MIG: str(slices)}
    assert res["requests"] == {MIG: str(slices)}
    assert "nvidia.com/gpu" not in str(res)


def test_a_user_quantity_of_the_slice_is_replaced_by_the_count() -> None:
    spec = spec_with(gpuResource=MIG, gpusPerReplica=1, resources={"limits": {MIG: 1}, "requests": {MIG: 1}})
    res = container(build_deployment(OWNER, spec, "h", 1))["resources"]
    assert res == {"limits": {MIG: "1"}, "requests": {MIG: "1"}}


def test_instance_groups_stay_kind_gpu_on_a_slice() -> None:
    spec = spec_with(gpuResource=MIG, gpusPerReplica=1)
    text = render_model_config(spec, make_plan(8, [8], 1000, instanceCount=2))
    assert text.endswith("instance_group {\n  count: 2\n  kind: KIND_GPU\n}\n")


def test_a_surge_pod_blocked_for_a_mig_slice_turns_the_rollout_in_place() -> None:
    rolling = _dep(total=3, updated=1)
    pods = [_pending(T0 - SURGE_BLOCKED_AFTER_S - 1, f"0/2 nodes are available: 2 Insufficient {MIG}.")]
    assert gpu_blocked_since(pods) is None, "nvidia.com/gpu is not what these pods wait for"
    assert gpu_blocked_since(pods, MIG) == T0 - SURGE_BLOCKED_AFTER_S - 1
    reason = in_place_reason(rolling, pods, T0, MIG)
    assert f"no free {MIG}" in reason
