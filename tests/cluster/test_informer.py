"""The loops' watch-backed caches of Deployments and pods (``adapters.informer``) on the real API server: after one
LIST they answer every model's reads as GETs and LISTs would, follow changes through the WATCH, list again only
when the watch expires (410 Gone: tests/unit/test_informer.py, a fresh cluster's API server does not expire
watches within a test's time), and say so when they cannot be trusted (never listed, or a broken watch)."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from batchfill.adapters import informer as informer_module
from batchfill.adapters import kube as kube_adapter
from batchfill.adapters.informer import CachedView, ChildCaches, Informer
from batchfill.controller.pods import pod_counts, ready_pod_ips
from batchfill.controller.rollout import rolls_in_place
from batchfill.controller.status import config_hash_managers, replicas_managers
from batchfill.render.kube import CHILDREN_SELECTOR, MODEL_LABEL

from .support import Kube, pause_deployment, pods_of, temp_namespace, wait_for

pytestmark = pytest.mark.cluster


def _child(model: str, replicas: int) -> dict[str, Any]:
    return pause_deployment(
        f"{model}-triton", replicas, labels={"app.kubernetes.io/name": "triton", MODEL_LABEL: model}
    )


def _labels(model: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "triton", MODEL_LABEL: model}


@pytest.fixture
def namespaces(kube: Kube) -> Iterator[tuple[str, str]]:
    with temp_namespace(kube, prefix="bf-inf-") as ns, temp_namespace(kube, prefix="bf-inf-") as other:
        for model, replicas in (("a", 2), ("b", 1)):
            kube.apps.create_namespaced_deployment(ns, _child(model, replicas))
        kube.apps.create_namespaced_deployment(other, _child("a", 1))  # same name, another namespace
        kube.apps.create_namespaced_deployment(ns, pause_deployment("unrelated", 1))
        wait_for("3 + 1 pods", lambda: len(pods_of(kube, ns, "")) == 4 or None, 60)
        wait_for("1 pod", lambda: len(pods_of(kube, other, "")) == 1 or None, 60)
        yield ns, other


@pytest.mark.parametrize("scope", ["cluster", "namespaced"])
def test_the_caches_answer_like_the_api_and_follow_changes(
    kube: Kube, namespaces: tuple[str, str], monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    ns, other = namespaces
    monkeypatch.setattr(informer_module, "LIST_PAGE_SIZE", 1)  # every item on a page of its own: pages are followed
    ours = kube_adapter.Kube(kube.api)
    caches = ChildCaches(ours.watch_client(6), CHILDREN_SELECTOR, (ns, other) if scope == "namespaced" else ())
    caches.start()
    try:
        assert all(i.wait_synced(30) for i in caches.all())
        view = CachedView(ours, caches)
        view.check()

        def pods_match(model: str) -> tuple[list[dict[str, Any]]] | None:
            cached = view.list_pods(ns, _labels(model))
            listed = pods_of(kube, ns, f"app.kubernetes.io/name=triton,{MODEL_LABEL}={model}")
            same = sorted(p["metadata"]["name"] for p in cached) == sorted(p.metadata.name for p in listed)
            return (cached,) if same else None

        for model, replicas in (("a", 2), ("b", 1), ("c", 0)):
            (pods,) = wait_for(f"the cache's pods of {model}", lambda m=model: pods_match(m), 10)
            assert len(pods) == replicas
            dep = view.get("apps/v1", "Deployment", f"{model}-triton", ns)
            direct = ours.get("apps/v1", "Deployment", f"{model}-triton", ns)
            if not replicas:
                assert dep is None
                assert direct is None
                continue
            assert dep is not None
            assert direct is not None
            assert dep["metadata"]["uid"] == direct["metadata"]["uid"]
            assert dep["spec"]["replicas"] == direct["spec"]["replicas"] == replicas
            assert dep["spec"]["template"]["metadata"]["labels"] == direct["spec"]["template"]["metadata"]["labels"]
            # trimmed: the loops' readings of the cached objects equal those of the whole objects
            assert replicas_managers(dep) == replicas_managers(direct)
            assert config_hash_managers(dep) == config_hash_managers(direct)
            assert rolls_in_place(dep) == rolls_in_place(direct)
            assert set(dep["spec"]["template"].get("spec") or {}) <= {"volumes"}  # the config mount, no containers
            assert dep["spec"]["template"].get("spec", {}).get("volumes") == direct["spec"]["template"]["spec"].get(
                "volumes"
            )
            whole = [w for p in pods if (w := ours.get("v1", "Pod", p["metadata"]["name"], ns)) is not None]
            assert pod_counts(pods) == pod_counts(whole)
            assert ready_pod_ips(pods) == ready_pod_ips(whole)
            assert all("spec" not in p for p in pods)
        other_dep = view.get("apps/v1", "Deployment", "a-triton", other)
        assert other_dep is not None
        assert other_dep["metadata"]["namespace"] == other
        assert len(view.list_pods(other, _labels("a"))) == 1
        # not labelled as a child: not cached, still answered (by name)
        assert view.get("apps/v1", "Deployment", "unrelated", ns) is not None

        # changes arrive through the watch, without another LIST
        kube.apps.patch_namespaced_deployment_scale("a-triton", ns, {"spec": {"replicas": 3}})
        kube.apps.delete_namespaced_deployment("b-triton", ns)
        wait_for(
            "the scale-out in the cache",
            lambda: (
                (
                    (view.get("apps/v1", "Deployment", "a-triton", ns) or {}).get("spec", {}).get("replicas") == 3
                    and len(view.list_pods(ns, _labels("a"))) == 3
                )
                or None
            ),
            30,
        )
        wait_for("the deletion in the cache", lambda: view.get("apps/v1", "Deployment", "b-triton", ns) is None, 30)
        wait_for("b's pods gone from the cache", lambda: not view.list_pods(ns, _labels("b")) or None, 60)
        assert [i.lists for i in caches.all()] == [1] * len(caches.all())
    finally:
        caches.stop()


def test_a_cache_the_api_refuses_is_never_trusted(kube: Kube) -> None:
    # credentials the real API server does not accept: the cache is never listed, every read says why
    refused = copy.copy(kube.api.configuration)
    refused.cert_file = refused.key_file = None
    refused.api_key = {"authorization": "Bearer not-a-token"}
    caches = ChildCaches(client.ApiClient(refused), CHILDREN_SELECTOR).start()
    try:
        view = CachedView(kube_adapter.Kube(kube.api), caches)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "401" not in str(caches.pods[""]._error):
            time.sleep(0.1)
        with pytest.raises(kube_adapter.KubeTemporaryError, match=r"not listed yet.*HTTP 401"):
            view.check(("pods",))
        with pytest.raises(kube_adapter.KubeTemporaryError, match="not listed yet"):
            view.list_pods("default", _labels("x"))
    finally:
        caches.stop()


def test_a_broken_watch_makes_the_cache_stale_after_max_stale_s(kube: Kube, namespaces: tuple[str, str]) -> None:
    # The staleness rule on a really listed cache, with the informer's clock the test's: a watch that cannot
    # reconnect keeps its last contents, trusted for max_stale_s, then refused. The failure is recorded as _run
    # records it; breaking a real watch means restarting the API server, which test_chaos.py does (a Deployment
    # deleted after the restart is re-created: the caches watch again).
    ns, _ = namespaces
    now = [0.0]
    informer = Informer(
        kube_adapter.Kube(kube.api).watch_client(2), "pods", ns, CHILDREN_SELECTOR, max_stale_s=30, clock=lambda: now[0]
    )
    informer._relist()
    informer.check()
    with informer._lock:  # what _run records when a WATCH fails
        informer._broken_since, informer._error = now[0], "watch pods: API unreachable"
    now[0] = 29.0
    informer.check()  # still current: reconnecting
    assert len(informer.items(ns)) == 3
    now[0] = 31.0
    with pytest.raises(kube_adapter.KubeTemporaryError, match="watch broken for 31 s: watch pods: API unreachable"):
        informer.check()
