"""batchfill.adapters.kube: what the API's answers become for the controller."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest


def test_apply_of_a_kind_discovery_no_longer_serves_is_a_not_found_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ServiceMonitor applied after its CRD was deleted: kubernetes.dynamic's discovery raises
    ResourceNotFoundError (not an HTTP error); the adapter answers KubeNotFoundError, which the controller
    handles (controller.reconcile.apply_service_monitor), instead of a traceback in the loop."""
    from kubernetes import client
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    from batchfill.adapters.kube import Kube, KubeNotFoundError
    from batchfill.controller.reconcile import apply_service_monitor

    kube = Kube(client.ApiClient())

    def gone(api_version: str, kind: str) -> None:
        raise ResourceNotFoundError(f"No matches found for {{'api_version': '{api_version}', 'kind': '{kind}'}}")

    monkeypatch.setattr(kube, "_resource", gone)
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m-triton", "namespace": "ns"},
    }
    with pytest.raises(KubeNotFoundError, match=r"ServiceMonitor ns/m-triton.*not served"):
        kube.apply(monitor)
    monkeypatch.setattr(kube, "forget_kinds", lambda: None)
    assert apply_service_monitor(kube, monitor) is False


class _Api:
    """A one-route HTTP server standing in for the API server: records each request, answers ``status``."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.status = 200
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                api.requests.append((self.command, self.path, dict(self.headers), body))
                self.send_response(api.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                reason = {409: "Conflict", 503: "ServiceUnavailable", 404: "NotFound", 422: "Invalid"}
                status = {"kind": "Status", "code": api.status, "reason": reason.get(api.status, "")}
                self.wfile.write(json.dumps(status if api.status >= 400 else {"kind": "Pod"}).encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def api() -> Iterator[_Api]:
    server = _Api()
    yield server
    server.server.shutdown()


def test_a_pod_label_patch_is_one_merge_patch_under_the_resource_version(api: _Api) -> None:
    """Kube.patch_pod_metadata over HTTP: one PATCH, application/merge-patch+json, the resourceVersion precondition in
    the body, None as JSON null (RFC 7386: delete the key); the API's refusals classified like the other calls."""
    from kubernetes import client

    from batchfill.adapters.kube import Kube, KubeNotFoundError, KubePermanentError, KubeTemporaryError
    from batchfill.render.kube import FIELD_MANAGER

    kube = Kube(client.ApiClient(client.Configuration(host=api.host)))
    labels = {"models.batchfill.io/bm-a": "loaded", "models.batchfill.io/bm-b": None}
    notes = {"models.batchfill.io/bm-a": "0123abcd", "models.batchfill.io/bm-b": None}
    kube.patch_pod_metadata("p0", "ml", "4711", labels, notes)
    ((method, path, headers, body),) = api.requests
    assert (method, path) == ("PATCH", f"/api/v1/namespaces/ml/pods/p0?fieldManager={FIELD_MANAGER}")
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert json.loads(body) == {"metadata": {"resourceVersion": "4711", "labels": labels, "annotations": notes}}

    for status, error in [(409, KubeTemporaryError), (503, KubeTemporaryError), (404, KubeNotFoundError),
                          (422, KubePermanentError)]:  # fmt: skip
        api.status = status
        with pytest.raises(error, match=rf"patch pod ml/p0: HTTP {status}") as caught:
            kube.patch_pod_metadata("p0", "ml", "4711", labels, notes)
        if status == 409:
            assert caught.value.delay_s == 1.0  # type: ignore[attr-defined]
        if status == 422:
            assert not isinstance(caught.value, KubeTemporaryError)
    assert len(api.requests) == 5  # one request per call: no retries inside the adapter


def test_apply_all_applies_at_once_and_raises_the_first_error_after_all_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kube.apply_all: the objects' applies overlap (a new model's handler waits for the slowest, not the sum), the
    results come back in order, and an error is raised only once every apply has ended: the first in order."""
    import threading
    import time

    from kubernetes import client

    from batchfill.adapters.kube import Kube, KubePermanentError, KubeTemporaryError

    kube = Kube(client.ApiClient())
    lock, state = threading.Lock(), {"now": 0, "most": 0, "ended": 0}

    def apply(obj: dict[str, object]) -> dict[str, object]:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.2)
        with lock:
            state["now"] -= 1
            state["ended"] += 1
        if obj["kind"] == "Service":
            raise KubePermanentError("apply Service ns/m: HTTP 422: invalid")
        if obj["kind"] == "Deployment":
            raise KubeTemporaryError("apply Deployment ns/m: HTTP 409: conflict")
        return {**obj, "applied": True}

    monkeypatch.setattr(kube, "apply", apply)
    kinds = [{"kind": "ConfigMap"}, {"kind": "Secret"}, {"kind": "Pod"}]
    assert kube.apply_all(kinds) == [{**k, "applied": True} for k in kinds]
    assert state["most"] == 3, "the three applies were in flight together"
    state["ended"] = 0
    with pytest.raises(KubeTemporaryError, match="Deployment"):
        kube.apply_all([{"kind": "ConfigMap"}, {"kind": "Deployment"}, {"kind": "Service"}])
    assert state["ended"] == 3, "raised once every apply had ended"
