"""A real Prometheus that finds Triton pods as prometheus-operator would for a ServiceMonitor.

:func:`service_monitor_scrape_config` turns a ServiceMonitor (the dict
:func:`batchfill.render.kube.build_service_monitor` renders) into the scrape job prometheus-operator generates
for it with ``serviceDiscoveryRole: EndpointSlice``: a ``keep`` on each ``selector.matchLabels`` label of the
Service and on the endpoint's port name, then the target labels ``namespace``, ``service``, ``pod``,
``container``, ``job`` (the Service's name) and ``endpoint`` (the port name), as in prometheus-operator's
``pkg/prometheus/promcfg.go``
(https://github.com/prometheus-operator/prometheus-operator/blob/main/pkg/prometheus/promcfg.go). The operator's
PromQL (:mod:`batchfill.adapters.metrics`) reads the ``namespace`` and ``pod`` labels only.

Discovery: Debian's Prometheus 2.42 (``2.42.0+ds``) is built without the Kubernetes service discovery (its config
parser rejects ``kubernetes_sd_configs``), so :class:`KubernetesPrometheus` does that part itself: a thread lists
the monitored namespaces' EndpointSlices, Services and Pods every second and writes, per endpoint address and
port, the ``__meta_kubernetes_*`` labels Prometheus' ``role: endpointslice`` discovery gives
(https://prometheus.io/docs/prometheus/latest/configuration/configuration/#endpointslice) into a ``file_sd``
file. Prometheus itself then applies the relabeling above, so what is kept and how series are labelled is
Prometheus' and prometheus-operator's rule, not ours. With a Prometheus that has Kubernetes discovery, pass
``kubeconfig`` to :func:`service_monitor_scrape_config` and no discovery thread is needed.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from batchfill.testbed.prometheus_local import LocalPrometheus

SLICE = "__meta_kubernetes_endpointslice"


def label_name(label: str) -> str:
    """A Kubernetes label as a Prometheus meta-label suffix (every character outside [a-zA-Z0-9_] becomes ``_``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def service_monitor_scrape_config(
    monitor: Mapping[str, Any],
    *,
    file_sd: Path | None = None,
    kubeconfig: Path | None = None,
    endpoint_index: int = 0,
) -> dict[str, Any]:
    """The scrape job prometheus-operator generates for endpoint ``endpoint_index`` of ``monitor`` (role
    endpointslice), its targets from ``file_sd`` (written by :class:`KubernetesPrometheus`) or from Prometheus' own
    Kubernetes discovery with ``kubeconfig``.

    Args:
        monitor: a ``monitoring.coreos.com/v1`` ServiceMonitor as a dict, with ``spec.selector.matchLabels``,
            ``spec.namespaceSelector.matchNames`` (else the monitor's own namespace) and ``spec.endpoints[i]``
            naming a ``port`` (``path`` and ``interval`` optional).

    Raises:
        ValueError: the endpoint names no port (the ``targetPort`` form is not supported here), or not exactly
            one of ``file_sd`` and ``kubeconfig`` is given.
    """
    if (file_sd is None) == (kubeconfig is None):
        raise ValueError("give exactly one of file_sd and kubeconfig")
    meta, spec = monitor["metadata"], monitor["spec"]
    endpoint = spec["endpoints"][endpoint_index]
    port = endpoint.get("port")
    if not port:
        raise ValueError(f"ServiceMonitor {meta['name']} endpoint {endpoint_index} names no port")
    relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted(((spec.get("selector") or {}).get("matchLabels") or {}).items()):
        name = label_name(key)
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{name}",
                    f"__meta_kubernetes_service_labelpresent_{name}",
                ],
                "regex": f"({re.escape(str(value))});true",
            }
        )
    relabel += [
        {"action": "keep", "source_labels": [f"{SLICE}_port_name"], "regex": re.escape(port)},
        *(
            {
                "source_labels": [f"{SLICE}_address_target_kind", f"{SLICE}_address_target_name"],
                "separator": ";",
                "regex": f"{kind};(.*)",
                "replacement": "${1}",
                "target_label": kind.lower(),
            }
            for kind in ("Node", "Pod")
        ),
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": port},
    ]
    job: dict[str, Any] = {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{endpoint_index}",
        "honor_labels": False,
        "metrics_path": endpoint.get("path", "/metrics"),
        "relabel_configs": relabel,
    }
    if kubeconfig is not None:
        namespaces = monitored_namespaces(monitor)
        job["kubernetes_sd_configs"] = [
            {"role": "endpointslice", "kubeconfig_file": str(kubeconfig), "namespaces": {"names": namespaces}}
        ]
    else:
        job["file_sd_configs"] = [{"files": [str(file_sd)], "refresh_interval": "1s"}]
    if endpoint.get("interval"):
        job["scrape_interval"] = endpoint["interval"]
    return job


def monitored_namespaces(monitor: Mapping[str, Any]) -> list[str]:
    """``spec.namespaceSelector.matchNames``, else the ServiceMonitor's own namespace."""
    names = ((monitor["spec"].get("namespaceSelector") or {}).get("matchNames")) or [monitor["metadata"]["namespace"]]
    return [str(n) for n in names]


def _object_labels(prefix: str, labels: Mapping[str, str] | None) -> dict[str, str]:
    out = {}
    for key, value in (labels or {}).items():
        out[f"{prefix}_label_{label_name(key)}"] = str(value)
        out[f"{prefix}_labelpresent_{label_name(key)}"] = "true"
    return out


def _flag(value: Any) -> str:
    return "true" if value else "false"


def endpointslice_targets(
    slices: Iterable[Mapping[str, Any]], services: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The targets Prometheus' ``role: endpointslice`` discovery makes of ``slices``: one per endpoint address and
    slice port, with its ``__meta_kubernetes_*`` labels (slice, endpoint, port; the owning Service's labels; the
    target Pod's labels and the container whose port it is), as ``file_sd`` entries.

    All arguments are API objects as JSON dicts (``discovery.k8s.io/v1`` EndpointSlice, v1 Service, v1 Pod).
    Pods' ports that no slice names are not added (Prometheus adds them too; a ServiceMonitor's port keep drops
    them).
    """
    by_service = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services}
    by_pod = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    entries: list[dict[str, Any]] = []
    for eps in slices:
        meta = eps["metadata"]
        ns = meta["namespace"]
        base = {"__meta_kubernetes_namespace": ns, f"{SLICE}_name": meta["name"],
                f"{SLICE}_address_type": str(eps.get("addressType", ""))}  # fmt: skip
        base |= _object_labels(SLICE, meta.get("labels"))
        service_name = (meta.get("labels") or {}).get("kubernetes.io/service-name")
        service = by_service.get((ns, service_name or ""))
        if service is not None:
            base["__meta_kubernetes_service_name"] = service["metadata"]["name"]
            base |= _object_labels("__meta_kubernetes_service", service["metadata"].get("labels"))
        for ep in eps.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            labels = {**base, f"{SLICE}_endpoint_conditions_ready": _flag(cond.get("ready")),
                      f"{SLICE}_endpoint_conditions_serving": _flag(cond.get("serving")),
                      f"{SLICE}_endpoint_conditions_terminating": _flag(cond.get("terminating"))}  # fmt: skip
            if ep.get("nodeName"):
                labels[f"{SLICE}_endpoint_node_name"] = ep["nodeName"]
            target = ep.get("targetRef") or {}
            if target:
                labels[f"{SLICE}_address_target_kind"] = str(target.get("kind", ""))
                labels[f"{SLICE}_address_target_name"] = str(target.get("name", ""))
            pod = by_pod.get((ns, target.get("name", ""))) if target.get("kind") == "Pod" else None
            for port in eps.get("ports") or []:
                port_labels = {**labels, f"{SLICE}_port": str(port.get("port", "")),
                               f"{SLICE}_port_name": str(port.get("name") or ""),
                               f"{SLICE}_port_protocol": str(port.get("protocol", ""))}  # fmt: skip
                if port.get("appProtocol"):
                    port_labels[f"{SLICE}_port_app_protocol"] = port["appProtocol"]
                if pod is not None:
                    port_labels |= _pod_labels(pod, port.get("port"))
                for address in ep.get("addresses") or []:
                    entries.append({"targets": [f"{address}:{port.get('port')}"], "labels": port_labels})
    return entries


def _pod_labels(pod: Mapping[str, Any], port_number: Any) -> dict[str, str]:
    """A target Pod's ``__meta_kubernetes_pod_*`` labels, with the container that declares ``port_number``."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), "unknown")
    out = {"__meta_kubernetes_pod_name": meta["name"], "__meta_kubernetes_pod_ip": str(status.get("podIP", "")),
           "__meta_kubernetes_pod_node_name": str(spec.get("nodeName", "")),
           "__meta_kubernetes_pod_host_ip": str(status.get("hostIP", "")),
           "__meta_kubernetes_pod_uid": str(meta.get("uid", "")),
           "__meta_kubernetes_pod_phase": str(status.get("phase", "")),
           "__meta_kubernetes_pod_ready": str(ready).lower()}  # fmt: skip
    out |= _object_labels("__meta_kubernetes_pod", meta.get("labels"))
    for container in spec.get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("containerPort") == port_number:
                out |= {"__meta_kubernetes_pod_container_name": container["name"],
                        "__meta_kubernetes_pod_container_image": str(container.get("image", "")),
                        "__meta_kubernetes_pod_container_port_name": str(p.get("name") or ""),
                        "__meta_kubernetes_pod_container_port_number": str(port_number),
                        "__meta_kubernetes_pod_container_port_protocol": str(p.get("protocol", "TCP")),
                        "__meta_kubernetes_pod_container_init": "false"}  # fmt: skip
    return out


class KubernetesPrometheus(LocalPrometheus):
    """A :class:`LocalPrometheus` scraping what :func:`service_monitor_scrape_config` jobs select, its targets
    discovered from the cluster of ``kubeconfig`` (module docstring); start, stop and the HTTP API as there.

    Args:
        monitors: ServiceMonitors (dicts) to generate jobs for.
        kubeconfig: the cluster to discover in.
        poll_s: how often the discovery lists the namespaces' EndpointSlices, Services and Pods.
        **kwargs: :class:`LocalPrometheus`'s.
    """

    def __init__(
        self, monitors: Sequence[Mapping[str, Any]], kubeconfig: Path, *, poll_s: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__((), **kwargs)
        self.monitors = [dict(m) for m in monitors]
        self.kubeconfig = kubeconfig
        self.poll_s = poll_s
        self._stop_discovery = threading.Event()
        self._discovery: threading.Thread | None = None
        self.discovery_error = ""

    @property
    def discovered_path(self) -> Path:
        return self._dir() / "endpointslices.json"

    def config(self) -> dict[str, Any]:
        """The file-SD config of :class:`LocalPrometheus` with its jobs replaced by the monitors' jobs."""
        jobs = [service_monitor_scrape_config(m, file_sd=self.discovered_path) for m in self.monitors]
        return {**super().config(), "scrape_configs": jobs}

    def discover(self, api_client: Any) -> list[dict[str, Any]]:
        """List the monitored namespaces once and write :attr:`discovered_path` (atomically); the entries."""
        from kubernetes import client

        core, discovery = client.CoreV1Api(api_client), client.DiscoveryV1Api(api_client)
        ser = api_client.sanitize_for_serialization
        slices: list[Any] = []
        services: list[Any] = []
        pods: list[Any] = []
        for ns in sorted({n for m in self.monitors for n in monitored_namespaces(m)}):
            slices += ser(discovery.list_namespaced_endpoint_slice(ns).items)
            services += ser(core.list_namespaced_service(ns).items)
            pods += ser(core.list_namespaced_pod(ns).items)
        entries = endpointslice_targets(slices, services, pods)
        tmp = self.discovered_path.with_name(f".{self.discovered_path.name}.tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(self.discovered_path)
        return entries

    def _follow(self) -> None:
        from batchfill.testbed import devcluster

        with devcluster.api_client(self.kubeconfig) as api_client:
            while True:
                try:
                    self.discover(api_client)
                    self.discovery_error = ""
                except Exception as e:  # the API server away for a while: keep the last targets, as Prometheus does
                    self.discovery_error = f"{type(e).__name__}: {e}"
                if self._stop_discovery.wait(self.poll_s):
                    return

    def start(self) -> KubernetesPrometheus:
        """Write an empty discovery file, start Prometheus (:meth:`LocalPrometheus.start`), then the discovery."""
        if not self.discovered_path.exists():
            self.discovered_path.write_text("[]")
        super().start()
        self._stop_discovery.clear()
        self._discovery = threading.Thread(target=self._follow, name="prometheus-discovery", daemon=True)
        self._discovery.start()
        return self

    def stop(self) -> int | None:
        """Stop the discovery, then Prometheus (:meth:`LocalPrometheus.stop`)."""
        self._stop_discovery.set()
        if self._discovery is not None:
            self._discovery.join(timeout=self.poll_s + 15)
            self._discovery = None
        return super().stop()

    def wait_for_pods(self, pods: Sequence[str], timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Wait until an active target is ``up`` for each of ``pods`` (its ``pod`` label); returns them.

        Raises:
            TimeoutError: with the targets seen, when some pod has none ``up`` after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            active = self.active_targets()
            up = [a for a in active if a["labels"].get("pod") in pods and a.get("health") == "up"]
            if {a["labels"]["pod"] for a in up} >= set(pods):
                return up
            if time.monotonic() > deadline:
                seen = [(a["labels"].get("pod"), a.get("health"), a.get("lastError")) for a in active]
                raise TimeoutError(
                    f"Prometheus targets after {timeout_s:.0f} s: {seen}; expected pods {list(pods)}"
                    + (f"; discovery: {self.discovery_error}" if self.discovery_error else "")
                )
            time.sleep(0.5)
