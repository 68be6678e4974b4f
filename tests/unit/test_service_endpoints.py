"""batchfill.testbed.balancer.ServiceEndpoints: the Service's ready endpoints at a named port, from EndpointSlices."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from batchfill.testbed.balancer import ServiceEndpoints


def _endpoint(ip: str, ready: bool | None) -> Any:
    return SimpleNamespace(addresses=[ip], conditions=None if ready is None else SimpleNamespace(ready=ready))


class FakeDiscovery:
    """DiscoveryV1Api's list call over a fixed set of slices; records the selector asked for."""

    slices: ClassVar[list[Any]] = []
    selectors: ClassVar[list[str]] = []

    def __init__(self, api_client: Any) -> None:
        pass

    def list_namespaced_endpoint_slice(self, namespace: str, label_selector: str) -> Any:
        FakeDiscovery.selectors.append(f"{namespace}/{label_selector}")
        return SimpleNamespace(items=FakeDiscovery.slices)


@pytest.fixture
def discovery(monkeypatch: pytest.MonkeyPatch) -> type[FakeDiscovery]:
    from kubernetes import client

    monkeypatch.setattr(client, "DiscoveryV1Api", FakeDiscovery)
    FakeDiscovery.selectors = []
    return FakeDiscovery


def test_only_ready_endpoints_at_the_named_port(discovery: type[FakeDiscovery]) -> None:
    ports = [SimpleNamespace(name="http", port=8000), SimpleNamespace(name="grpc", port=8001)]
    discovery.slices = [
        SimpleNamespace(ports=ports, endpoints=[_endpoint("10.0.1.3", True), _endpoint("10.0.1.2", True)]),
        SimpleNamespace(ports=ports, endpoints=[_endpoint("10.0.1.4", False), _endpoint("10.0.1.5", None)]),
        SimpleNamespace(ports=None, endpoints=[_endpoint("10.0.1.6", True)]),
    ]
    endpoints = ServiceEndpoints(object(), "ocr", "text-recognizer-triton", "grpc")
    assert endpoints.refresh() == ["10.0.1.2:8001", "10.0.1.3:8001"]
    assert discovery.selectors == ["ocr/kubernetes.io/service-name=text-recognizer-triton"]


def test_follows_changes_and_keeps_the_last_endpoints_on_api_errors(discovery: type[FakeDiscovery]) -> None:
    import time

    ports = [SimpleNamespace(name="grpc", port=8001)]
    discovery.slices = [SimpleNamespace(ports=ports, endpoints=[_endpoint("10.0.1.2", True)])]
    with ServiceEndpoints(object(), "ocr", "svc", "grpc", poll_s=0.05) as endpoints:
        assert endpoints.endpoints() == ["10.0.1.2:8001"]
        discovery.slices = [
            SimpleNamespace(ports=ports, endpoints=[_endpoint("10.0.1.2", False), _endpoint("10.0.1.9", True)])
        ]
        deadline = time.monotonic() + 5
        while endpoints.endpoints() != ["10.0.1.9:8001"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert endpoints.endpoints() == ["10.0.1.9:8001"]
        discovery.slices = None  # type: ignore[assignment]  # the next list raises (SimpleNamespace(items=None) iterated)
        time.sleep(0.3)
        assert endpoints.endpoints() == ["10.0.1.9:8001"]
