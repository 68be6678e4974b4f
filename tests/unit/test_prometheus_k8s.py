"""batchfill.testbed.prometheus_k8s: the ServiceMonitor's scrape job and the EndpointSlice discovery (pure parts).

The relabeling itself is Prometheus' own: tests/cluster/test_demo.py's real-node demo checks that the scraped
series carry the ``namespace`` and ``pod`` labels the operator's PromQL reads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from batchfill.render.kube import MODEL_LABEL, Owner, build_service_monitor
from batchfill.testbed.prometheus_k8s import (
    endpointslice_targets,
    label_name,
    monitored_namespaces,
    service_monitor_scrape_config,
)

OWNER = Owner("text-recognizer", "ocr", "uid-1")


def _relabel(config: dict[str, Any], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus' relabel semantics for the actions the job uses (replace, keep, drop); None when dropped."""
    labels = dict(labels)
    for rule in config["relabel_configs"]:
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            labels[rule["target_label"]] = match.expand(rule.get("replacement", "${1}").replace("${1}", r"\g<1>"))
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def _slice(ready: bool = True, port_name: str = "metrics") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "text-recognizer-triton-abcde",
            "namespace": "ocr",
            "labels": {"kubernetes.io/service-name": "text-recognizer-triton"},
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": ["10.5.1.2"],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "nodeName": "real-node-0",
                "targetRef": {"kind": "Pod", "name": "triton-0", "namespace": "ocr"},
            }
        ],
        "ports": [{"name": port_name, "port": 8002, "protocol": "TCP"}, {"name": "grpc", "port": 8001}],
    }


SERVICE = {
    "metadata": {
        "name": "text-recognizer-triton",
        "namespace": "ocr",
        "labels": {"app.kubernetes.io/name": "triton", MODEL_LABEL: "text-recognizer"},
    }
}
POD = {
    "metadata": {"name": "triton-0", "namespace": "ocr", "uid": "u", "labels": {"app": "x"}},
    "spec": {
        "nodeName": "real-node-0",
        "containers": [{"name": "triton", "image": "img", "ports": [{"name": "metrics", "containerPort": 8002}]}],
    },
    "status": {"podIP": "10.5.1.2", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def test_label_name_replaces_what_prometheus_cannot_hold() -> None:
    assert label_name("app.kubernetes.io/name") == "app_kubernetes_io_name"
    assert label_name("a-b_c9") == "a_b_c9"


def test_scrape_job_of_the_rendered_service_monitor() -> None:
    monitor = build_service_monitor(OWNER, interval_s=2)
    job = service_monitor_scrape_config(monitor, file_sd=Path("/x/targets.json"))
    assert job["job_name"] == "serviceMonitor/ocr/text-recognizer-triton/0"
    assert job["scrape_interval"] == "2s"
    assert job["metrics_path"] == "/metrics"
    assert job["file_sd_configs"] == [{"files": ["/x/targets.json"], "refresh_interval": "1s"}]
    keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert [r["source_labels"][0] for r in keeps] == [
        "__meta_kubernetes_service_label_app_kubernetes_io_name",
        "__meta_kubernetes_service_label_batchfill_io_batchedmodel",
        "__meta_kubernetes_endpointslice_port_name",
    ]
    assert keeps[-1]["regex"] == "metrics"
    k8s = service_monitor_scrape_config(monitor, kubeconfig=Path("/k"))
    assert k8s["kubernetes_sd_configs"] == [
        {"role": "endpointslice", "kubeconfig_file": "/k", "namespaces": {"names": ["ocr"]}}
    ]
    assert "file_sd_configs" not in k8s


def test_scrape_job_needs_one_source_and_a_port() -> None:
    monitor = build_service_monitor(OWNER)
    with pytest.raises(ValueError, match="exactly one"):
        service_monitor_scrape_config(monitor)
    with pytest.raises(ValueError, match="exactly one"):
        service_monitor_scrape_config(monitor, file_sd=Path("a"), kubeconfig=Path("b"))
    monitor["spec"]["endpoints"][0].pop("port")
    with pytest.raises(ValueError, match="names no port"):
        service_monitor_scrape_config(monitor, file_sd=Path("a"))


def test_namespaces_default_to_the_monitor_s_own() -> None:
    monitor = build_service_monitor(OWNER)
    assert monitored_namespaces(monitor) == ["ocr"]
    monitor["spec"].pop("namespaceSelector")
    assert monitored_namespaces(monitor) == ["ocr"]


def test_discovered_target_relabelled_as_prometheus_operator_labels_it() -> None:
    entries = endpointslice_targets([_slice()], [SERVICE], [POD])
    assert [e["targets"] for e in entries] == [["10.5.1.2:8002"], ["10.5.1.2:8001"]]
    meta = entries[0]["labels"]
    assert meta["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] == "true"
    assert meta["__meta_kubernetes_pod_container_name"] == "triton"
    assert meta["__meta_kubernetes_pod_ready"] == "true"
    assert meta["__meta_kubernetes_service_labelpresent_batchfill_io_batchedmodel"] == "true"
    job = service_monitor_scrape_config(build_service_monitor(OWNER), file_sd=Path("t"))
    kept = [_relabel(job, {**e["labels"], "job": job["job_name"]}) for e in entries]
    assert kept[1] is None  # the grpc port is not the monitor's
    assert kept[0] == {
        "job": "text-recognizer-triton",
        "namespace": "ocr",
        "service": "text-recognizer-triton",
        "pod": "triton-0",
        "container": "triton",
        "endpoint": "metrics",
    }


def test_other_services_and_failed_pods_are_dropped() -> None:
    other = {"metadata": {**SERVICE["metadata"], "labels": {"app.kubernetes.io/name": "triton"}}}
    job = service_monitor_scrape_config(build_service_monitor(OWNER), file_sd=Path("t"))
    entry = endpointslice_targets([_slice()], [other], [POD])[0]
    assert _relabel(job, entry["labels"]) is None
    failed = {**POD, "status": {**POD["status"], "phase": "Failed"}}
    entry = endpointslice_targets([_slice()], [SERVICE], [failed])[0]
    assert _relabel(job, entry["labels"]) is None


def test_not_ready_endpoints_are_targets_marked_not_ready() -> None:
    """As Prometheus' own discovery does: a not-ready endpoint is a target (the operator counts Ready pods)."""
    entry = endpointslice_targets([_slice(ready=False)], [SERVICE], [POD])[0]
    assert entry["labels"]["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] == "false"
