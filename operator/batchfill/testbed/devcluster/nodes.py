"""The dev cluster's fake nodes (kwok-managed Node objects, some advertising ``nvidia.com/gpu``) and the readiness
checks ``cluster_up`` waits on. Pods bound to a fake node become Running without a process (kwok).

Fake node ``i`` has the ``podCIDR`` ``127.<a>.<i>.0/24`` of its cluster's pod block ``127.<a>.0.0/16``
(:mod:`.pod_block`): kwok gives pods addresses from their node's ``podCIDR``, and loopback addresses let a real
tritonserver listen on its pod's IP with Triton's standard ports, so the operator reaches pods at
``<pod IP>:8000`` exactly as in a real cluster.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchfill.testbed.devcluster.kubeconfig import api_client
from batchfill.testbed.devcluster.pod_block import choose_pod_block, claimed_pod_blocks, node_pod_cidr
from batchfill.testbed.listeners import tcp_listeners

FAKE_NODE_LABEL = "batchfill.io/dev-cluster-node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
NODE_IP_PREFIX = "10.240.0."


def gpu_labels(gpus: int) -> dict[str, str]:
    """The labels NVIDIA's GPU feature discovery puts on a node with ``gpus`` GPUs (of :data:`GPU_PRODUCT`, 80 GiB
    each: ``nvidia.com/gpu.memory`` is in MiB), and an instance type; the fake GPU nodes and the real nodes with
    fake GPUs carry them, so pods that select GPU nodes by them schedule in the dev cluster."""
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.product": GPU_PRODUCT,
        "nvidia.com/gpu.memory": "81920",
        "node.kubernetes.io/instance-type": f"fake-{gpus}x-a100",
    }


def fake_node(name: str, index: int, gpus: int, pod_block: ipaddress.IPv4Network | str) -> dict[str, Any]:
    """A kwok-managed Node; with ``gpus > 0`` it advertises ``nvidia.com/gpu`` and GPU-feature-discovery labels.

    Its ``podCIDR`` is the ``index``-th /24 of ``pod_block`` (a ``127.<a>.0.0/16``; ``index`` in 0..255).
    """
    pod_cidr = node_pod_cidr(pod_block, index)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        FAKE_NODE_LABEL: "true",
    }
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    if gpus > 0:
        labels |= gpu_labels(gpus)
        capacity[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "addresses": [
                {"type": "InternalIP", "address": f"{NODE_IP_PREFIX}{index + 1}"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def desired_nodes(
    gpu_nodes: int, gpus_per_node: int, cpu_nodes: int = 0, *, pod_block: ipaddress.IPv4Network | str | None = None
) -> list[dict[str, Any]]:
    """``gpu-node-<i>`` with ``gpus_per_node`` GPUs each, then ``cpu-node-<i>`` without GPUs, their pod CIDRs in
    ``pod_block``.

    ``pod_block`` None (fake nodes added to an existing cluster): a block no dev cluster has claimed and nothing
    listens in right now (:func:`~.pod_block.choose_pod_block`); it is not claimed, so a later dev cluster may
    choose it once nothing listens in it.
    """
    if pod_block is None:
        listening = [lst.address for lst in tcp_listeners()]
        pod_block = choose_pod_block(claimed_pod_blocks(), listening, os.getpid())
    nodes = [fake_node(f"gpu-node-{i}", i, gpus_per_node, pod_block) for i in range(gpu_nodes)]
    nodes += [fake_node(f"cpu-node-{i}", gpu_nodes + i, 0, pod_block) for i in range(cpu_nodes)]
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
