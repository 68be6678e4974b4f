"""Plan warnings reach the BatchedModel's status and one event (controller.status, controller.reconcile), through the
fake API server of test_controller_loops."""

from __future__ import annotations

from batchfill.api.reasons import ConditionType, EventReason, PlanWarningReason
from batchfill.policy.conditions import find

from .test_controller_loops import SCALING_SPEC, FakeKube, stored


def test_a_plan_warning_reaches_the_planned_condition_and_one_event() -> None:
    """Issue 15 item 6: `batchfill plan` printed MaxBatchSizeCapped; the cluster accepted the spec silently."""
    kube = FakeKube()
    spec = {**SCALING_SPEC, "batching": {"maxBatchSize": 64}}  # the profile stops at 16
    kube.create_model("w", spec)
    kube.handle("w")
    planned = find(stored(kube, "w")["status"]["conditions"], ConditionType.PLANNED)
    assert planned is not None
    assert (planned["status"], planned["reason"]) == ("True", PlanWarningReason.MAX_BATCH_SIZE_CAPPED)
    assert "warning: spec.batching.maxBatchSize=64 exceeds the largest profiled batch size 16" in planned["message"]
    assert [e[1] for e in kube.events] == [EventReason.DEPLOYED, PlanWarningReason.MAX_BATCH_SIZE_CAPPED]
    kube.events.clear()
    kube.handle("w")  # a resume: no second event
    assert PlanWarningReason.MAX_BATCH_SIZE_CAPPED not in [e[1] for e in kube.events]
