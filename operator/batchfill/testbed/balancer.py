"""Open-loop Poisson load spread round-robin over a changing set of Triton servers, in a background thread.

What a Kubernetes Service does for the Triton pods of a BatchedModel, for tests and demos where the pods are kwok
pods paired with local tritonservers: each arrival goes to the next endpoint of ``endpoints()`` (read at every
arrival, so servers joining or leaving take effect at once). The rate can be changed while it runs
(:meth:`BalancedLoad.set_rate`); arrivals are exponential gaps drawn from a seeded generator. Before the first
arrival, the client connects to each endpoint known at the start (see :meth:`BalancedLoad.start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: At most this long (s) to connect to the first endpoints before the first arrival is due.
WARM_TIMEOUT_S = 5.0


@dataclass
class Sample:
    """One request: when it was due (monotonic s), where it went, its latency from when it was due (ms; None if it
    failed), and how late the generator handed it to the client (ms; None if it never was): the part of the
    latency that is the load generator's own (its event loop or its process busy), not the server's."""

    due_s: float
    endpoint: str
    latency_ms: float | None
    late_ms: float | None = None


@dataclass
class BalancedLoad:
    """Poisson load at ``rate_rps`` (changeable) over ``endpoints()`` (gRPC ``host:port``), until :meth:`stop`.

    Args:
        model: Triton model name.
        make_inputs: the ``tritonclient.grpc`` InferInput list of one single-sample request.
        endpoints: the servers to spread over, read at each arrival; an empty list makes the arrival a failure
            (as a Service without Ready endpoints would).
        seed: seeds the arrival gaps.
        timeout_s: client timeout per request.
    """

    model: str
    make_inputs: Callable[[], Sequence[Any]]
    endpoints: Callable[[], list[str]]
    seed: int = 0
    timeout_s: float = 10.0
    samples: list[Sample] = field(default_factory=list)
    _rate: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _warm: threading.Event = field(default_factory=threading.Event)

    def set_rate(self, rate_rps: float) -> None:
        """Arrivals per second from now on (0: pause)."""
        if not (rate_rps >= 0 and np.isfinite(rate_rps)):
            raise ValueError(f"rate must be finite and >= 0, got {rate_rps!r}")
        self._rate = float(rate_rps)

    def start(self, rate_rps: float) -> BalancedLoad:
        self.set_rate(rate_rps)
        self._thread = threading.Thread(target=self._run, name="balanced-load", daemon=True)
        self._thread.start()
        # The first arrival is due once the client is imported and connected to the endpoints known now (a
        # health request, not an inference: Triton's counts stay the test's): a client that has been running pays
        # neither per request. A model's own first executions are spec.model.warmup's business.
        self._warm.wait(timeout=WARM_TIMEOUT_S + 30)
        return self

    def stop(self) -> None:
        """Stop sending, wait for the requests in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 30)

    def between(self, t0: float, t1: float) -> list[Sample]:
        """Samples due in [t0, t1) (monotonic seconds)."""
        return [s for s in list(self.samples) if t0 <= s.due_s < t1]

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self._warm.set()  # also when the client could not start: start() does not wait for nothing

    async def _main(self) -> None:
        import tritonclient.grpc.aio as grpcaio

        inputs = list(self.make_inputs())
        rng = np.random.default_rng(self.seed)
        clients: dict[str, Any] = {}
        tasks: set[asyncio.Task[None]] = set()
        turn = 0

        async def one(due: float, endpoint: str) -> None:
            late_ms = (time.monotonic() - due) * 1e3
            client = clients.get(endpoint)
            if client is None:
                client = clients[endpoint] = grpcaio.InferenceServerClient(endpoint)
            try:
                await client.infer(self.model, inputs, client_timeout=self.timeout_s)
            except Exception:  # counted as a failure; the load goes on
                self.samples.append(Sample(due, endpoint, None, late_ms))
                return
            self.samples.append(Sample(due, endpoint, (time.monotonic() - due) * 1e3, late_ms))

        try:
            for endpoint in self.endpoints():
                clients[endpoint] = grpcaio.InferenceServerClient(endpoint)
            live = [c.is_server_live() for c in clients.values()]
            with contextlib.suppress(Exception):  # a server not up yet: its requests will say so
                await asyncio.wait_for(asyncio.gather(*live, return_exceptions=True), WARM_TIMEOUT_S)
        finally:
            self._warm.set()
        due = time.monotonic()
        while not self._stop.is_set():
            rate = self._rate
            if rate <= 0:
                await asyncio.sleep(0.05)
                due = time.monotonic()
                continue
            due += float(rng.exponential(1.0 / rate))
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            targets = self.endpoints()
            if not targets:
                self.samples.append(Sample(due, "", None))
                continue
            endpoint = targets[turn % len(targets)]
            turn += 1
            task = asyncio.create_task(one(due, endpoint))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for client in clients.values():
            await client.close()


class ServiceEndpoints:
    """The ready endpoints of a Service, from its EndpointSlices, as a client-side load balancer sees them.

    What kube-proxy programs for a ClusterIP Service, read from the same objects: every endpoint of every
    ``discovery.k8s.io/v1`` EndpointSlice labelled ``kubernetes.io/service-name=<service>`` whose
    ``conditions.ready`` is true (a terminating pod leaves at once, as kube-proxy drops it), at the port named
    ``port_name``. A background thread lists them every ``poll_s`` seconds; :meth:`endpoints` (``host:port``
    strings, a new list each call) suits :class:`BalancedLoad`'s ``endpoints``. Use as a context manager.
    """

    def __init__(self, api_client: Any, namespace: str, service: str, port_name: str, poll_s: float = 0.5) -> None:
        self.api_client, self.namespace, self.service, self.port_name = api_client, namespace, service, port_name
        self.poll_s = poll_s
        self._endpoints: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def refresh(self) -> list[str]:
        """List the EndpointSlices once; the ready ``ip:port`` endpoints, sorted."""
        from kubernetes import client

        slices = client.DiscoveryV1Api(self.api_client).list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}"
        )
        found: set[str] = set()
        for s in slices.items:
            ports = [p.port for p in s.ports or [] if p.name == self.port_name and p.port]
            for e in s.endpoints or []:
                if e.conditions is not None and e.conditions.ready:
                    found.update(f"{address}:{port}" for address in e.addresses for port in ports)
        self._endpoints = sorted(found)
        return self.endpoints()

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.refresh()
            except Exception:  # an API hiccup keeps the last known endpoints, as kube-proxy does
                continue

    def __enter__(self) -> ServiceEndpoints:
        self.refresh()
        self._thread = threading.Thread(target=self._follow, name="service-endpoints", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 10)
