"""GitOps health on the real API server: Argo CD's Lua health check (deploy/argocd/health.lua, on Lua 5.1) run on
every status the operator writes while a model is created, edited (a rollout) and given an SLA no plan meets.

The objects are the API server's, as the operator wrote them: Progressing while the Deployment rolls out or the
operator has not observed the edit, Healthy once the pods serve the plan's config, Degraded for the infeasible SLA.
``BATCHFILL_HEALTH_CAPTURE=<dir>`` saves each distinct (trimmed) object there: the fixtures of
tests/unit/test_argocd_health.py come from such a run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchfill.api.reasons import ConditionReason, ConditionType, SpecReason
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.testbed.install import install_operator_rbac

from ..argocd_health import argocd_health, trimmed
from .support import Kube, Operator, model_volume, require_gpus, temp_namespace
from .test_operator import batched_model, condition, custom, get_bm

pytestmark = pytest.mark.cluster

CAPTURE = os.environ.get("BATCHFILL_HEALTH_CAPTURE", "")


@pytest.fixture
def operator(kube: Kube, tmp_path: Path) -> Iterator[Operator]:
    install_operator_rbac(kube.kubeconfig, tmp_path)
    op = Operator(kube, tmp_path, env={"BATCHFILL_RECONCILE_INTERVAL_SECONDS": "2"}, args=("--verbose",))
    op.start()
    try:
        yield op
    finally:
        op.stop()


class Watcher:
    """Reads the model every 0.2 s and runs the health check on each new resourceVersion."""

    def __init__(self, kube: Kube, ns: str, name: str) -> None:
        self.kube, self.ns, self.name = kube, ns, name
        self.seen: list[tuple[str, str, dict[str, Any]]] = []  # (health, message, object)
        self._version = ""

    def until(self, health: str, timeout_s: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            bm = get_bm(self.kube, self.ns, self.name)
            if bm["metadata"]["resourceVersion"] != self._version:
                self._version = bm["metadata"]["resourceVersion"]
                status, message = argocd_health(bm)
                self.seen.append((status, message, bm))
                if status == health:
                    return bm
            time.sleep(0.2)
        pytest.fail(f"no {health} within {timeout_s:.0f} s; seen: {[(h, m) for h, m, _ in self.seen][-8:]}")

    def since(self, start: int) -> list[str]:
        return [h for h, _, _ in self.seen[start:]]


def test_argo_cd_health_follows_the_real_status_through_rollouts_and_an_infeasible_sla(
    kube: Kube, operator: Operator
) -> None:
    require_gpus(kube)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("gitops"))
        watch = Watcher(kube, ns, "gitops")
        healthy = watch.until("Healthy")
        created = [(h, b) for h, _, b in watch.seen]
        rolling = [b for h, b in created if h == "Progressing" and condition(b, ConditionType.PROGRESSING)]
        assert rolling, f"no status of the first rollout read as Progressing: {[h for h, _ in created]}"
        assert any((condition(b, ConditionType.PROGRESSING) or {}).get("status") == "True" for b in rolling)
        assert (condition(healthy, ConditionType.READY) or {}).get("status") == "True"
        assert (condition(healthy, ConditionType.PROGRESSING) or {}).get("reason") == ConditionReason.ROLLOUT_COMPLETE

        start = len(watch.seen)
        custom(kube).patch_namespaced_custom_object(  # a new plan: the Deployment rolls to its config
            GROUP, VERSION, ns, PLURAL, "gitops", {"spec": {"sla": {"latencyP99Ms": 70, "networkOverheadMs": 10}}}
        )
        watch.until("Healthy")
        edited = watch.since(start)
        assert "Progressing" in edited[:-1], f"the rollout of the edit was never Progressing: {edited}"
        assert "Degraded" not in edited

        start = len(watch.seen)
        custom(kube).patch_namespaced_custom_object(  # a 5 ms server budget: below l(1) = 10 ms
            GROUP, VERSION, ns, PLURAL, "gitops", {"spec": {"sla": {"latencyP99Ms": 15, "networkOverheadMs": 10}}}
        )
        degraded = watch.until("Degraded", 60)
        assert (condition(degraded, ConditionType.READY) or {}).get("reason") == SpecReason.SLA_INFEASIBLE
        assert (condition(degraded, ConditionType.STALLED) or {}).get("status") == "True"
        assert "Healthy" not in watch.since(start)
        if CAPTURE:
            _capture(Path(CAPTURE), watch.seen)


def _capture(directory: Path, seen: list[tuple[str, str, dict[str, Any]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, (health, _, bm) in enumerate(seen):
        (directory / f"{i:02d}-{health.lower()}.json").write_text(json.dumps(trimmed(bm), indent=1, sort_keys=True))
