"""deploy/argocd/health.lua on Lua 5.1, on BatchedModels saved from the real API server (tests/unit/golden/argocd,
captured by tests/cluster/test_gitops_health.py) and on variations of them that the cluster test cannot produce."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from batchfill.api.reasons import ConditionReason, ConditionType

from ..argocd_health import HEALTH_LUA, argocd_health
from .test_install_paths import _tool, kustomize

GOLDEN = Path(__file__).parent / "golden" / "argocd"
CAPTURED = sorted(GOLDEN.glob("*.json"))


def load(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads((GOLDEN / name).read_text())
    return obj


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def test_the_captured_objects_cover_healthy_progressing_and_degraded() -> None:
    healths = {p.stem.split("-", 1)[1] for p in CAPTURED}
    assert healths == {"healthy", "progressing", "degraded"}


@pytest.mark.parametrize("path", CAPTURED, ids=[p.stem for p in CAPTURED])
def test_each_captured_object_gets_the_health_it_got_on_the_cluster(path: Path) -> None:
    health, _ = argocd_health(json.loads(path.read_text()))
    assert health.lower() == path.stem.split("-", 1)[1]


def test_the_messages_say_why() -> None:
    assert argocd_health(load("00-progressing.json")) == (
        "Progressing", "Waiting for the batchfill operator to write status")  # fmt: skip
    status, message = argocd_health(load("01-progressing.json"))
    assert status == "Progressing"
    assert message.startswith("RollingOut: config ")
    assert message.endswith(": 0/1 pods updated, 0 available")
    assert argocd_health(load("02-healthy.json")) == ("Healthy", "1/1 Triton replicas ready")
    assert argocd_health(load("03-progressing.json"))[1] == (
        "Waiting for the batchfill operator to observe generation 2")  # fmt: skip
    assert argocd_health(load("08-degraded.json")) == (
        "Degraded", "SLAInfeasible: the spec cannot be served; see Planned")  # fmt: skip


def test_a_failing_pod_or_an_sla_at_risk_is_degraded() -> None:
    obj = load("02-healthy.json")
    ready = _condition(obj, ConditionType.READY)
    for reason in (ConditionReason.REPLICAS_FAILING, ConditionReason.SLA_AT_RISK):
        ready.update(status="False", reason=reason, message="1/2 Triton replicas ready; ...")
        assert argocd_health(obj)[0] == "Degraded", reason
    ready.update(reason=ConditionReason.NO_READY_REPLICAS)
    assert argocd_health(obj)[0] == "Progressing"


def test_conditions_of_an_older_generation_are_ignored() -> None:
    obj = load("02-healthy.json")
    obj["metadata"]["generation"] = 2
    obj["status"]["observedGeneration"] = 2  # status observed it, but Ready is the first generation's
    assert argocd_health(obj) == ("Progressing", "Waiting for the Ready condition")


def test_stalled_wins_over_a_true_ready() -> None:
    obj = copy.deepcopy(load("02-healthy.json"))
    obj["status"]["conditions"].append(
        {"type": "Stalled", "status": "True", "reason": "ApplyRejected", "message": "denied", "observedGeneration": 1}
    )
    assert argocd_health(obj) == ("Degraded", "ApplyRejected: denied")


def test_no_status_is_progressing() -> None:
    obj = load("02-healthy.json")
    del obj["status"]
    assert argocd_health(obj)[0] == "Progressing"


@pytest.fixture(scope="module")
def kubectl_tool() -> str:
    return _tool(None, "kubectl", "install kubectl (any version with kustomize v5)")


def test_the_argocd_kustomization_carries_the_one_copy_of_the_health_check(kubectl_tool: str) -> None:
    (cm,) = kustomize(kubectl_tool, "deploy/argocd")
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("ConfigMap", "argocd-cm", "argocd")
    assert cm["data"] == {"resource.customizations.health.batchfill.io_BatchedModel": HEALTH_LUA.read_text()}
