"""Conditions keep lastTransitionTime unless they flip; status is written only when it changes, so a status-only
event or a steady loop writes nothing; a spec that cannot be served names the field in its conditions
(docs/field-cases.md#status-write-loops, docs/field-cases.md#retries)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batchfill.api.errors import SpecError
from batchfill.api.reasons import ConditionReason, ConditionType, SpecReason
from batchfill.api.validate import load_model
from batchfill.controller.desired import desired_state
from batchfill.controller.status import changed_fields, desired_status, rejection_status
from batchfill.policy.conditions import ConditionUpdate, apply_conditions, find, rfc3339
from batchfill.render.kube import CONFIG_HASH_ANNOTATION

from .conftest import CASES_DOC, SEED_DOC

T0, T1 = 1_795_000_000.0, 1_795_000_100.0


def test_transition_time_changes_only_on_a_flip() -> None:
    ready, none_ready = ConditionType.READY, ConditionReason.NO_READY_REPLICAS
    first = apply_conditions(None, [ConditionUpdate(ready, "False", none_ready, "0/1")], generation=1, now=T0)
    same = apply_conditions(first, [ConditionUpdate(ready, "False", none_ready, "0/2")], generation=2, now=T1)
    assert same[0]["lastTransitionTime"] == rfc3339(T0)
    assert same[0]["message"] == "0/2"
    assert same[0]["observedGeneration"] == 2
    flipped = apply_conditions(
        same, [ConditionUpdate(ready, "True", ConditionReason.REPLICAS_READY, "1/1")], generation=2, now=T1
    )
    assert flipped[0]["lastTransitionTime"] == rfc3339(T1)


def test_unchanged_conditions_are_identical_so_nothing_is_written() -> None:
    ups = [
        ConditionUpdate(ConditionType.PLANNED, "True", ConditionReason.PLANNED),
        ConditionUpdate(ConditionType.READY, "True", ConditionReason.REPLICAS_READY),
    ]
    a = apply_conditions(None, ups, generation=3, now=T0)
    b = apply_conditions(a, ups, generation=3, now=T1)
    assert a == b
    assert changed_fields({"conditions": a}, {"conditions": b}) == {}


def test_order_is_stable_and_removal_works() -> None:
    a = apply_conditions(
        None, [ConditionUpdate("A", "True", "X"), ConditionUpdate("B", "True", "Y")], generation=1, now=T0
    )
    b = apply_conditions(a, [ConditionUpdate("B", "False", "Z")], generation=1, now=T1, remove=["A"])
    assert [c["type"] for c in b] == ["B"]
    assert find(b, "B") is not None
    assert find(b, "A") is None


def body(doc: dict[str, Any], generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "m", "namespace": "ml", "uid": "u", "generation": generation},
        "spec": copy.deepcopy(doc["spec"]),
        "status": status or {},
    }


def test_a_rejection_names_the_field_in_conditions() -> None:
    doc = copy.deepcopy(CASES_DOC)
    doc["spec"]["batching"] = {"maxBatchSize": 8, "preferredBatchSizes": [4, 16]}
    with pytest.raises(SpecError) as info:
        load_model(doc)
    status = rejection_status(info.value, {}, 4, T0)
    planned = find(status["conditions"], ConditionType.CONFIG_VALID)
    assert planned is not None
    assert planned["status"] == "False"
    assert planned["reason"] == SpecReason.INVALID_BATCHING
    assert planned["message"] == "spec.batching.preferredBatchSizes[1]=16 exceeds spec.batching.maxBatchSize=8"
    assert status["observedGeneration"] == 4


def served_by(desired: Any, *, replicas: int, ready: int) -> dict[str, Any]:
    """A Deployment whose rollout of ``desired``'s config is complete, as the Deployment controller reports it."""
    template = {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: desired.config_hash}}}
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": replicas, "template": template},
        "status": {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready,
                   "availableReplicas": ready,
                   "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]},
    }  # fmt: skip


def test_reconciled_status_and_idempotence() -> None:
    b = body(SEED_DOC)
    desired = desired_state(b["spec"])
    dep = served_by(desired, replicas=2, ready=1)
    wanted = desired_status(b, desired, dep, now=T0)
    assert wanted["plan"]["maxBatchSize"] == 7
    assert wanted["replicas"] == 2
    assert wanted["readyReplicas"] == 1
    assert find(wanted["conditions"], ConditionType.READY)["status"] == "True"  # type: ignore[index]
    # the same inputs later change nothing: no status write on a status-only event
    # (docs/field-cases.md#status-write-loops)
    b2 = body(SEED_DOC, status=wanted)
    assert changed_fields(b2["status"], desired_status(b2, desired, dep, now=T1)) == {}
    # a changed replica count changes exactly those fields
    again = desired_status(b2, desired, served_by(desired, replicas=3, ready=3), now=T1)
    assert set(changed_fields(b2["status"], again)) == {"replicas", "readyReplicas", "conditions"}


def test_plan_is_cached_by_spec() -> None:
    spec = copy.deepcopy(SEED_DOC["spec"])
    assert desired_state(spec).plan is desired_state(copy.deepcopy(spec)).plan
