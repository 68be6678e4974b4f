"""The loops' per-pass read view (``adapters.kube.PassSnapshot``) on the real API server: it answers every
model's Deployment and pod reads as plain GETs and LISTs would, from one paginated LIST per kind (across the
cluster, or per namespace for a namespaced install), with the objects trimmed to the fields the loops read."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client

from batchfill.adapters import kube as kube_adapter
from batchfill.reconcile import pod_counts, ready_pod_ips, replicas_managers
from batchfill.render.kube import CHILDREN_SELECTOR, MODEL_LABEL

from .support import Kube, pause_deployment, pods_of, temp_namespace, wait_for

pytestmark = pytest.mark.cluster


def _child(model: str, replicas: int) -> dict[str, Any]:
    return pause_deployment(
        f"{model}-triton", replicas, labels={"app.kubernetes.io/name": "triton", MODEL_LABEL: model}
    )


@pytest.mark.parametrize("scope", ["cluster", "namespaced"])
def test_a_pass_reads_every_models_children_with_one_paginated_list_per_kind(
    kube: Kube, monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    ours = kube_adapter.Kube(kube.api)
    with temp_namespace(kube, prefix="bf-snap-") as ns, temp_namespace(kube, prefix="bf-snap-") as other:
        for model, replicas in (("a", 2), ("b", 1)):
            kube.apps.create_namespaced_deployment(ns, _child(model, replicas))
        kube.apps.create_namespaced_deployment(other, _child("a", 1))  # same name, another namespace
        kube.apps.create_namespaced_deployment(ns, pause_deployment("unrelated", 1))
        wait_for("3 + 1 pods", lambda: len(pods_of(kube, ns, "")) == 4 or None, 60)
        wait_for("1 pod", lambda: len(pods_of(kube, other, "")) == 1 or None, 60)

        calls: list[tuple[str, str]] = []
        pages: list[str] = []
        real_list, real_page = kube_adapter.PassSnapshot._list_paged, kube_adapter._page
        monkeypatch.setattr(
            kube_adapter.PassSnapshot,
            "_list_paged",
            lambda self, kind, namespace: (calls.append((kind, namespace)), real_list(self, kind, namespace))[1],
        )
        monkeypatch.setattr(kube_adapter, "_page", lambda resp, what: (pages.append(what), real_page(resp, what))[1])
        monkeypatch.setattr(kube_adapter, "LIST_PAGE_SIZE", 1)  # every item on a page of its own
        view = ours.snapshot(CHILDREN_SELECTOR, (ns, other) if scope == "namespaced" else ())
        view.prefetch()
        for model, replicas in (("a", 2), ("b", 1), ("c", 0)):
            labels = {"app.kubernetes.io/name": "triton", MODEL_LABEL: model}
            pods = view.list_pods(ns, labels)
            listed = pods_of(kube, ns, f"app.kubernetes.io/name=triton,{MODEL_LABEL}={model}")
            assert sorted(p["metadata"]["name"] for p in pods) == sorted(p.metadata.name for p in listed)
            assert len(pods) == replicas
            dep = view.get("apps/v1", "Deployment", f"{model}-triton", ns)
            direct = ours.get("apps/v1", "Deployment", f"{model}-triton", ns)
            if replicas:
                assert dep is not None
                assert direct is not None
                assert dep["metadata"]["uid"] == direct["metadata"]["uid"]
                assert dep["spec"]["replicas"] == direct["spec"]["replicas"] == replicas
                assert dep["spec"]["template"]["metadata"]["labels"] == direct["spec"]["template"]["metadata"]["labels"]
                assert dep["status"] == direct["status"]
                # trimmed: what the loops read gives the same answers as the whole objects
                assert replicas_managers(dep) == replicas_managers(direct)
                assert "template" not in dep["spec"] or "spec" not in dep["spec"]["template"]
                whole = [ours.get("v1", "Pod", p["metadata"]["name"], ns) for p in pods]
                assert pod_counts(pods) == pod_counts([w for w in whole if w is not None])
                assert ready_pod_ips(pods) == ready_pod_ips([w for w in whole if w is not None])
                assert all("spec" not in p for p in pods)
            else:
                assert dep is None
                assert direct is None
        other_dep = view.get("apps/v1", "Deployment", "a-triton", other)
        assert other_dep is not None
        assert other_dep["metadata"]["namespace"] == other
        assert len(view.list_pods(other, {MODEL_LABEL: "a"})) == 1
        # one LIST per kind (and scope), however many models read it; one request per page
        expected = [("pods", ""), ("deployments", "")] if scope == "cluster" else [
            ("pods", ns), ("pods", other), ("deployments", ns), ("deployments", other)
        ]  # fmt: skip
        assert calls == expected
        assert len(pages) >= 4 + 3, pages  # 4 pods and 3 Deployments of ours, each on a page of its own
        # a Deployment of another app is not in the view, but is still answered (by name)
        assert view.get("apps/v1", "Deployment", "unrelated", ns) is not None


def test_a_failed_list_fails_the_pass_once_without_asking_again(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real API server refuses the LIST (credentials it does not accept): every later read of the pass gets the
    # same error without another request, so an outage costs one request per kind and pass, not one per model.
    refused = copy.copy(kube.api.configuration)
    refused.cert_file = refused.key_file = None
    refused.api_key = {"authorization": "Bearer not-a-token"}
    ours = kube_adapter.Kube(client.ApiClient(refused))
    calls: list[str] = []
    real_list = kube_adapter.PassSnapshot._list_paged
    monkeypatch.setattr(
        kube_adapter.PassSnapshot,
        "_list_paged",
        lambda self, kind, namespace: (calls.append(kind), real_list(self, kind, namespace))[1],
    )
    view = ours.snapshot(CHILDREN_SELECTOR)
    with pytest.raises(kube_adapter.KubePermanentError, match=r"HTTP 401"):
        view.prefetch(("pods",))
    for _ in range(5):  # every model of the pass
        with pytest.raises(kube_adapter.KubePermanentError):
            view.list_pods("default", {MODEL_LABEL: "x"})
    assert calls == ["pods"]
