"""Watch-backed caches of the BatchedModels' children (client-go's reflector and store, for two kinds).

Every scaling pass needs every model's Deployment and pods. Listing them each pass costs the API server a LIST
and the operator a parse of every object (at 1,000 models ~60 % of a pass's CPU, py-spy on benchmarks/scale.py,
even trimmed and with orjson); a cache kept current by a WATCH costs one parse per change. Each
:class:`Informer` LISTs its kind once (paginated, trimmed to the fields the loops read), then WATCHes from that
resourceVersion, applying ADDED/MODIFIED/DELETED and following BOOKMARKs; it lists again when the watch expires
(HTTP 410 Gone) and reconnects with a backoff when the API is unreachable. A cache not confirmed by the API for
longer than ``max_stale_s`` (a watch that cannot reconnect) is reported stale and the loops skip their pass: a
decision on pods seen minutes ago could be wrong, and holding is always safe.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError

from batchfill.adapters.kube import (
    Kube,
    KubePermanentError,
    KubeTemporaryError,
    _classify,
    _document,
    _matches,
)
from batchfill.render.kube import CONFIG_HASH_FIELD, REPLICAS_FIELD, managed_field
from batchfill.render.pool import LOADED_LABEL_PREFIX

log = logging.getLogger(__name__)

#: Server-side timeout of one WATCH request, seconds (the API server ends it; the informer watches again from the
#: last resourceVersion it saw, without a LIST).
WATCH_TIMEOUT_S = 300
#: Backoff after a failed LIST or WATCH, seconds (doubling up to the last).
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)

#: Items per page of a LIST: each page is parsed and trimmed before the next is read, so a LIST holds one page of
#: whole objects at a time, not the fleet's.
LIST_PAGE_SIZE = 250

#: A tree of the fields to keep: ``True`` keeps a field whole, a dict keeps those of its sub-fields.
Fields = Mapping[str, "bool | Fields"]


def pick(obj: Mapping[str, Any], fields: Fields) -> dict[str, Any]:
    """The part of ``obj`` named by ``fields`` (absent fields stay absent; a non-object where an object is
    expected is dropped)."""
    out: dict[str, Any] = {}
    for name, sub in fields.items():
        if name not in obj:
            continue
        value = obj[name]
        if sub is True:
            out[name] = value
        elif isinstance(value, Mapping) and isinstance(sub, Mapping):
            out[name] = pick(value, sub)
    return out


#: The managedFields the loops read (``fieldsV1`` paths): who owns ``spec.replicas`` (a hand scale) and the pod
#: template's config-hash annotation (a hand rollback, ``controller.status.hand_rollback``).
OWNED_PATHS = (REPLICAS_FIELD, CONFIG_HASH_FIELD)


def _owned(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` reduced to the :data:`OWNED_PATHS` it contains (an entry that owns none of them is empty)."""
    out: dict[str, Any] = {}
    for path in OWNED_PATHS:
        if managed_field(fields, path) is None:
            continue
        here = out
        for key in path[:-1]:
            here = here.setdefault(key, {})
        here[path[-1]] = {}
    return out


def _owned_entries(managed: Any) -> list[dict[str, Any]]:
    """managedFields reduced to :data:`OWNED_PATHS` (an apply entry otherwise lists the whole template)."""
    out = []
    for entry in managed if isinstance(managed, list) else []:
        if not isinstance(entry, Mapping):
            continue
        fields = entry.get("fieldsV1")
        kept = pick(entry, {"manager": True, "operation": True, "subresource": True, "time": True})
        out.append(kept | {"fieldsV1": _owned(fields) if isinstance(fields, Mapping) else {}})
    return out


#: What the loops read of a Triton Deployment: its replicas, the pod template's config hash and labels, who set
#: the replicas, and its status.
DEPLOYMENT_FIELDS: Fields = {
    "metadata": {"name": True, "namespace": True, "uid": True, "labels": True, "generation": True},
    "spec": {
        "replicas": True,
        "strategy": True,
        "template": {"metadata": {"labels": True, "annotations": True}, "spec": {"volumes": True}},
    },
    "status": True,
}
#: What the loops read of a Triton pod: readiness, the scheduler's reason, its IPs; its resourceVersion, the
#: precondition of the pool loop's label patches; and of its annotations only the pool's per-model config hashes
#: (:func:`_trim_pod`).
POD_FIELDS: Fields = {
    "metadata": {
        "name": True,
        "namespace": True,
        "uid": True,
        "resourceVersion": True,
        "labels": True,
        "deletionTimestamp": True,
    },
    # the container statuses say why a pod is not Ready (crash loop, failed image pull: controller.status)
    "status": {
        "phase": True,
        "reason": True,
        "message": True,
        "conditions": True,
        "podIP": True,
        "podIPs": True,
        "containerStatuses": True,
        "initContainerStatuses": True,
    },
}


def _trim_deployment(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = pick(obj, DEPLOYMENT_FIELDS)
    out.setdefault("metadata", {})["managedFields"] = _owned_entries((obj.get("metadata") or {}).get("managedFields"))
    return out


def _trim_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = pick(obj, POD_FIELDS)
    # the annotations of the pool's model labels (the config each label was set for): the rest of a pod's
    # annotations (the prometheus.io ones, anything a webhook adds) are not read, so not kept
    notes = (obj.get("metadata") or {}).get("annotations")
    ours = {k: v for k, v in notes.items() if k.startswith(LOADED_LABEL_PREFIX)} if isinstance(notes, Mapping) else {}
    if ours:
        out.setdefault("metadata", {})["annotations"] = ours
    return out


Trim = Callable[[Mapping[str, Any]], dict[str, Any]]


class GoneError(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class Informer:
    """One kind's objects carrying ``selector``, in ``namespace`` ("" for all), kept current by LIST + WATCH.

    Args:
        api: the operator's (rate-limited) API client: a LIST page or a WATCH connection takes one token.
        kind: "pods" or "deployments".
        namespace: the namespace to watch, or "" for the whole cluster.
        selector: label selector string.
        max_stale_s: how long after a failed LIST or WATCH the cache still counts as current (a watch reconnects
            within seconds when the API is there; a quiet healthy watch is current however long it is quiet).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        api: client.ApiClient,
        kind: str,
        namespace: str,
        selector: str,
        *,
        max_stale_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if kind == "pods":
            core = client.CoreV1Api(api)
            self._call: Callable[..., Any] = (
                (lambda **kw: core.list_namespaced_pod(namespace, **kw))
                if namespace
                else core.list_pod_for_all_namespaces
            )
            self._trim: Trim = _trim_pod
        elif kind == "deployments":
            apps = client.AppsV1Api(api)
            self._call = (
                (lambda **kw: apps.list_namespaced_deployment(namespace, **kw))
                if namespace
                else apps.list_deployment_for_all_namespaces
            )
            self._trim = _trim_deployment
        else:
            raise ValueError(f"no informer for kind {kind!r}")
        self.kind, self.namespace, self.selector = kind, namespace, selector
        self.max_stale_s, self._clock = max_stale_s, clock
        self._lock = threading.Lock()
        self._store: dict[str, dict[str, dict[str, Any]]] = {}  # namespace -> name -> trimmed object
        self._synced = False
        self._broken_since: float | None = None  # when the last LIST or WATCH failed (None: listed and watching)
        self._error = ""
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"batchfill-informer-{kind}", daemon=True)
        self.lists = 0  # LISTs made (the first, and one per expired watch)

    @property
    def what(self) -> str:
        return f"{self.kind} {self.namespace or 'in all namespaces'}"

    # --- reads --------------------------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`KubeTemporaryError` unless the cache is listed and current (see ``max_stale_s``)."""
        with self._lock:
            if not self._synced:
                raise KubeTemporaryError(f"{self.what}: not listed yet{': ' + self._error if self._error else ''}")
            if self._broken_since is not None and self._clock() - self._broken_since > self.max_stale_s:
                age = self._clock() - self._broken_since
                raise KubeTemporaryError(f"{self.what}: watch broken for {age:.0f} s: {self._error}")

    def items(self, namespace: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._store.get(namespace, {}).values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._store.get(namespace, {}).get(name)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._store.values())

    # --- the reflector ------------------------------------------------------------------------------------------

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # already closed or half-open: the thread ends either way
                resp.shutdown()  # urllib3 >= 2.3: ends the blocking read of the watch from this thread
        self._thread.join(timeout=5)

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._synced:
                    return True
            time.sleep(0.05)
        return False

    def _run(self) -> None:
        failures = 0
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._relist()
                version = self._watch(version)
                failures = 0
            except GoneError:
                log.info("watch of %s expired (410 Gone): listing again", self.what)
                version = ""
            except (KubeTemporaryError, KubePermanentError) as err:
                if self._stop.is_set():
                    return
                with self._lock:
                    self._error = str(err)
                    if self._broken_since is None:
                        self._broken_since = self._clock()
                delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                log.warning("%s: %s (again in %.1f s)", self.what, err, delay)
                self._stop.wait(delay)

    def _relist(self) -> str:
        """LIST every page (trimmed as it arrives); replace the store. Returns the list's resourceVersion."""
        store: dict[str, dict[str, dict[str, Any]]] = {}
        token, version = "", ""
        while True:
            extra: dict[str, Any] = {"_continue": token} if token else {}
            try:
                resp = self._call(label_selector=self.selector, limit=LIST_PAGE_SIZE, _preload_content=False, **extra)
            except (ApiException, HTTPError) as e:
                raise _classify(e, f"list {self.what}") from None
            doc = _document(resp, f"list {self.what}")
            for item in doc.get("items") or []:
                if isinstance(item, dict):
                    self._put(store, self._trim(item))
            meta = doc.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = str(meta.get("continue") or "")
            if not token:
                break
        with self._lock:
            self._store, self._synced, self._broken_since, self._error = store, True, None, ""
        self.lists += 1
        return version

    def _watch(self, version: str) -> str:
        """WATCH from ``version`` until the server ends the request; returns the last resourceVersion seen."""
        try:
            resp = self._call(
                label_selector=self.selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_S,
                _preload_content=False,
                _request_timeout=(10, WATCH_TIMEOUT_S + 30),
            )
        except (ApiException, HTTPError) as e:
            if getattr(e, "status", None) == 410:
                raise GoneError from None
            raise _classify(e, f"watch {self.what}") from None
        self._resp = resp
        with self._lock:
            self._broken_since, self._error = None, ""
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                version = self._apply(orjson.loads(line), version)
        except orjson.JSONDecodeError as e:
            raise KubeTemporaryError(f"watch {self.what}: unreadable event: {e}") from None
        except (HTTPError, OSError, ValueError, AttributeError) as e:  # the connection dropped (restart, stop())
            if self._stop.is_set():
                return version
            raise KubeTemporaryError(f"watch {self.what}: {type(e).__name__}: {e}") from None
        finally:
            self._resp = None
            resp.release_conn()
        return version

    def _apply(self, event: Any, version: str) -> str:
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            return version
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise GoneError
            raise KubeTemporaryError(f"watch {self.what}: {obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
        meta = obj.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._put(self._store, self._trim(obj))
            elif kind == "DELETED":
                self._store.get(str(meta.get("namespace") or ""), {}).pop(str(meta.get("name") or ""), None)
        return version  # BOOKMARK: only the resourceVersion

    @staticmethod
    def _put(store: dict[str, dict[str, dict[str, Any]]], item: dict[str, Any]) -> None:
        meta = item.get("metadata") or {}
        store.setdefault(str(meta.get("namespace") or ""), {})[str(meta.get("name") or "")] = item


class ChildCaches:
    """The informers of the loops: pods and Deployments with ``selector``, across the cluster or per namespace."""

    def __init__(self, api: client.ApiClient, selector: str, namespaces: tuple[str, ...] = (), **kw: Any) -> None:
        scopes = namespaces or ("",)
        self.namespaces = namespaces
        self.pods = {ns: Informer(api, "pods", ns, selector, **kw) for ns in scopes}
        self.deployments = {ns: Informer(api, "deployments", ns, selector, **kw) for ns in scopes}

    def all(self) -> list[Informer]:
        return [*self.pods.values(), *self.deployments.values()]

    def start(self) -> ChildCaches:
        for i in self.all():
            i.start()
        return self

    def stop(self) -> None:
        for i in self.all():
            i.stop()

    def scope(self, namespace: str) -> str:
        return namespace if self.namespaces else ""


class CachedView(Kube):
    """A loop's reads of Deployments and pods answered from :class:`ChildCaches` (everything else is Kube's).

    ``check(kinds)`` raises :class:`KubeTemporaryError` when every cache of a kind is unusable (not listed yet, or
    stale): the pass is skipped. A namespace whose own cache is unusable fails only its models' reads.
    """

    def __init__(self, kube: Kube, caches: ChildCaches) -> None:
        super().__init__(kube.api)
        self._kinds = kube._kinds  # share the discovery answers, client and lock: costly to rebuild, not thread-safe
        self._discovery = kube._discovery
        self._dynamic = kube.dynamic
        self.caches = caches

    def check(self, kinds: tuple[str, ...] = ("pods", "deployments")) -> None:
        for kind in kinds:
            informers = list((self.caches.pods if kind == "pods" else self.caches.deployments).values())
            errors = []
            for i in informers:
                try:
                    i.check()
                except KubeTemporaryError as err:
                    errors.append(err)
            if errors and len(errors) == len(informers):
                raise errors[0]

    def _informer(self, kind: str, namespace: str) -> Informer:
        found = (self.caches.pods if kind == "pods" else self.caches.deployments).get(self.caches.scope(namespace))
        if found is None:
            raise KubePermanentError(f"{kind} in namespace {namespace}: not a namespace the operator serves")
        found.check()
        return found

    def list_pods(self, namespace: str, selector: Mapping[str, str] | str) -> list[dict[str, Any]]:
        if isinstance(selector, str):  # not expressible as equalities to filter on: ask the API
            return super().list_pods(namespace, selector)
        return [p for p in self._informer("pods", namespace).items(namespace) if _matches(p, selector)]

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        if (api_version, kind) != ("apps/v1", "Deployment"):
            return super().get(api_version, kind, name, namespace)
        found = self._informer("deployments", namespace).get(namespace, name)
        if found is not None:
            return found
        # not labelled as ours (made by hand, or before the labels): ask for it by name
        return super().get(api_version, kind, name, namespace)
