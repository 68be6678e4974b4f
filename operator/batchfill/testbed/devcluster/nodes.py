"""The dev cluster's fake nodes (kwok-managed Node objects, some advertising ``nvidia.com/gpu``) and the readiness
checks ``cluster_up`` waits on. Pods bound to a fake node become Running without a process (kwok)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchfill.testbed.devcluster.kubeconfig import api_client

FAKE_NODE_LABEL = "batchfill.io/dev-cluster-node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
NODE_IP_PREFIX = "10.240.0."
#: Pod CIDR of fake node i: 127.1.<i>.0/24. kwok gives pods addresses from their node's podCIDR, and loopback
#: addresses let a real tritonserver listen on its pod's IP with Triton's standard ports, so the operator reaches
#: pods at <pod IP>:8000 exactly as in a real cluster.
POD_CIDR_TEMPLATE = "127.1.{index}.0/24"


def fake_node(name: str, index: int, gpus: int) -> dict[str, Any]:
    """A kwok-managed Node; with ``gpus > 0`` it advertises ``nvidia.com/gpu`` and GPU-feature-discovery labels."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        FAKE_NODE_LABEL: "true",
    }
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    if gpus > 0:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.product": GPU_PRODUCT,
            "nvidia.com/gpu.memory": "81920",
            "node.kubernetes.io/instance-type": f"fake-{gpus}x-a100",
        }
        capacity[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": POD_CIDR_TEMPLATE.format(index=index), "podCIDRs": [POD_CIDR_TEMPLATE.format(index=index)]},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "addresses": [
                {"type": "InternalIP", "address": f"{NODE_IP_PREFIX}{index + 1}"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def desired_nodes(gpu_nodes: int, gpus_per_node: int, cpu_nodes: int = 0) -> list[dict[str, Any]]:
    """``gpu-node-<i>`` with ``gpus_per_node`` GPUs each, then ``cpu-node-<i>`` without GPUs."""
    nodes = [fake_node(f"gpu-node-{i}", i, gpus_per_node) for i in range(gpu_nodes)]
    nodes += [fake_node(f"cpu-node-{i}", gpu_nodes + i, 0) for i in range(cpu_nodes)]
    return nodes


def ensure_fake_nodes(kubeconfig: Path, nodes: Sequence[Mapping[str, Any]]) -> None:
    """Create the fake nodes that are missing, fix the capacity of existing ones, delete other fake nodes."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with api_client(kubeconfig) as api:
        core: Any = client.CoreV1Api(api)
        wanted = {n["metadata"]["name"]: n for n in nodes}
        existing = {n.metadata.name: n for n in core.list_node(label_selector=f"{FAKE_NODE_LABEL}=true").items}
        for name, node in wanted.items():
            if name not in existing:
                try:
                    core.create_node(node)
                    continue
                except ApiException as e:
                    if e.status != 409:
                        raise
            cap = node["status"]["capacity"]
            cur = existing.get(name)
            if cur is None or dict(cur.status.capacity or {}) != cap:
                core.patch_node(name, {"metadata": {"labels": node["metadata"]["labels"]}})
                core.patch_node_status(
                    name, {"status": {"capacity": cap, "allocatable": node["status"]["allocatable"]}}
                )
        for name in set(existing) - set(wanted):
            with contextlib.suppress(ApiException):
                core.delete_node(name)


def nodes_ready(kubeconfig: Path, names: set[str]) -> bool:
    """Every named node is Ready, has no NoSchedule/NoExecute taint and shows its capacity as allocatable."""
    from kubernetes import client

    with api_client(kubeconfig) as api:
        items: list[Any] = client.CoreV1Api(api).list_node().items
    nodes = {n.metadata.name: n for n in items}
    for name in names:
        n = nodes.get(name)
        if n is None or not n.status or not n.status.conditions:
            return False
        if not any(c.type == "Ready" and c.status == "True" for c in n.status.conditions):
            return False
        if any(t.effect in ("NoSchedule", "NoExecute") for t in (n.spec.taints or [])):
            return False  # node.kubernetes.io/not-ready until the node lifecycle controller sees Ready
    return True


def default_service_account_exists(kubeconfig: Path) -> bool:
    """ServiceAccount ``default/default`` exists (the controller-manager creates it; raises until then)."""
    from kubernetes import client

    with api_client(kubeconfig) as api:
        client.CoreV1Api(api).read_namespaced_service_account("default", "default")
    return True
