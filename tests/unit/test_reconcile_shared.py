"""The handlers' reconcile of a BatchedModel served on a GPUPool (controller/reconcile.py ``_reconcile_shared``)
and of one that leaves its pool, against the FakeKube of test_controller_loops (writes recorded in order)."""

from __future__ import annotations

import copy
from typing import Any

from batchfill.controller.shared_status import served_shared
from batchfill.render.pool import LOADED, loaded_label, pool_selector_labels

from .test_controller_loops import (
    DEPLOYMENT,
    NS,
    SCALING_SPEC,
    T0,
    FakeKube,
    FakePrometheus,
    planned_model,
    scaling_loop,
    writes,
)

POOL = "shared"


def shared_spec(mode: str = "Shared") -> dict[str, Any]:
    return {**copy.deepcopy(SCALING_SPEC), "placement": {"mode": mode, "pool": POOL}}


def service(kube: FakeKube, name: str) -> dict[str, Any]:
    return kube.objects[("v1", "Service", NS, f"{name}-triton")]


def set_placement(kube: FakeKube, name: str, **placement: Any) -> None:
    """The pool loop's status.placement (controller/pool_sync.member_writes)."""
    stored = kube.models[(NS, name)]
    kube.write_status(stored, {"placement": {"pool": POOL, **placement}})


def test_a_shared_model_gets_a_service_on_its_pool_copies_and_nothing_of_its_own() -> None:
    kube = FakeKube()
    kube.create_model("m", shared_spec())
    kube.handle("m")
    assert writes(kube) == [("apply", "Service")]  # no ConfigMap, no Deployment: the pool loop loads it
    svc = service(kube, "m")
    assert svc["spec"]["selector"] == {**pool_selector_labels(POOL), loaded_label("m"): LOADED}
    assert not [k for k in svc["metadata"].get("annotations") or {} if k.startswith("prometheus.io/")]
    status = kube.models[(NS, "m")]["status"]
    assert status["plan"]["maxBatchSize"] >= 1  # planned like any model: the pool loop loads this plan
    assert (status.get("replicas", 0), status.get("readyReplicas", 0)) == (0, 0)

    set_placement(kube, "m", mode="Shared", podCount=2)
    kube.calls.clear()
    kube.handle("m")
    status = kube.models[(NS, "m")]["status"]
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)  # its copies, as replicas
    assert [w for w in writes(kube) if w[0] != "status"] == [("apply", "Service")]
    assert kube.invalid == []


def test_a_dedicated_model_moved_to_its_pool_keeps_its_replicas_until_a_copy_serves_then_scales_them_to_0() -> None:
    kube = FakeKube()
    planned_model(kube, "m", SCALING_SPEC)
    kube.models[(NS, "m")]["spec"]["placement"] = {"mode": "Shared", "pool": POOL}
    assert served_shared(kube.models[(NS, "m")])
    kube.handle("m")
    assert not [w for w in writes(kube) if w[0] in ("apply", "scale")]  # no copy yet: its own pods still serve
    assert service(kube, "m")["spec"]["selector"].get(loaded_label("m")) is None

    set_placement(kube, "m", mode="Shared", podCount=1)
    kube.calls.clear()
    kube.handle("m")
    assert [w for w in writes(kube) if w[0] != "status"] == [("apply", "Service"), ("scale", 0)]
    assert service(kube, "m")["spec"]["selector"][loaded_label("m")] == LOADED
    assert kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["replicas"] == 0


def test_a_model_leaving_its_pool_gets_min_replicas_back_and_its_address_stays_on_the_copies_until_one_is_ready() -> (
    None
):
    kube = FakeKube()
    planned_model(kube, "m", SCALING_SPEC)
    kube.models[(NS, "m")]["spec"]["placement"] = {"mode": "Shared", "pool": POOL}
    set_placement(kube, "m", mode="Shared", podCount=1)
    kube.handle("m")  # scaled to 0, served by the pool
    kube.run_pods("m", ready=0)

    kube.models[(NS, "m")]["spec"]["placement"] = {"mode": "Dedicated", "pool": POOL}
    kube.calls.clear()
    kube.handle("m")
    assert kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["replicas"] == SCALING_SPEC["scaling"]["minReplicas"]
    assert service(kube, "m")["spec"]["selector"].get(loaded_label("m")) == LOADED  # no own replica Ready yet

    kube.run_pods("m", ready=1)
    kube.handle("m")
    assert loaded_label("m") not in service(kube, "m")["spec"]["selector"]  # its own pods now


def test_an_auto_model_the_plan_graduates_keeps_its_address_on_the_copies_until_its_own_replica_is_ready() -> None:
    """The joint plan moves an Auto model to replicas of its own: the pool loop writes status.placement Dedicated
    at once, with the copy still labelled (podCount 1) and readyReplicas 0 (controller/pool_sync.member_writes).
    Its Deployment comes back at minReplicas (it was scaled to 0 on the pool), its Service stays on the copy until
    an own replica is Ready, and the first scaling tick that sees one Ready re-applies the children (the Service
    moves) before any status write counts it, since that count is what lets the pool drop its copy. Found by
    tests/cluster/test_shared_moves.py: before, the Service went to the own pods at once (no endpoint until one
    was Ready) and the Deployment stayed at 0."""
    kube = FakeKube()
    planned_model(kube, "m", SCALING_SPEC)
    kube.models[(NS, "m")]["spec"]["placement"] = {"mode": "Auto", "pool": POOL}
    set_placement(kube, "m", mode="Shared", podCount=1)
    kube.handle("m")  # on the pool: its own replicas scaled to 0
    kube.run_pods("m", ready=0)
    assert kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["replicas"] == 0

    set_placement(kube, "m", mode="Dedicated", podCount=1)
    kube.write_status(kube.models[(NS, "m")], {"replicas": 0, "readyReplicas": 0})
    kube.handle("m")  # the pool loop's re-apply
    assert kube.objects[(*DEPLOYMENT, NS, "m-triton")]["spec"]["replicas"] == SCALING_SPEC["scaling"]["minReplicas"]
    assert service(kube, "m")["spec"]["selector"].get(loaded_label("m")) == LOADED  # the copy serves meanwhile

    kube.run_pods("m", ready=1)
    loop = scaling_loop(kube, FakePrometheus())
    kube.calls.clear()
    loop.tick(T0 + 10)
    applied = [w for w in writes(kube) if w[0] == "apply"]
    assert ("apply", "Service") in applied
    assert loaded_label("m") not in service(kube, "m")["spec"]["selector"]  # its own pods now
    status = [w for w in writes(kube) if w[0] == "status"]
    assert status
    assert writes(kube).index(("apply", "Service")) < writes(kube).index(status[0])
    assert kube.models[(NS, "m")]["status"]["readyReplicas"] == 1  # now the pool may drop its copy
    kube.calls.clear()
    loop.tick(T0 + 20)
    assert ("apply", "Service") not in writes(kube)  # once: the count is written, no re-apply each tick
