"""The loops' per-pass read view (``adapters.kube.PassSnapshot``) on the real API server: it answers every
model's Deployment and pod reads as plain GETs and LISTs would, from one LIST per namespace and kind."""

from __future__ import annotations

from typing import Any

import pytest

from batchfill.adapters import kube as kube_adapter
from batchfill.render.kube import CHILDREN_SELECTOR, MODEL_LABEL

from .support import Kube, pause_deployment, pods_of, temp_namespace, wait_for

pytestmark = pytest.mark.cluster


def _child(model: str, replicas: int) -> dict[str, Any]:
    return pause_deployment(
        f"{model}-triton", replicas, labels={"app.kubernetes.io/name": "triton", MODEL_LABEL: model}
    )


def test_a_pass_reads_every_models_children_with_one_list_per_namespace_and_kind(
    kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = kube_adapter.Kube(kube.api)
    with temp_namespace(kube, prefix="bf-snap-") as ns:
        for model, replicas in (("a", 2), ("b", 1)):
            kube.apps.create_namespaced_deployment(ns, _child(model, replicas))
        kube.apps.create_namespaced_deployment(ns, pause_deployment("unrelated", 1))
        wait_for("3 + 1 pods", lambda: len(pods_of(kube, ns, "")) == 4 or None, 60)

        calls: list[str] = []
        for name in ("list_pods", "list_deployments"):
            real = getattr(kube_adapter.Kube, name)
            monkeypatch.setattr(
                kube_adapter.Kube, name, lambda self, *a, _r=real, _n=name: (calls.append(_n), _r(self, *a))[1]
            )
        view = ours.snapshot(CHILDREN_SELECTOR)
        for model, replicas in (("a", 2), ("b", 1), ("c", 0)):
            labels = {"app.kubernetes.io/name": "triton", MODEL_LABEL: model}
            pods = view.list_pods(ns, labels)
            assert sorted(p["metadata"]["name"] for p in pods) == sorted(
                p.metadata.name for p in pods_of(kube, ns, f"app.kubernetes.io/name=triton,{MODEL_LABEL}={model}")
            )
            assert len(pods) == replicas
            dep = view.get("apps/v1", "Deployment", f"{model}-triton", ns)
            direct = ours.get("apps/v1", "Deployment", f"{model}-triton", ns)
            if replicas:
                assert dep is not None
                assert direct is not None
                assert dep["metadata"]["uid"] == direct["metadata"]["uid"]
                assert dep["spec"]["replicas"] == direct["spec"]["replicas"] == replicas
                assert dep["spec"]["template"]["metadata"]["labels"] == direct["spec"]["template"]["metadata"]["labels"]
            else:
                assert dep is None
                assert direct is None
        # one LIST of each kind for the three models
        assert calls == ["list_pods", "list_deployments"]
        # a Deployment of another app is not in the view, but is still answered (by name)
        assert view.get("apps/v1", "Deployment", "unrelated", ns) is not None
