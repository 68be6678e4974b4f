"""Rollouts on a GPU-tight cluster (controller.rollout): a surge pod that cannot be scheduled for want of GPUs
turns the rollout in place, and the surge strategy comes back once it is complete; the scaling tick does both
through the fake API server of test_controller_loops."""

from __future__ import annotations

from typing import Any

from batchfill.api.reasons import EventReason
from batchfill.controller.rollout import (
    SURGE_BLOCKED_AFTER_S,
    gpu_blocked_since,
    in_place_reason,
    keeps_rolling_in_place,
    rollout_in_progress,
)
from batchfill.policy.conditions import rfc3339

from .test_controller_loops import (
    DEPLOYMENT,
    LOW,
    NS,
    SCALING_SPEC,
    T0,
    FakeKube,
    FakePrometheus,
    planned_model,
    scaling_loop,
)

UNSCHEDULABLE = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def _dep(*, generation: int = 2, observed: int = 2, replicas: int = 2, updated: int = 2, total: int = 2,
         surge: int = 1) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas, "strategy": {"rollingUpdate": {"maxSurge": surge, "maxUnavailable": 1 - surge}}},
        "status": {"observedGeneration": observed, "updatedReplicas": updated, "replicas": total},
    }


def _pending(since: float, message: str = UNSCHEDULABLE) -> dict[str, Any]:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastTransitionTime": rfc3339(since)}  # fmt: skip
    return {"metadata": {"name": "surge"}, "status": {"phase": "Pending", "conditions": [cond]}}


def test_a_rollout_is_in_progress_while_old_pods_remain_or_new_ones_are_missing() -> None:
    assert not rollout_in_progress(_dep())
    assert rollout_in_progress(_dep(total=3, updated=1))  # 2 old + 1 surge
    assert rollout_in_progress(_dep(observed=1))
    assert rollout_in_progress(_dep(updated=1, total=1))
    # a scale-out to 3 whose new pod is Pending runs the newest template already: no rollout
    assert not rollout_in_progress(_dep(replicas=3, updated=3, total=3))


def test_a_surge_pod_blocked_for_gpus_long_enough_turns_the_rollout_in_place() -> None:
    rolling = _dep(total=3, updated=1)
    pods = [_pending(T0 - SURGE_BLOCKED_AFTER_S - 1)]
    assert gpu_blocked_since(pods) == T0 - SURGE_BLOCKED_AFTER_S - 1
    assert "rolling in place" in in_place_reason(rolling, pods, T0)
    assert in_place_reason(rolling, [_pending(T0 - 5)], T0) == "", "a GPU may still free up"
    assert in_place_reason(_dep(), pods, T0) == "", "a Pending pod of a scale-out is no stalled rollout"
    other = [_pending(T0 - 100, "0/2 nodes are available: 2 Insufficient memory.")]
    assert in_place_reason(rolling, other, T0) == "", "not for want of GPUs"
    assert in_place_reason(_dep(total=3, updated=1, surge=0), pods, T0) == "", "already in place"
    assert keeps_rolling_in_place(_dep(total=3, updated=1, surge=0))
    assert not keeps_rolling_in_place(_dep(surge=0))


def test_the_tick_rolls_in_place_then_restores_the_surge_strategy() -> None:
    kube = FakeKube()
    pods = planned_model(kube, "m", SCALING_SPEC)
    dep = kube.objects[(*DEPLOYMENT, NS, "m-triton")]
    # a config change rolls: the surge pod cannot be scheduled (no free GPU) since 40 s ago
    dep["status"] |= {"replicas": 2, "updatedReplicas": 1}
    kube.pods[(NS, "m-triton-new-0")] = {
        **_pending(T0 - 40),
        "metadata": {"name": "m-triton-new-0", "namespace": NS, "uid": "uid-surge",
                     "labels": dict(dep["spec"]["template"]["metadata"]["labels"])},
    }  # fmt: skip
    prom = FakePrometheus()
    prom.serve(pods, **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    strategy = kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 0, "maxUnavailable": 1}
    assert [e[1] for e in kube.events].count(EventReason.ROLLING_IN_PLACE) == 1

    # mid-rollout the handler reconciles again (e.g. an operator restart): still in place
    kube.objects[(*DEPLOYMENT, NS, "m-triton")]["status"] |= {"replicas": 1, "updatedReplicas": 0}
    kube.handle("m")
    assert kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0

    # the old pod went, the new one took its GPU: complete, and the next tick restores the surge
    del kube.pods[(NS, "m-triton-new-0")]
    dep = kube.objects[(*DEPLOYMENT, NS, "m-triton")]
    dep["status"] |= {"replicas": 1, "updatedReplicas": 1, "observedGeneration": dep["metadata"]["generation"]}
    kube.events.clear()
    loop.tick(T0 + 15)
    assert kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1, "maxUnavailable": 0}  # fmt: skip
    assert EventReason.ROLLING_IN_PLACE not in [e[1] for e in kube.events]
