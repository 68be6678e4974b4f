"""Leader election on a ``coordination.k8s.io/v1`` Lease: the API calls (decisions: batchfill.policy.leader).

Why not ``kubernetes.leaderelection`` (kubernetes 37.0.2 ships it, with a ``LeaseLock``): its ``LeaderElection``
cannot be stopped (``run``/``acquire`` loop forever, so no graceful stop, no release of the Lease and no way to
simulate a killed leader in-process), its lock always uses the default ``Configuration`` (not the ``ApiClient``
it is given), it exits the interpreter (``sys.exit``) on a bad configuration, counts no ``leaseTransitions``
and sends ``renewTime`` with ``datetime.isoformat()``, which drops the microseconds the API server's MicroTime
requires when they happen to be 0. This adapter is ~client-go's ``leaderelection`` with a ``LeaseLock``:

* every write is a create (409: another candidate created it first) or a replace carrying the
  ``resourceVersion`` of the read it was decided on (409: another candidate wrote in between): of two
  candidates one wins, the other reads again;
* :meth:`LeaderElector.acquire` blocks until this candidate holds the Lease (or ``stop`` is set);
* :meth:`LeaderElector.start_renewing` renews it in a daemon thread and calls ``on_lost`` when it could not
  renew for the renew deadline, or saw another holder: the process must then stop acting at once;
* :meth:`LeaderElector.stop` stops renewing and, unless told not to (a simulated kill), releases the Lease.

:class:`StandbyHealth` answers the liveness probe while a replica waits: kopf's liveness endpoint only opens
once its startup handlers ran, which a standby replica never gets to.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.policy.leader import (
    Action,
    LeaseRecord,
    LeaseSpec,
    LeaseTiming,
    Observation,
    decide,
    next_spec,
    observe,
    released_spec,
    renew_deadline_passed,
)

log = logging.getLogger("batchfill.leader")
#: Set in the pod from the downward API; a pod's hostname is its name too.
POD_NAME_ENV = "POD_NAME"


def default_identity(env: Mapping[str, str] | None = None) -> str:
    """``<pod name>_<uuid>`` as controller-runtime: unique even when a restarted pod keeps its name."""
    env = os.environ if env is None else env
    return f"{env.get(POD_NAME_ENV) or socket.gethostname()}_{uuid.uuid4()}"


def micro_time(value: datetime) -> str:
    """A ``metav1.MicroTime`` as the API server parses it (RFC 3339, always 6 fractional digits, UTC)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder=(spec.holder_identity or None) if spec else None,
        lease_duration_s=spec.lease_duration_seconds if spec else None,
        acquire_time=spec.acquire_time if spec else None,
        renew_time=spec.renew_time if spec else None,
        transitions=(spec.lease_transitions or 0) if spec else 0,
        version=str(lease.metadata.resource_version),
    )


def _spec_body(spec: LeaseSpec) -> dict[str, Any]:
    body: dict[str, Any] = {
        "leaseDurationSeconds": spec.lease_duration_s,
        "acquireTime": micro_time(spec.acquire_time),
        "renewTime": micro_time(spec.renew_time),
        "leaseTransitions": spec.transitions,
    }
    if spec.holder:
        body["holderIdentity"] = spec.holder
    return body


@dataclass
class _Read:
    lease: Any | None  # V1Lease, or None when there is none
    sent_at: float


class LeaderElector:
    """One candidate for the Lease ``namespace/name``, as ``identity`` (see the module docstring)."""

    def __init__(
        self,
        api: client.ApiClient,
        name: str,
        namespace: str,
        identity: str,
        timing: LeaseTiming | None = None,
        *,
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.timing = timing or LeaseTiming()
        problems = self.timing.problems()
        if problems:
            raise ValueError("; ".join(f"{field}: {msg}" for field, msg in problems))
        self.name, self.namespace, self.identity = name, namespace, identity
        self.on_lost = on_lost
        self._coord = client.CoordinationV1Api(api)
        self._clock, self._wall = clock, wall
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: Observation | None = None
        self._leading = False
        self._last_renew_sent = 0.0
        self._wait_hint: float | None = None
        self._last_holder_logged: str | None = None
        self._last_error_logged = ""
        #: set when leadership was lost (not on a stop); ``lost_reason`` says why
        self.lost = threading.Event()
        self.lost_reason = ""
        #: monotonic time this candidate last became leader
        self.acquired_at: float | None = None

    # --- state ----------------------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self._leading and not self.lost.is_set()

    def __repr__(self) -> str:
        return f"LeaderElector({self.namespace}/{self.name} as {self.identity}, leader={self.is_leader})"

    # --- one round ------------------------------------------------------------------------------------------
    def _request_timeout(self, until: float | None) -> float:
        """Each request is bounded, and a leader's never outlasts its renew deadline."""
        timeout = max(1.0, min(5.0, self.timing.renew_deadline_s / 2))
        if until is not None:
            timeout = min(timeout, max(0.2, until - self._clock()))
        return timeout

    def _failed(self, what: str, err: Exception) -> None:
        status = getattr(err, "status", None)
        if status == 403:
            try:
                message = json.loads(getattr(err, "body", None) or "{}").get("message", "")
            except (ValueError, AttributeError):
                message = ""
            text = (
                f"{what}: forbidden ({message or 'no message'}); the operator needs get, create and update on "
                f"leases (coordination.k8s.io) in namespace {self.namespace}"
            )
        else:
            text = f"{what}: {getattr(err, 'reason', None) or type(err).__name__} {status or ''}".strip()
        if text != self._last_error_logged:  # once per distinct failure, not every retry period
            log.warning("leader election: %s", text)
            self._last_error_logged = text

    def try_acquire_or_renew(self, until: float | None = None) -> bool:
        """Read the Lease, decide, write it if ours to take or renew. True when we hold it afterwards."""
        with self._lock:
            sent = self._clock()
            try:
                lease = self._coord.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=self._request_timeout(until)
                )
            except ApiException as e:
                if e.status != 404:
                    self._failed(f"reading Lease {self.namespace}/{self.name}", e)
                    return False
                lease = None
            except Exception as e:  # urllib3 errors, timeouts: try again next period
                self._failed(f"reading Lease {self.namespace}/{self.name}", e)
                return False
            return self._decide_and_write(_Read(lease, sent), until)

    def _decide_and_write(self, read: _Read, until: float | None) -> bool:
        now = self._clock()
        record = None if read.lease is None else _record(read.lease)
        if record is not None:
            self._seen = observe(self._seen, record, read.sent_at, now, self.timing.retry_period_s)
        decision = decide(record, self._seen, self.identity, now, self.timing)
        self._wait_hint = decision.expires_in_s
        if self._leading and decision.action is not Action.RENEW:
            holder = record.holder if record is not None else None
            self._lose(f"the Lease is now held by {holder or 'nobody'}")
            return False
        if decision.action is Action.WAIT:
            if decision.holder != self._last_holder_logged:
                log.info(
                    "leader election: standing by, Lease %s/%s %s (expires in %.1f s unless renewed)",
                    self.namespace,
                    self.name,
                    decision.reason,
                    decision.expires_in_s or 0.0,
                )
                self._last_holder_logged = decision.holder
            return False
        spec = next_spec(record, decision.action, self.identity, self._wall(), self.timing)
        what = f"{decision.action.value} Lease {self.namespace}/{self.name}"
        try:
            if record is None:
                body: Any = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": _spec_body(spec),
                }
                written = self._coord.create_namespaced_lease(
                    self.namespace, body, _request_timeout=self._request_timeout(until)
                )
            else:
                written = self._coord.replace_namespaced_lease(
                    self.name,
                    self.namespace,
                    self._replacement(read.lease, spec),
                    _request_timeout=self._request_timeout(until),
                )
        except ApiException as e:
            if e.status == 409:  # another candidate wrote first: read again next round
                log.debug("leader election: %s: conflict, another candidate wrote first", what)
                return False
            self._failed(what, e)
            return False
        except Exception as e:
            self._failed(what, e)
            return False
        self._seen = observe(self._seen, _record(written), read.sent_at, self._clock(), self.timing.retry_period_s)
        self._last_renew_sent = read.sent_at  # the renewal happened no earlier than the read it followed
        self._last_error_logged = ""
        if not self._leading:
            self._leading = True
            self.acquired_at = self._clock()
            log.info(
                "leader election: %s now leads (Lease %s/%s: %s, transitions %d)",
                self.identity,
                self.namespace,
                self.name,
                decision.reason,
                spec.transitions,
            )
        return True

    def _replacement(self, lease: Any, spec: LeaseSpec) -> Any:
        meta = lease.metadata
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "resourceVersion": meta.resource_version,  # optimistic concurrency: 409 if written since our read
        }
        if meta.labels:
            metadata["labels"] = meta.labels
        if meta.annotations:
            metadata["annotations"] = meta.annotations
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": _spec_body(spec)}

    def _lose(self, reason: str) -> None:
        self._leading = False
        self.lost_reason = reason
        self.lost.set()
        log.error("leader election: %s lost Lease %s/%s: %s", self.identity, self.namespace, self.name, reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    # --- loops ----------------------------------------------------------------------------------------------
    def acquire(self, stop: threading.Event | None = None, timeout_s: float | None = None) -> bool:
        """Block until we hold the Lease (True), or until ``stop`` is set or ``timeout_s`` passed (False)."""
        stop = stop or self._stop
        deadline = None if timeout_s is None else self._clock() + timeout_s
        log.info("leader election: %s is a candidate for Lease %s/%s", self.identity, self.namespace, self.name)
        while not stop.is_set():
            if self.try_acquire_or_renew():
                return True
            wait = self.timing.retry_period_s
            if self._wait_hint is not None:  # wake up when the holder's Lease would expire, not a period later
                wait = min(wait, max(0.05, self._wait_hint + 0.05))
            if deadline is not None:
                wait = min(wait, deadline - self._clock())
                if wait <= 0:
                    return False
            if stop.wait(wait):
                return False
        return False

    def start_renewing(self) -> None:
        """Renew the Lease in a daemon thread until :meth:`stop` or the loss of it (``on_lost``)."""
        if not self._leading:
            raise RuntimeError("start_renewing() before acquire() succeeded")
        self._thread = threading.Thread(target=self._renew_loop, name="batchfill-leader-election", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        timing = self.timing
        while not self._stop.wait(timing.renew_interval_s):
            while True:
                until = self._last_renew_sent + timing.renew_deadline_s
                if self.try_acquire_or_renew(until):
                    break
                if self.lost.is_set() or self._stop.is_set():
                    return
                if renew_deadline_passed(self._last_renew_sent, self._clock(), timing):
                    self._lose(f"could not renew it for {timing.renew_deadline_s:g} s (the renew deadline)")
                    return
                if self._stop.wait(max(0.0, min(timing.retry_period_s, until - self._clock()))):
                    return

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing; with ``release`` (a graceful stop) give the Lease up so a standby takes over at once.

        ``release=False`` leaves the Lease to expire, as a killed process would.
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._request_timeout(None) * 2 + 1)
        with self._lock:
            if release and self._leading and not self.lost.is_set():
                self.release()
            self._leading = False

    def release(self) -> bool:
        """Write the Lease without a holder if we still hold it. True when released."""
        with self._lock:
            timeout = self._request_timeout(None)
            try:
                lease = self._coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
                record = _record(lease)
                if record.holder != self.identity:
                    return False
                self._coord.replace_namespaced_lease(
                    self.name,
                    self.namespace,
                    self._replacement(lease, released_spec(record, self._wall())),
                    _request_timeout=timeout,
                )
            except Exception as e:  # the Lease expires on its own
                self._failed(f"releasing Lease {self.namespace}/{self.name}", e)
                return False
            self._leading = False
            log.info("leader election: %s released Lease %s/%s", self.identity, self.namespace, self.name)
            return True


class StandbyHealth:
    """Serves ``endpoint`` (``http://host:port/path``, kopf's ``--liveness``) with 200 while the replica waits.

    Close it before kopf starts: kopf opens the same endpoint once it runs.
    """

    def __init__(self, endpoint: str, status: Callable[[], dict[str, Any]]) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme != "http":
            raise ValueError(f"unsupported liveness endpoint {endpoint!r} (http only, as kopf)")
        path = parts.path or "/"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = urllib.parse.urlsplit(self.path).path == path
                body = json.dumps(status() if ok else {"error": "not found"}).encode()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no access log
                pass

        self._server = ThreadingHTTPServer((parts.hostname or "localhost", parts.port or 80), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="batchfill-standby-health", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> StandbyHealth:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
