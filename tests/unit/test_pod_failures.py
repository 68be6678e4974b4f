"""Which Triton pods will not become Ready by waiting, from pod statuses as the kubelet writes them
(controller.status.pod_failure / pod_counts), and what the Ready condition says about them."""

from __future__ import annotations

from typing import Any

from batchfill.api.reasons import ConditionReason, ConditionType, ScalingReason
from batchfill.controller.pods import pod_counts, pod_failure
from batchfill.controller.readiness import NAMED_FAILING_PODS, ready_condition
from batchfill.policy.conditions import find

from .test_controller_loops import (
    CRASH_LOOP,
    DEPLOYMENT,
    FIELD_MANAGER,
    HIGH,
    NS,
    SCALING_SPEC,
    T0,
    FakeKube,
    FakePrometheus,
    planned_model,
    replicas,
    scaling_loop,
    stored,
)


def _pod(name: str, *, ready: bool = False, phase: str = "Running", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
            **status,
        },
    }


OOM_KILLED_NOW = {
    "name": "triton",
    "ready": False,
    "restartCount": 0,
    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
}
LOADING = {"name": "triton", "ready": False, "started": False, "restartCount": 0, "state": {"running": {}}}
BAD_IMAGE = {
    "name": "assemble-model-repository",
    "ready": False,
    "restartCount": 0,
    "state": {"waiting": {"reason": "ErrImagePull", "message": 'failed to pull and unpack image "nvcr.io/x"'}},
}


def test_a_crash_looping_model_load_names_the_container_exit_code_and_restarts() -> None:
    assert pod_failure(_pod("a", containerStatuses=[CRASH_LOOP])) == (
        "CrashLoopBackOff (triton: Error with exit code 1, 3 restarts)"
    )


def test_an_oom_kill_an_init_container_that_cannot_start_and_an_eviction_fail() -> None:
    assert pod_failure(_pod("b", containerStatuses=[OOM_KILLED_NOW])) == "OOMKilled (triton exited with exit code 137)"
    why = pod_failure(_pod("c", phase="Pending", initContainerStatuses=[BAD_IMAGE], containerStatuses=[LOADING]))
    assert why.startswith("ErrImagePull (init container assemble-model-repository: failed to pull")
    evicted = _pod("d", phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    assert pod_failure(evicted) == "Evicted: The node was low on resource: memory."


def test_a_model_still_loading_or_a_container_still_creating_is_not_failing() -> None:
    assert pod_failure(_pod("e", containerStatuses=[LOADING])) == ""
    creating = {"name": "triton", "ready": False, "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert pod_failure(_pod("f", phase="Pending", containerStatuses=[creating])) == ""
    assert pod_failure(_pod("g")) == ""  # no statuses yet


def test_pod_counts_keep_failing_pods_apart_from_starting_and_ready() -> None:
    pods = [
        _pod("m-2", containerStatuses=[CRASH_LOOP]),
        _pod("m-1", ready=True),
        _pod("m-3", containerStatuses=[LOADING]),
        _pod("m-0", containerStatuses=[OOM_KILLED_NOW]),
    ]
    counts = pod_counts(pods)
    assert counts.ready == {"m-1"}
    assert counts.starting == 1
    assert counts.failing == (
        "m-0: OOMKilled (triton exited with exit code 137)",
        "m-2: CrashLoopBackOff (triton: Error with exit code 1, 3 restarts)",
    )


def test_the_ready_condition_names_the_failing_pods() -> None:
    failing = [f"m-{i}: CrashLoopBackOff (triton: Error with exit code 1, 2 restarts)" for i in range(5)]
    c = ready_condition(0, 5, failing)
    assert (c.status, c.reason) == ("False", ConditionReason.REPLICAS_FAILING)
    assert c.message.startswith("0/5 Triton replicas ready; 5 failing, no capacity until fixed: m-0: CrashLoopBackOff")
    assert c.message.count("CrashLoopBackOff") == NAMED_FAILING_PODS
    assert c.message.endswith("; and 2 more")
    c = ready_condition(1, 2, failing[:1])
    assert (c.status, c.reason) == ("False", ConditionReason.REPLICAS_FAILING), "a failing pod: not Ready"
    assert ready_condition(2, 2, []).reason == ConditionReason.REPLICAS_READY


def test_a_tick_names_a_crash_looping_pod_in_ready_and_makes_up_for_it() -> None:
    kube = FakeKube()
    planned_model(kube, "m", SCALING_SPEC)
    dep = kube.objects[(*DEPLOYMENT, NS, "m-triton")]
    kube.set_replicas(dep, 2, FIELD_MANAGER, subresource="scale")
    pods = kube.run_pods("m", ready=1, failing=1)
    prom = FakePrometheus()
    prom.serve(pods[:1], **HIGH)  # only the Ready pod serves: saturated
    scaling_loop(kube, prom).tick(T0)
    status = stored(kube, "m")["status"]
    ready = find(status["conditions"], ConditionType.READY)
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", ConditionReason.REPLICAS_FAILING)
    assert find(status["conditions"], ConditionType.STALLED)["reason"] == ConditionReason.REPLICAS_FAILING  # type: ignore[index]
    assert f"{pods[1]}: CrashLoopBackOff (triton: Error with exit code 1, 3 restarts)" in ready["message"]
    # the crash-looping replica is not capacity on the way: one more beside the two the load needs
    assert (status["lastScaleReason"], replicas(kube, "m")) == (ScalingReason.SCALE_OUT_SATURATED, 3)


def test_a_model_that_fails_to_load_on_every_pod_holds_and_says_which_pods() -> None:
    kube = FakeKube()
    planned_model(kube, "m", SCALING_SPEC)
    pods = kube.run_pods("m", ready=0, failing=1)
    scaling_loop(kube, FakePrometheus()).tick(T0)
    status = stored(kube, "m")["status"]
    ready = find(status["conditions"], ConditionType.READY)
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", ConditionReason.REPLICAS_FAILING)
    assert pods[0] in ready["message"]
    assert replicas(kube, "m") == 1
