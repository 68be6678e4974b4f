"""Kubernetes API calls of the operator (I/O only), through the official `kubernetes` client.

Children are written with server-side apply under one field manager, so an unchanged object is a no-op on
the server (no new resourceVersion) and a changed one is one PATCH. Errors are sorted into the two kinds
the handlers need: temporary (conflicts, throttling, server errors, timeouts: retry with backoff) and
permanent (the API server rejected the object: retrying cannot help).
"""

from __future__ import annotations

import copy
import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError, ResourceNotFoundError
from urllib3.exceptions import HTTPError

from batchfill.render.kube import FIELD_MANAGER

log = logging.getLogger(__name__)

#: HTTP statuses worth retrying: conflict, throttling, server-side trouble.
TEMPORARY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
#: How long an answer of :meth:`Kube.has_kind` is reused (seconds).
KIND_CACHE_SECONDS = 30.0
#: Requests :meth:`Kube.apply_all` keeps in flight at once, over every caller (threads of a pool shared by the
#: kopf workers and the loops).
APPLY_CONCURRENCY = 16
#: Connections the operator's main client keeps open (urllib3's pool; the client's default is 5 per CPU): kopf's
#: workers, the loops and :meth:`Kube.apply_all` together; a full pool discards connections, and each new one is a
#: TLS handshake.
CONNECTION_POOL_SIZE = 32


class KubeTemporaryError(RuntimeError):
    """The API may accept the same request later (conflict, throttling, outage). ``delay_s`` suggests a backoff."""

    def __init__(self, message: str, delay_s: float = 5.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class KubePermanentError(RuntimeError):
    """The API server rejected the request (e.g. 422 Invalid): the same request will fail again."""


class KubeNotFoundError(KubePermanentError):
    """HTTP 404: the object, or its kind (a CustomResourceDefinition removed since discovery), is not served."""


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _matches(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def _document(resp: Any, what: str) -> dict[str, Any]:
    """A response read as plain JSON (camelCase, as the API sends it), by orjson.

    The typed client would build a model object per item and the loops would turn it back into a dict: at 1,000
    models that round trip was ~70 % of a scaling pass (py-spy, benchmarks/scale.py).
    """
    try:
        doc = orjson.loads(resp.data)
    except (orjson.JSONDecodeError, AttributeError, TypeError) as e:
        raise KubeTemporaryError(f"{what}: unreadable response: {e}") from None
    if not isinstance(doc, dict):
        raise KubeTemporaryError(f"{what}: unreadable response: not an object")
    return doc


def _items(resp: Any, what: str) -> list[dict[str, Any]]:
    """The ``items`` of a list response (see :func:`_document`)."""
    return [i for i in _document(resp, what).get("items") or [] if isinstance(i, dict)]


def load_config(kubeconfig: str | None = None) -> None:
    """In-cluster credentials when running in a pod, else the kubeconfig (``KUBECONFIG`` or the argument)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig)


def _classify(err: Exception, what: str) -> Exception:
    status = getattr(err, "status", None)
    if isinstance(err, HTTPError | TimeoutError | ConnectionError):
        return KubeTemporaryError(f"{what}: API unreachable: {err}", delay_s=10)
    if status in TEMPORARY_STATUSES:
        retry = 1.0 if status == 409 else 10.0
        return KubeTemporaryError(f"{what}: HTTP {status}: {getattr(err, 'reason', '')}", delay_s=retry)
    body = getattr(err, "body", None) or getattr(err, "summary", lambda: "")()
    if status == 404:
        return KubeNotFoundError(f"{what}: HTTP 404: {body}")
    return KubePermanentError(f"{what}: HTTP {status}: {body}")


class RateLimiter:
    """Token bucket, as client-go's flowcontrol: ``qps`` requests per second on average, ``burst`` at once.

    Thread-safe; :meth:`acquire` blocks until a token is free. ``clock``/``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (qps > 0 and burst >= 1):
            raise ValueError(f"qps={qps} must be > 0 and burst={burst} >= 1")
        self.qps, self.burst, self._clock, self._sleep = qps, burst, clock, sleep
        self._tokens, self._at = float(burst), clock()
        self._lock = threading.Lock()
        self.waited_s = 0.0  # total time callers were held back (for the operator's metrics and tests)

    def acquire(self) -> float:
        """Take a token; returns the seconds waited for it."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1.0
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
            self.waited_s += wait
        if wait > 0:
            self._sleep(wait)
        return wait


def limit_requests(api: client.ApiClient, limiter: RateLimiter) -> client.ApiClient:
    """Make every request of ``api`` (typed and dynamic clients alike go through ``call_api``) take a token."""
    call = api.call_api

    def limited(*args: Any, **kwargs: Any) -> Any:
        limiter.acquire()
        return call(*args, **kwargs)

    api.call_api = limited  # type: ignore[method-assign]
    api.batchfill_limiter = limiter  # type: ignore[attr-defined]  # shared by Kube.watch_client's clients
    return api


#: The threads of :meth:`Kube.apply_all`, shared by every client of the process (an executor starts its threads on
#: first use, so a process that never applies holds none).
_APPLY_POOL = ThreadPoolExecutor(APPLY_CONCURRENCY, thread_name_prefix="batchfill-apply")


@dataclass
class Kube:
    """The operator's view of the API: dynamic client for children, typed clients where simpler."""

    api: client.ApiClient
    _kinds: dict[tuple[str, str], tuple[bool, float]] = field(default_factory=dict, init=False, repr=False)
    # the client's discovery cache is not thread-safe (kopf's workers and the two loops share it): concurrent
    # refreshes failed with KeyError: 'resources' in the fuzz tests, so every discovery lookup holds this lock
    _discovery: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, limiter: RateLimiter | None = None) -> Kube:
        """A client from the in-cluster or kubeconfig credentials; with ``limiter``, every request takes a token."""
        load_config(kubeconfig)
        configuration = client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, CONNECTION_POOL_SIZE)
        api = client.ApiClient(configuration)
        return cls(limit_requests(api, limiter) if limiter is not None else api)

    @property
    def dynamic(self) -> DynamicClient:
        with self._discovery:
            if not hasattr(self, "_dynamic"):
                self._dynamic = DynamicClient(self.api)
            return self._dynamic

    def _resource(self, api_version: str, kind: str) -> Any:
        with self._discovery:
            return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def has_kind(self, api_version: str, kind: str) -> bool:
        """Whether the API serves ``kind`` (e.g. the prometheus-operator's ServiceMonitor).

        The answer is kept for :data:`KIND_CACHE_SECONDS`: a miss makes the discovery client re-read every API
        group, which 100 BatchedModels reconciled at once must not do 100 times.
        """
        key = (api_version, kind)
        cached = self._kinds.get(key)
        if cached is not None and time.monotonic() - cached[1] < KIND_CACHE_SECONDS:
            return cached[0]
        try:
            self._resource(api_version, kind)
            served = True
        except ResourceNotFoundError:
            served = False
        except (DynamicApiError, ApiException, HTTPError) as e:
            raise _classify(e, f"discovery of {kind}") from None
        self._kinds[key] = (served, time.monotonic())
        return served

    def forget_kinds(self) -> None:
        """Drop the cached API discovery, so a kind installed or removed since is seen as it is now."""
        with self._discovery:
            self._kinds.clear()
            self.dynamic.resources.invalidate_cache()

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply ``obj`` as the batchfill field manager (conflicts forced: we own these fields).

        Raises:
            KubeNotFoundError: the object's namespace is gone, or its kind is not served (any more).
            KubeTemporaryError / KubePermanentError: other API errors.
        """
        meta = obj["metadata"]
        what = f"apply {obj['kind']} {meta.get('namespace', '')}/{meta['name']}"
        try:
            res = self._resource(obj["apiVersion"], obj["kind"])
            out = res.server_side_apply(
                body=obj,
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
            )
        except ResourceNotFoundError:
            # Discovery no longer lists the kind (its CRD was deleted after the cache said it was served): the
            # same answer as the API's 404 for the object, never a traceback in the loop.
            raise KubeNotFoundError(f"{what}: {obj['apiVersion']} {obj['kind']} is not served") from None
        except (DynamicApiError, ApiException, HTTPError) as e:
            raise _classify(e, what) from None
        result: dict[str, Any] = out.to_dict()
        return result

    def apply_all(self, objs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """:meth:`apply` of every object at once (independent objects: no order among them), their results in order.

        A model's children are independent on the server (a pod waits for its ConfigMap by itself), and under load
        each apply waits on the API server, a Service's ClusterIP allocation longest: in sequence a new model's
        handler waited for the sum of the three (benchmarks/scale.py: 53 + 56 + 227 ms), now for the slowest.

        Raises:
            The first error, in the order of ``objs``, once every apply has ended (the others stand).
        """
        if len(objs) <= 1:
            return [self.apply(o) for o in objs]
        futures = [_APPLY_POOL.submit(self.apply, o) for o in objs]
        errors = [f.exception() for f in futures]
        for err in errors:
            if err is not None:
                raise err
        return [f.result() for f in futures]

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist (or its kind is not served)."""
        try:
            obj = self._resource(api_version, kind).get(name=name, namespace=namespace)
        except (NotFoundError, ResourceNotFoundError):
            return None
        except (DynamicApiError, ApiException, HTTPError) as e:
            raise _classify(e, f"get {kind} {namespace}/{name}") from None
        result: dict[str, Any] = obj.to_dict()
        return result

    def list_pods(self, namespace: str, selector: Mapping[str, str] | str) -> list[dict[str, Any]]:
        """Pods matching the label selector (``{key: value}`` equalities, or a selector string)."""
        label_selector = selector if isinstance(selector, str) else _selector(selector)
        what = f"list pods {namespace}"
        try:
            resp = client.CoreV1Api(self.api).list_namespaced_pod(
                namespace, label_selector=label_selector, _preload_content=False
            )
        except (ApiException, HTTPError) as e:
            raise _classify(e, what) from None
        return _items(resp, what)

    def list_config_maps(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """ConfigMaps matching the ``{key: value}`` label equalities."""
        return self._list(client.CoreV1Api(self.api).list_namespaced_config_map, "configmaps", namespace, selector)

    def list_replica_sets(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """ReplicaSets matching the ``{key: value}`` label equalities (a Deployment's carry its pod labels)."""
        return self._list(client.AppsV1Api(self.api).list_namespaced_replica_set, "replicasets", namespace, selector)

    @staticmethod
    def _list(
        call: Callable[..., Any], plural: str, namespace: str, selector: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        what = f"list {plural} {namespace}"
        try:
            resp = call(namespace, label_selector=_selector(selector), _preload_content=False)
        except (ApiException, HTTPError) as e:
            raise _classify(e, what) from None
        return _items(resp, what)

    def watch_client(self, connections: int) -> client.ApiClient:
        """Another client with the same credentials and rate limiter, whose pool holds ``connections`` connections:
        long-lived WATCHes must not take the connections the loops' requests use."""
        api = self.api
        config = copy.copy(api.configuration)
        config.connection_pool_maxsize = max(connections, 1)
        watcher = client.ApiClient(config)
        limiter = getattr(api, "batchfill_limiter", None)
        return limit_requests(watcher, limiter) if limiter is not None else watcher

    def scale_deployment(self, name: str, namespace: str, replicas: int) -> None:
        """Set replicas through the Deployment's scale subresource."""
        try:
            client.AppsV1Api(self.api).patch_namespaced_deployment_scale(
                name, namespace, {"spec": {"replicas": replicas}}, field_manager=FIELD_MANAGER
            )
        except (ApiException, HTTPError) as e:
            raise _classify(e, f"scale Deployment {namespace}/{name}") from None

    def list_batched_models(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """BatchedModels in ``namespaces`` (exact names), or in all namespaces when empty."""
        from batchfill.api.spec import GROUP, PLURAL, VERSION

        api: Any = client.CustomObjectsApi(self.api)
        try:
            if not namespaces:
                return _items(api.list_cluster_custom_object(GROUP, VERSION, PLURAL, _preload_content=False), "list")
            return [
                item
                for ns in namespaces
                for item in _items(
                    api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _preload_content=False), "list"
                )
            ]
        except (ApiException, HTTPError) as e:
            raise _classify(e, "list BatchedModels") from None

    def list_gpu_pools(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """GPUPools in ``namespaces`` (exact names), or in all namespaces when empty.

        Raises:
            KubeNotFoundError: the GPUPool CRD is not installed (HTTP 404).
            KubeTemporaryError / KubePermanentError: other API errors.
        """
        from batchfill.api.pool import POOL_PLURAL
        from batchfill.api.spec import GROUP, VERSION

        api: Any = client.CustomObjectsApi(self.api)
        what = "list GPUPools"
        try:
            if not namespaces:
                return _items(api.list_cluster_custom_object(GROUP, VERSION, POOL_PLURAL, _preload_content=False), what)
            return [
                item
                for ns in namespaces
                for item in _items(
                    api.list_namespaced_custom_object(GROUP, VERSION, ns, POOL_PLURAL, _preload_content=False), what
                )
            ]
        except (ApiException, HTTPError) as e:
            raise _classify(e, what) from None

    def patch_pod_metadata(
        self,
        name: str,
        namespace: str,
        resource_version: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> None:
        """Set (a string) or remove (None) ``labels`` and ``annotations`` of a pod in one JSON merge patch, only if the
        pod is still at ``resource_version``.

        The precondition: the caller decided from the pod as it was at ``resource_version`` (a cache's copy). A label
        that routes a model's Service is only safe to remove while the copies the decision counted are as it saw them,
        and a decision from an older copy (a lagging cache, a leader that lost its lease mid-tick) must not undo a
        newer write. Any change since, the kubelet's status writes included, fails the patch with 409; the caller
        decides again from a fresh copy on its next tick.

        Raises:
            KubeTemporaryError: HTTP 409 (the pod changed since ``resource_version``), throttling, outage.
            KubeNotFoundError: the pod is gone.
            KubePermanentError: other rejections (e.g. 422: an invalid label value).
        """
        body = {
            "metadata": {
                "resourceVersion": resource_version,
                "labels": dict(labels),
                "annotations": dict(annotations),
            }
        }
        try:
            # JSON merge patch (RFC 7386): None deletes a key; metadata.resourceVersion in a patch is the API
            # server's precondition (HTTP 409 when the object is at another version)
            client.CoreV1Api(self.api).patch_namespaced_pod(
                name, namespace, body, field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json"
            )
        except (ApiException, HTTPError) as e:
            raise _classify(e, f"patch pod {namespace}/{name}") from None

    def get_batched_model(self, name: str, namespace: str) -> dict[str, Any] | None:
        """The BatchedModel as stored now (None when it is gone)."""
        from batchfill.api.spec import GROUP, PLURAL, VERSION

        api: Any = client.CustomObjectsApi(self.api)
        try:
            return dict(api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise _classify(e, f"get BatchedModel {namespace}/{name}") from None
        except HTTPError as e:
            raise _classify(e, f"get BatchedModel {namespace}/{name}") from None

    def patch_status(self, body: Mapping[str, Any], status: Mapping[str, Any], plural: str = "") -> bool:
        """Merge-patch ``status`` of a BatchedModel (or of the batchfill.io kind ``plural``: gpupools) if it is
        still at ``body``'s resourceVersion.

        Returns False when the object changed since ``body`` was read (HTTP 409) or is gone (404): the caller's
        status was computed from an old state and must not overwrite a newer one; the next tick recomputes it.
        """
        from batchfill.api.spec import GROUP, PLURAL, VERSION

        plural = plural or PLURAL

        meta = body["metadata"]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": dict(status)}
        try:
            client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
                GROUP, VERSION, meta["namespace"], plural, meta["name"], patch, field_manager=FIELD_MANAGER
            )
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise _classify(e, f"patch status of {meta['namespace']}/{meta['name']}") from None
        except HTTPError as e:
            raise _classify(e, f"patch status of {meta['namespace']}/{meta['name']}") from None
        return True

    def post_event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``body`` (failures are logged, never raised: an event is not worth a retry)."""
        meta = body["metadata"]
        now = datetime.datetime.now(datetime.UTC)
        event: Any = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "batchfill"},
            "reportingComponent": "batchfill.io/operator",
            "reportingInstance": "batchfill",
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "count": 1,
        }
        try:
            client.CoreV1Api(self.api).create_namespaced_event(meta["namespace"], event)
        except (ApiException, HTTPError) as e:
            log.warning("event %s for %s/%s not posted: %s", reason, meta["namespace"], meta["name"], e)
