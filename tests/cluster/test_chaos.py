"""Faults on the real local cluster: the operator killed with SIGKILL mid-create and mid-update, etcd and
kube-apiserver killed under it, a Deployment deleted by hand, a namespace deleted under its BatchedModels, and the
same BatchedModel created and deleted 50 times. After each, the cluster converges to the spec: every model is
Planned for its current generation with exactly one Deployment, ConfigMap and Service, nothing is stuck in
Terminating, and the pods rolled exactly as often as the config changed.

The operator runs as a subprocess with the install's ServiceAccount (as in test_operator.py), restarted by the
tests as a Deployment's kubelet would (``support.Operator``). Triton pods are kwok pods (no Triton process, so no
scaling signals: scaling under faults is covered by test_scaling.py's Prometheus outage, the status precondition and
the operator killed between its status write and its scale call).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from batchfill.api.reasons import ConditionType, SpecReason
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.render.kube import CONFIG_HASH_ANNOTATION
from batchfill.testbed import devcluster
from batchfill.testbed.install import install_operator_rbac

from .conftest import USE_EXISTING
from .support import DenyPolicy, Kube, Operator, model_volume, temp_namespace, until, wait_for
from .test_operator import batched_model, children, condition, custom, get_bm, is_true

pytestmark = pytest.mark.cluster

#: What a converged model looks like within this many seconds of the fault (2 shared cores: generous).
CONVERGE_S = 120.0


@pytest.fixture(scope="module")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    work = tmp_path_factory.mktemp("chaos")
    install_operator_rbac(kube.kubeconfig, work)
    op = Operator(kube, work, args=("--verbose",))
    op.start()
    try:
        yield op
    finally:
        op.stop()
    crashes = [m.group(0) for m in re.finditer(r"Traceback \(most recent call last\):\n(?:.*\n){0,30}", op.logs())]
    # kopf logs handler errors with their traceback only for unexpected exceptions: none is expected here
    assert not crashes, "the operator logged an unexpected exception:\n" + crashes[0][-3000:]


def converged(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    """The model when it is Planned for its generation and has its three children, else None."""
    try:
        bm = get_bm(kube, ns, name)
    except ApiException:
        return None
    status = bm.get("status") or {}
    if status.get("observedGeneration") != bm["metadata"]["generation"] or not is_true(bm, ConditionType.PLANNED):
        return None
    kids = children(kube, ns, name)
    if len(kids) != 3:
        return None
    want = kids["configmap"].metadata.annotations[CONFIG_HASH_ANNOTATION]
    if kids["deployment"].spec.template.metadata.annotations.get(CONFIG_HASH_ANNOTATION) != want:
        return None
    return bm


def replica_sets(kube: Kube, ns: str, name: str) -> list[Any]:
    return [
        rs
        for rs in kube.apps.list_namespaced_replica_set(ns).items
        if any(o.name == f"{name}-triton" for o in rs.metadata.owner_references or [])
    ]


def test_operator_killed_mid_create_and_mid_update_converges_once_restarted(kube: Kube, operator: Operator) -> None:
    names = [f"crash-{i}" for i in range(3)]
    with temp_namespace(kube, prefix="bf-chaos-") as ns:
        model_volume(kube, ns)
        for name in names:
            custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model(name))
        time.sleep(0.5)  # the operator is handling the creations now (or has not seen them yet)
        operator.kill()
        operator.start()
        for name in names:
            until(f"{name} converged after the restart", lambda n=name: converged(kube, ns, n), bool, CONVERGE_S)
            assert len(replica_sets(kube, ns, name)) == 1, "created once: one ReplicaSet"

        for name in names:
            custom(kube).patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, {"spec": {"sla": {"latencyP99Ms": 70, "networkOverheadMs": 10}}}
            )
        time.sleep(0.3)
        operator.kill()
        operator.start()
        for name in names:
            bm = until(
                f"{name} converged to the new SLA",
                lambda n=name: converged(kube, ns, n),
                lambda b: b is not None and b["status"]["plan"]["serverBudgetMs"] == 60,
                CONVERGE_S,
            )
            assert bm["metadata"]["generation"] == 2
        time.sleep(5)  # a second roll, if any, has had time to start
        for name in names:
            assert len(replica_sets(kube, ns, name)) == 2, f"{name}: the config changed once, so one roll"
        assert operator.alive()


def test_etcd_and_api_server_killed_under_the_operator(kube: Kube, operator: Operator) -> None:
    if USE_EXISTING or kube.info is None:
        pytest.skip("restarts the local dev cluster's own etcd and kube-apiserver")
    with temp_namespace(kube, prefix="bf-chaos-") as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("outage"))
        until("converged", lambda: converged(kube, ns, "outage"), bool, CONVERGE_S)
        took = devcluster.restart_components(kube.info, ("etcd", "kube-apiserver"), down_s=5.0)
        print(f"etcd and kube-apiserver down 5 s, ready again {took:.1f} s after the kill")
        kube.close()  # the test's own client held connections to the old server
        assert operator.alive(), "the operator must ride out an API outage"
        # a spec change made after the outage is handled: the watch came back
        custom(kube).patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "outage", {"spec": {"sla": {"latencyP99Ms": 70, "networkOverheadMs": 10}}}
        )
        bm = until(
            "the post-outage edit handled",
            lambda: converged(kube, ns, "outage"),
            lambda b: b is not None and b["status"]["plan"]["serverBudgetMs"] == 60,
            240,
        )
        assert bm["metadata"]["generation"] == 2
        # the scaling loop's caches of Deployments and pods watch again: a Deployment deleted now is seen as gone
        # (a cache stuck before the outage would still hold it, and the loop would never re-create it)
        before = children(kube, ns, "outage")["deployment"].metadata.uid
        kube.apps.delete_namespaced_deployment("outage-triton", ns)
        until(
            "the Deployment re-created by the scaling loop after the outage",
            lambda: children(kube, ns, "outage").get("deployment"),
            lambda d: d is not None and d.metadata.uid != before,
            90,
        )
        assert operator.alive()


def test_a_deployment_deleted_by_hand_comes_back(kube: Kube, operator: Operator) -> None:
    with temp_namespace(kube, prefix="bf-chaos-") as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("handmade"))
        until("converged", lambda: converged(kube, ns, "handmade"), bool, CONVERGE_S)
        before = children(kube, ns, "handmade")
        kube.apps.delete_namespaced_deployment("handmade-triton", ns)
        wait_for("the Deployment gone", lambda: "deployment" not in children(kube, ns, "handmade") or None, 60)
        # the scaling loop's next tick (15 s) re-applies the children
        after = until("re-created", lambda: converged(kube, ns, "handmade"), bool, 90)
        kids = children(kube, ns, "handmade")
        assert kids["deployment"].metadata.uid != before["deployment"].metadata.uid
        assert kids["configmap"].metadata.uid == before["configmap"].metadata.uid, "the ConfigMap was untouched"
        assert after["metadata"]["generation"] == 1


def test_a_namespace_deleted_under_its_models_goes_away(kube: Kube, operator: Operator) -> None:
    with temp_namespace(kube, prefix="bf-chaos-", delete_timeout_s=180) as ns:
        model_volume(kube, ns)
        for name in ("a", "b"):
            custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model(name))
        for name in ("a", "b"):
            until(f"{name} converged", lambda n=name: converged(kube, ns, n), bool, CONVERGE_S)
        # temp_namespace deletes the namespace and fails unless it is gone within 180 s
    assert operator.alive()


def test_the_same_model_created_and_deleted_50_times_leaves_one_clean_copy(kube: Kube, operator: Operator) -> None:
    with temp_namespace(kube, prefix="bf-chaos-") as ns:
        model_volume(kube, ns)
        for _ in range(50):
            custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("flap"))
            custom(kube).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "flap")
            wait_for("deleted", lambda: _gone(kube, ns, "flap") or None, 30, 0.05)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("flap"))
        bm = until("the last copy converged", lambda: converged(kube, ns, "flap"), bool, CONVERGE_S)
        time.sleep(20)  # children of the 50 deleted copies, if any survived, would show up by now
        uid = bm["metadata"]["uid"]
        for kind, obj in children(kube, ns, "flap").items():
            owners = [o.uid for o in obj.metadata.owner_references or []]
            assert owners == [uid], f"{kind} is owned by {owners}, not by the live copy {uid}"
        assert len(replica_sets(kube, ns, "flap")) == 1
        deployments = kube.apps.list_namespaced_deployment(ns).items
        assert [d.metadata.name for d in deployments] == ["flap-triton"]
        custom(kube).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "flap")
        wait_for("children collected", lambda: children(kube, ns, "flap") == {} or None, 90)
        assert operator.alive()


def _gone(kube: Kube, ns: str, name: str) -> bool:
    try:
        get_bm(kube, ns, name)
    except ApiException as e:
        return bool(e.status == 404)
    return False


def test_a_child_the_api_server_refuses_gives_a_condition(kube: Kube, operator: Operator) -> None:
    """An admission policy (as a platform team might have) refuses the Triton Deployment: the BatchedModel gets
    Planned=False with reason ApplyRejected and the server's message, not just an event."""
    with temp_namespace(kube, prefix="bf-chaos-") as ns:
        model_volume(kube, ns)
        name = f"deny-deployments-{ns}"
        deny = DenyPolicy(
            kube, ns, name, ["apps/deployments"], ["CREATE", "UPDATE"], "no Deployments here (test policy)"
        )
        try:
            time.sleep(2)  # the policy reaches the API server's cache
            custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("refused"))
            bm = until(
                "a condition saying the Deployment was refused",
                lambda: get_bm(kube, ns, "refused"),
                lambda b: (condition(b, ConditionType.PLANNED) or {}).get("reason") == SpecReason.APPLY_REJECTED,
                CONVERGE_S,
            )
            planned = condition(bm, ConditionType.PLANNED)
            assert planned is not None
            assert planned["status"] == "False"
            assert "no Deployments here (test policy)" in planned["message"]
            assert bm["status"]["observedGeneration"] == bm["metadata"]["generation"]
        finally:
            deny.remove()
        assert operator.alive()


def test_operator_killed_mid_delete_leaves_nothing_behind(kube: Kube, operator: Operator) -> None:
    with temp_namespace(kube, prefix="bf-chaos-") as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("gone"))
        until("converged", lambda: converged(kube, ns, "gone"), bool, CONVERGE_S)
        custom(kube).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "gone")
        operator.kill()  # mid-delete: the delete handler may or may not have run
        wait_for("the BatchedModel gone with the operator down (no finalizer)", lambda: _gone(kube, ns, "gone"), 30)
        wait_for("children collected with the operator down", lambda: children(kube, ns, "gone") == {} or None, 90)
        operator.start()
        time.sleep(5)  # a restarted operator must not re-create anything for the deleted model
        assert children(kube, ns, "gone") == {}
        assert operator.alive()
