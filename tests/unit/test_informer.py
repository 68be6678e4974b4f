"""How an informer applies watch events to its cache (``adapters.informer.Informer._apply``), without a server.

The cluster tests (tests/cluster/test_informer.py) check the informer against the real API server; the events here
are the ones a fresh cluster does not send within a test's time (410 Gone) and the bookkeeping of each type.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from batchfill.adapters.informer import GoneError, Informer
from batchfill.adapters.kube import KubeTemporaryError
from batchfill.render.pool import loaded_label


def _pod(name: str, ns: str = "ml", rv: str = "5", ready: str = "True") -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"u-{name}", "resourceVersion": rv, "labels": {"a": "b"},
                     "managedFields": [{"manager": "kubelet"}]},
        "spec": {"containers": [{"name": "triton", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": ready}]},
    }  # fmt: skip


@pytest.fixture
def informer() -> Informer:
    return Informer(client.ApiClient(client.Configuration()), "pods", "", "app=x")


def test_a_cached_pod_keeps_its_resource_version_and_only_the_pools_model_annotations(informer: Informer) -> None:
    """The pool loop patches labels under the resourceVersion it read and reads each label's config annotation."""
    pod = _pod("p1", rv="42")
    key = loaded_label("bm-a")
    pod["metadata"]["annotations"] = {key: "0123abcd", "prometheus.io/scrape": "true", "big": "x" * 10_000}
    informer._apply({"type": "ADDED", "object": pod}, "1")
    cached = informer.get("ml", "p1")
    assert cached is not None
    assert cached["metadata"]["resourceVersion"] == "42"
    assert cached["metadata"]["annotations"] == {key: "0123abcd"}
    informer._apply({"type": "ADDED", "object": _pod("p2")}, "42")
    assert "annotations" not in informer.get("ml", "p2")["metadata"]  # type: ignore[index]


def test_added_modified_deleted_and_bookmarks(informer: Informer) -> None:
    assert informer._apply({"type": "ADDED", "object": _pod("p1")}, "1") == "5"
    assert informer._apply({"type": "ADDED", "object": _pod("p2", rv="6")}, "5") == "6"
    cached = informer.get("ml", "p1")
    assert cached is not None
    assert "spec" not in cached, "trimmed to what the loops read"
    assert "managedFields" not in cached["metadata"]
    assert informer._apply({"type": "MODIFIED", "object": _pod("p1", rv="7", ready="False")}, "6") == "7"
    assert informer.get("ml", "p1")["status"]["conditions"] == [{"type": "Ready", "status": "False"}]  # type: ignore[index]
    assert (
        informer._apply({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}}, "7")
        == "9"
    )
    assert len(informer) == 2
    assert informer._apply({"type": "DELETED", "object": _pod("p2", rv="10")}, "9") == "10"
    assert [p["metadata"]["name"] for p in informer.items("ml")] == ["p1"]
    assert informer.items("other") == []
    assert informer._apply({"type": "DELETED", "object": _pod("never-seen", rv="11")}, "10") == "11"
    assert informer._apply("not an event", "11") == "11"


def test_an_expired_watch_asks_for_a_new_list(informer: Informer) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    with pytest.raises(GoneError):
        informer._apply(gone, "5")
    other = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "InternalError", "message": "x"}}
    with pytest.raises(KubeTemporaryError, match="500 InternalError: x"):
        informer._apply(other, "5")


def test_a_cache_never_listed_is_not_trusted(informer: Informer) -> None:
    with pytest.raises(KubeTemporaryError, match="pods in all namespaces: not listed yet"):
        informer.check()
    with pytest.raises(ValueError, match="no informer for kind 'services'"):
        Informer(client.ApiClient(client.Configuration()), "services", "", "")
