"""batchfill.adapters.kube: what the API's answers become for the controller."""

from __future__ import annotations

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
