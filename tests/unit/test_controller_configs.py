"""Content-addressed, immutable config ConfigMaps owned so that the garbage collector deletes each once no
ReplicaSet can mount it again (controller.configs, controller.reconcile), against the fake API server of
test_controller_loops (which refuses a changed immutable ConfigMap, as the API server does, and collects objects
whose owners are all gone, as its garbage collector does)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from batchfill.api.reasons import ConditionReason, ConditionType, EventReason
from batchfill.controller.configs import config_owners
from batchfill.policy.conditions import find
from batchfill.render.kube import CONFIG_HASH_ANNOTATION, Owner, configmap_name, names, template_config_name

from .test_controller_loops import (
    LOW,
    NS,
    SCALING_SPEC,
    T0,
    FakeKube,
    FakePrometheus,
    planned_model,
    scaling_loop,
    stored,
)


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    fake = FakeKube()
    yield fake
    assert fake.invalid == [], "a status the API server would reject (CRD schema)"


def _configs(kube: FakeKube) -> dict[str, list[str]]:
    """config name -> the kinds of its owners."""
    return {
        o["metadata"]["name"]: sorted(r.get("kind", "?") for r in o["metadata"]["ownerReferences"])
        for (_, kind, ns, _), o in kube.objects.items()
        if kind == "ConfigMap" and ns == NS
    }


def _template_config(kube: FakeKube, name: str) -> str:
    dep = kube.objects[("apps/v1", "Deployment", NS, names(Owner(name, NS, f"uid-bm-{name}"))["deployment"])]
    found = template_config_name(dep["spec"]["template"]["spec"])
    assert found is not None
    return found


def _change_sla(kube: FakeKube, name: str, p99_ms: int) -> None:
    stored = kube.models[(NS, name)]
    stored["spec"]["sla"]["latencyP99Ms"] = p99_ms
    stored["metadata"]["generation"] += 1


def test_an_older_config_lives_as_long_as_a_replicaset_mounts_it(kube: FakeKube) -> None:
    kube.create_model("m", SCALING_SPEC)
    kube.handle("m")
    first = _template_config(kube, "m")
    assert first.startswith("m-triton-config-")
    cm = kube.objects[("v1", "ConfigMap", NS, first)]
    assert cm["immutable"] is True
    assert first == configmap_name(Owner("m", NS, "uid-bm-m"), cm["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])
    assert _configs(kube) == {first: ["BatchedModel"]}
    kube.roll(NS, "m-triton", 1)

    _change_sla(kube, "m", 120)  # a tighter SLA: a smaller batch, another config.pbtxt
    kube.handle("m")
    second = _template_config(kube, "m")
    assert second != first
    # revision 1 still mounts the first config, which `kubectl rollout undo` must find: its ReplicaSet owns it
    assert _configs(kube) == {first: ["ReplicaSet"], second: ["BatchedModel"]}
    assert kube.objects[("v1", "ConfigMap", NS, first)]["data"] != kube.objects[("v1", "ConfigMap", NS, second)]["data"]
    kube.roll(NS, "m-triton", 2)
    kube.handle("m")
    assert kube.collect_garbage() == []

    # the Deployment controller trims revision 1 (revisionHistoryLimit): the garbage collector takes its config
    del kube.objects[("apps/v1", "ReplicaSet", NS, "m-triton-rs1")]
    assert kube.collect_garbage() == [first]
    kube.handle("m")
    assert _configs(kube) == {second: ["BatchedModel"]}


def test_going_back_to_an_older_spec_reuses_its_configmap_and_the_model_owns_it_again(kube: FakeKube) -> None:
    kube.create_model("m", SCALING_SPEC)
    kube.handle("m")
    first = _template_config(kube, "m")
    kube.roll(NS, "m-triton", 1)
    uid = kube.objects[("v1", "ConfigMap", NS, first)]["metadata"]["uid"]
    _change_sla(kube, "m", 120)
    kube.handle("m")
    second = _template_config(kube, "m")
    kube.roll(NS, "m-triton", 2)
    _change_sla(kube, "m", SCALING_SPEC["sla"]["latencyP99Ms"])
    kube.handle("m")
    assert _template_config(kube, "m") == first
    assert kube.objects[("v1", "ConfigMap", NS, first)]["metadata"]["uid"] == uid  # the same object, never rewritten
    assert _configs(kube) == {first: ["BatchedModel"], second: ["ReplicaSet"]}


def test_a_config_no_replicaset_ever_mounted_goes_with_the_deployment(kube: FakeKube) -> None:
    kube.create_model("m", SCALING_SPEC)
    kube.handle("m")
    first = _template_config(kube, "m")
    _change_sla(kube, "m", 120)  # changed again before the Deployment controller made a ReplicaSet
    kube.handle("m")
    assert _configs(kube)[first] == ["Deployment"]
    del kube.models[(NS, "m")]  # the BatchedModel deleted: its Deployment, then everything else, goes
    kube.collect_garbage()
    kube.collect_garbage()
    assert _configs(kube) == {}


def _obj(name: str, uid: str, owner_uid: str | None = None, config: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid}
    if owner_uid:
        meta["ownerReferences"] = [{"uid": owner_uid, "controller": True}]
    out: dict[str, Any] = {"metadata": meta}
    if config:
        out["spec"] = {"template": {"spec": {"volumes": [{"name": "config", "configMap": {"name": config}}]}}}
    return out


def _cm(name: str, *owner_uids: str, hashed: bool = True) -> dict[str, Any]:
    cm = _obj(name, f"uid-{name}")
    cm["metadata"]["ownerReferences"] = [{"uid": u, "controller": u == "bm"} for u in owner_uids]
    cm["metadata"]["annotations"] = {CONFIG_HASH_ANNOTATION: "h"} if hashed else {}
    return cm


def test_config_owners_counts_only_the_deployments_replicasets_and_only_configs() -> None:
    model = {"uid": "bm", "controller": True}
    dep = _obj("d", "dep", "bm", "c3")
    sets = [_obj("rs1", "r1", "dep", "c1"), _obj("rs2", "r2", "dep", "c1"), _obj("x", "x", "other-dep", "c2")]
    cms = [_cm("c1", "bm"), _cm("c2", "bm"), _cm("c3", "bm"), _cm("mine", "bm", hashed=False)]
    got = config_owners(model, cms, dep, sets)
    assert {k: [r["uid"] for r in v] for k, v in got.items()} == {"c1": ["r1", "r2"], "c2": ["dep"]}
    assert all(not r["controller"] and not r["blockOwnerDeletion"] for refs in got.values() for r in refs)
    # owned as wanted already: nothing to write
    cms = [_cm("c1", "r1", "r2"), _cm("c2", "dep"), _cm("c3", "bm")]
    assert config_owners(model, cms, dep, sets) == {}


def _rollback_condition(kube: FakeKube, name: str) -> dict[str, Any] | None:
    return find(stored(kube, name)["status"]["conditions"], ConditionType.CONFIG_APPLIED)


def test_a_rollout_undo_holds_until_the_spec_changes(kube: FakeKube) -> None:
    planned_model(kube, "m", SCALING_SPEC)
    first = _template_config(kube, "m")
    kube.roll(NS, "m-triton", 1)
    _change_sla(kube, "m", 120)
    kube.handle("m")
    second = _template_config(kube, "m")
    kube.roll(NS, "m-triton", 2)
    prom = FakePrometheus()
    prom.serve(kube.run_pods("m", ready=1), **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    assert _rollback_condition(kube, "m") is None

    kube.rollout_undo(NS, "m-triton", "m-triton-rs1")  # the new config misbehaves: a person rolls back
    kube.calls.clear()
    kube.events.clear()
    loop.tick(T0 + 15)
    assert _template_config(kube, "m") == first, "the rollback stands"
    assert not [c for c in kube.calls if c[:2] == ("apply", "Deployment")]
    cond = _rollback_condition(kube, "m")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", ConditionReason.ROLLED_BACK_BY_HAND)
    assert "kubectl" in cond["message"]
    assert [e[1] for e in kube.events].count(EventReason.ROLLED_BACK_BY_HAND) == 1

    kube.calls.clear()
    kube.events.clear()
    loop.tick(T0 + 30)  # steady: no second event, nothing applied
    assert EventReason.ROLLED_BACK_BY_HAND not in [e[1] for e in kube.events]
    assert not [c for c in kube.calls if c[:2] == ("apply", "Deployment")]
    kube.handle("m")  # an operator restart resumes the same generation: still the person's config
    assert _template_config(kube, "m") == first

    _change_sla(kube, "m", 150)  # the user's next spec wins
    kube.handle("m")
    assert _template_config(kube, "m") not in (first, second)
    loop.tick(T0 + 45)
    assert _rollback_condition(kube, "m") is None


def test_scaling_uses_the_capacity_of_the_config_a_rollback_put_the_pods_on(kube: FakeKube) -> None:
    """While a rollout undo holds, the pods batch as the older config says: the tick evaluates that config (its
    ConfigMap, parsed) with the current profile and SLA, and the one RolledBackByHand Event says which capacity."""
    from batchfill.api.spec import API_VERSION, KIND
    from batchfill.api.validate import load_model
    from batchfill.controller.served_config import batching_of
    from batchfill.policy.plan import config_capacity
    from batchfill.render.kube import CONFIG_KEY

    planned_model(kube, "m", SCALING_SPEC)
    first = _template_config(kube, "m")
    kube.roll(NS, "m-triton", 1)
    stored_spec = kube.models[(NS, "m")]
    stored_spec["spec"]["batching"] = {"maxBatchSize": 1}  # the new config does not batch: a capacity far apart
    stored_spec["metadata"]["generation"] += 1
    kube.handle("m")
    kube.roll(NS, "m-triton", 2)
    prom = FakePrometheus()
    prom.serve(kube.run_pods("m", ready=1), **LOW)
    loop = scaling_loop(kube, prom)
    loop.tick(T0)
    kube.rollout_undo(NS, "m-triton", "m-triton-rs1")
    kube.events.clear()
    loop.tick(T0 + 15)

    text = kube.objects[("v1", "ConfigMap", NS, first)]["data"][CONFIG_KEY]
    b, preferred, delay = batching_of(text)
    assert b >= 1
    assert delay >= 100
    spec = load_model({"apiVersion": API_VERSION, "kind": KIND, "spec": kube.models[(NS, "m")]["spec"]}).spec
    expected = config_capacity(spec, b, preferred, delay).candidate.capacity_rps
    plan = stored(kube, "m")["status"]["plan"]
    assert expected != pytest.approx(plan["capacityPerReplicaRps"], rel=0.01), "the two configs must differ here"
    (message,) = [m for _, r, m in kube.events if r == EventReason.ROLLED_BACK_BY_HAND]
    assert f"scaling uses that config's capacity, {expected:.4g} req/s per replica" in message, message
    assert f"(the plan's: {plan['capacityPerReplicaRps']:.4g})" in message, message
    from batchfill.adapters.operator_metrics import REGISTRY

    labels = {"namespace": NS, "name": "m"}
    assert REGISTRY.get_sample_value("batchfill_capacity_per_replica", labels) == pytest.approx(expected)


def test_a_hand_edit_of_the_config_hash_alone_is_drift_and_reverted(kube: FakeKube) -> None:
    planned_model(kube, "m", SCALING_SPEC)
    served = _template_config(kube, "m")
    dep = kube.objects[("apps/v1", "Deployment", NS, "m-triton")]
    dep["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] = "0000000000000000"
    kube.own_config_hash(dep, "kubectl-edit", "Update")
    prom = FakePrometheus()
    prom.serve(kube.run_pods("m", ready=1), **LOW)
    kube.calls.clear()
    scaling_loop(kube, prom).tick(T0)
    assert ("apply", "Deployment", NS, "m-triton") in kube.calls
    assert _template_config(kube, "m") == served
    assert (
        kube.objects[("apps/v1", "Deployment", NS, "m-triton")]["spec"]["template"]["metadata"]["annotations"][
            CONFIG_HASH_ANNOTATION
        ]
        != "0000000000000000"
    )
