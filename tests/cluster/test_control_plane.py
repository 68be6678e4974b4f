"""Smoke tests of the real control plane: fake GPU nodes, real scheduling, controllers, GC, ServiceAccount tokens.

They run against the local dev cluster, or against an existing cluster with ``BATCHFILL_USE_EXISTING_CLUSTER=1``
(see conftest.py); everything they create lives in namespaces they create and delete.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.testbed import devcluster
from batchfill.testbed.devcluster import GPU_RESOURCE

from .conftest import GPU_NODES, GPUS_PER_NODE
from .support import (
    Kube,
    gpu_nodes,
    gpus_of,
    namespace_gone,
    pause_deployment,
    pod_condition,
    pods_of,
    require_gpus,
    temp_namespace,
    wait_for,
)

pytestmark = pytest.mark.cluster


def test_fake_gpu_nodes_are_ready_with_gpu_allocatable(kube: Kube) -> None:
    nodes = gpu_nodes(kube)  # Ready, schedulable (no not-ready taint left), nvidia.com/gpu > 0
    if kube.existing:
        if not nodes:
            require_gpus(kube)  # skips (fails under CI) and says how to fake GPU capacity
        return
    assert sorted(n.metadata.name for n in nodes) == [f"gpu-node-{i}" for i in range(GPU_NODES)]
    for n in nodes:
        assert gpus_of(n) == GPUS_PER_NODE
        assert n.status.capacity[GPU_RESOURCE] == str(GPUS_PER_NODE)
        assert n.metadata.labels["nvidia.com/gpu.present"] == "true"
        assert n.metadata.annotations["kwok.x-k8s.io/node"] == "fake"


def test_gpu_pods_fill_the_gpus_and_the_next_one_is_pending(kube: Kube) -> None:
    free = require_gpus(kube)
    total = sum(free.values())
    if not kube.existing:
        assert free == {f"gpu-node-{i}": GPUS_PER_NODE for i in range(GPU_NODES)}
    with temp_namespace(kube, "bf-gpu-") as ns:
        kube.apps.create_namespaced_deployment(ns, pause_deployment("gpu-fill", total + 1, gpus=1))

        def settled() -> tuple[list[client.V1Pod], list[client.V1Pod]] | None:
            pods = pods_of(kube, ns, "app=gpu-fill")
            running = [p for p in pods if p.status.phase == "Running"]
            pending = [p for p in pods if p.status.phase == "Pending" and not p.spec.node_name]
            unschedulable = [p for p in pending if (c := pod_condition(p, "PodScheduled")) and c.status == "False"]
            if len(pods) == total + 1 and len(running) == total and len(unschedulable) == 1:
                return running, unschedulable
            return None

        running, pending = wait_for(f"{total} Running GPU pods and 1 unschedulable", settled, timeout_s=120)
        per_node = Counter(p.spec.node_name for p in running)
        assert set(per_node) <= set(free)
        for node, n in per_node.items():
            assert n <= free[node], f"{n} one-GPU pods on {node}, which had {free[node]} free GPUs"
        cond = pod_condition(pending[0], "PodScheduled")
        assert cond.reason == "Unschedulable"
        assert f"Insufficient {GPU_RESOURCE}" in cond.message, cond.message


def test_deleting_a_deployment_garbage_collects_its_replicaset_and_pods(kube: Kube) -> None:
    with temp_namespace(kube, "bf-gc-") as ns:
        dep = kube.apps.create_namespaced_deployment(ns, pause_deployment("gc", 2))
        rs = wait_for("the Deployment's ReplicaSet", lambda: kube.apps.list_namespaced_replica_set(ns).items)
        assert [o.uid for o in rs[0].metadata.owner_references] == [dep.metadata.uid]

        def two_running() -> list[client.V1Pod] | None:
            pods = pods_of(kube, ns, "app=gc")
            return pods if sum(p.status.phase == "Running" for p in pods) == 2 else None

        pods = wait_for("2 Running pods", two_running)
        assert all(p.metadata.owner_references[0].uid == rs[0].metadata.uid for p in pods)
        # The ServiceAccount admission plugin is on: pods get the projected API token volume.
        assert any(v.name.startswith("kube-api-access-") for v in pods[0].spec.volumes or []), pods[0].spec.volumes

        kube.apps.delete_namespaced_deployment("gc", ns, propagation_policy="Background")

        def collected() -> bool:
            return not kube.apps.list_namespaced_replica_set(ns).items and not pods_of(kube, ns, "app=gc")

        wait_for("ReplicaSet and pods garbage-collected", collected, timeout_s=90)


def test_namespace_deletion_completes(kube: Kube) -> None:
    ns = str(kube.core.create_namespace({"metadata": {"generateName": "bf-ns-"}}).metadata.name)
    try:
        wait_for("the default ServiceAccount", lambda: kube.core.read_namespaced_service_account("default", ns))
        kube.core.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"k": "v"}})
        kube.apps.create_namespaced_deployment(ns, pause_deployment("web", 1))
        wait_for("a Running pod", lambda: [p for p in pods_of(kube, ns, "app=web") if p.status.phase == "Running"])
    finally:
        kube.core.delete_namespace(ns)
    # Without the namespace controller (KCM) it would stay Terminating forever.
    wait_for(f"namespace {ns} to be gone", lambda: namespace_gone(kube, ns), timeout_s=120)


def test_service_account_token_kubeconfig_authenticates_as_the_service_account(kube: Kube, tmp_path: Path) -> None:
    with temp_namespace(kube, "bf-sa-") as ns:
        kube.core.create_namespaced_service_account(ns, {"metadata": {"name": "operator"}})
        kube.rbac.create_namespaced_role(ns, {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        })  # fmt: skip
        kube.rbac.create_namespaced_role_binding(ns, {
            "metadata": {"name": "operator-pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}],
        })  # fmt: skip
        kc = devcluster.service_account_kubeconfig(kube.kubeconfig, ns, "operator", tmp_path / "sa.kubeconfig")
        with devcluster.api_client(kc) as api:
            review = client.AuthenticationV1Api(api).create_self_subject_review(
                client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
            )
            user = review.status.user_info
            assert user.username == f"system:serviceaccount:{ns}:operator"
            assert "system:masters" not in (user.groups or [])
            core = client.CoreV1Api(api)
            wait_for("RBAC to allow listing pods", lambda: core.list_namespaced_pod(ns) is not None, timeout_s=30)
            with pytest.raises(ApiException) as forbidden:
                core.list_node()
            assert forbidden.value.status == 403
        # kubectl with the same kubeconfig (the built one, or the machine's when testing an existing cluster).
        r = devcluster.kubectl(kc, "auth", "can-i", "list", "pods", "-n", ns, check=False)
        assert r.stdout.strip() == "yes", r.stderr
        r = devcluster.kubectl(kc, "auth", "can-i", "list", "secrets", "-n", ns, check=False)
        assert r.stdout.strip() == "no", r.stderr


def test_cluster_up_reuses_the_running_cluster(kube: Kube) -> None:
    if kube.existing or kube.info is None:
        pytest.skip("only for the local dev cluster")
    again = devcluster.cluster_up(kube.info.run_dir, GPU_NODES, GPUS_PER_NODE, quiet=True, build=False)
    assert again.reused
    assert again.pids == kube.info.pids
    assert again.server == kube.info.server
    assert again.pod_block == kube.info.pod_block  # the pods keep their addresses
    assert devcluster.cluster_status(kube.info.run_dir) is not None


def _pod_ip(kube: Kube, ns: str) -> str:
    """The pod IP of a new pause pod in ``ns`` once kwok has given it one."""
    kube.apps.create_namespaced_deployment(ns, pause_deployment("ip", 1))

    def ip() -> str | None:
        return next((p.status.pod_ip for p in pods_of(kube, ns, "app=ip") if p.status.pod_ip), None)

    return wait_for(f"a pod IP in namespace {ns}", ip, timeout_s=60)


def test_a_second_dev_cluster_gives_its_pods_ips_in_another_block(kube: Kube, tmp_path: Path) -> None:
    """Two dev clusters on one machine (a demo next to the tests): pods' tritonservers listen on the pod IPs,
    so the clusters' pod address blocks must differ."""
    if kube.existing or kube.info is None:
        pytest.skip("only for the local dev cluster")
    run = tmp_path / "second-cluster"
    try:
        second = devcluster.cluster_up(run, 1, 1, quiet=True, build=False, die_with_parent=True)
        assert second.pod_block
        assert second.pod_block != kube.info.pod_block
        claims = devcluster.claimed_pod_blocks()
        assert claims.get(ipaddress.IPv4Network(kube.info.pod_block)) == kube.info.run_dir
        assert claims.get(ipaddress.IPv4Network(second.pod_block)) == second.run_dir
        with temp_namespace(kube, "bf-block-") as ns:
            first_ip = _pod_ip(kube, ns)
        other = Kube(kubeconfig=second.kubeconfig, existing=False, info=second)
        try:
            second_ip = _pod_ip(other, "default")
        finally:
            other.close()
    finally:
        devcluster.cluster_down(run, quiet=True)
    assert ipaddress.ip_address(first_ip) in ipaddress.ip_network(kube.info.pod_block)
    assert ipaddress.ip_address(second_ip) in ipaddress.ip_network(second.pod_block)
    assert not run.exists()
    assert ipaddress.IPv4Network(second.pod_block) not in devcluster.claimed_pod_blocks()  # released by down
    assert ipaddress.IPv4Network(kube.info.pod_block) in devcluster.claimed_pod_blocks()
