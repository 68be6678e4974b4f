"""The scaling loop on the real API server, fed by real Triton metrics through a real Prometheus.

The operator runs as the install's ServiceAccount (as in test_operator.py) with a 3 s timer and a 10 s signal
window, as a subprocess a test can SIGKILL and start again (``support.Operator``). Triton pods are kwok pods on
fake GPU nodes; each Ready pod is paired with a real tritonserver (sleep model: ``40 + 6·b`` ms per batch) whose
metrics a real Prometheus scrapes with the pod's ``namespace``/``pod`` labels, exactly as a ServiceMonitor would
label them. Poisson load is spread round-robin over the Ready pods' servers (a Service). The profile measured
from the pods' statistics and the scaling on them run on real pods in test_real_pods.py. Checked, in one
BatchedModel's life:

1. Auto: a load of 1.5 replicas' worth saturates the single replica -> scaled to 2 through the Deployment's scale
   subresource, with status (desiredReplicas, lastScaleReason, observed, MetricsAvailable) and an Event;
2. Prometheus stopped mid-run -> MetricsAvailable=False, replicas held although the load dropped; Prometheus back
   -> MetricsAvailable=True, and after the stabilization window the low load scales in to 1;
3. Advise: the same high load only writes the recommendation (desiredReplicas 2); the Deployment stays at 1;
4. the operator SIGKILLed between the two writes of a scale-out (status appliedReplicas 2 written, the scale call
   not made: an admission policy refuses it): nothing changes while it is dead; restarted, it scales the
   Deployment to exactly 2 once, from its status, and holds 2 under the same load.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from batchfill.api.reasons import (
    ConditionReason,
    ConditionType,
    EventReason,
    ScalingReason,
    SignalsReason,
)
from batchfill.api.spec import GROUP, PLURAL, VERSION

from .conftest import USE_EXISTING
from .scaling_lab import Lab, condition, is_planned, running_lab, scale_events, sleep_model
from .support import SCALE_OUT_ON_EVIDENCE, DenyPolicy, Kube, until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        USE_EXISTING, reason="pairs kwok pods with local tritonservers; an existing cluster's pods run real images"
    ),
]


@pytest.fixture(scope="module")
def lab(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with running_lab(kube, tmp_path_factory.mktemp("scaling")) as lab:
        yield lab


def test_auto_scales_out_on_saturation_holds_without_metrics_and_scales_in(lab: Lab) -> None:
    lab.following = "auto"
    lab.custom.create_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, sleep_model("auto", "Auto"))
    bm = until("Planned", lambda: lab.bm("auto"), is_planned, 60)
    plan = bm["status"]["plan"]
    one_replica = plan["capacityPerReplicaRps"] * 0.8  # u·C: what one replica is meant to carry
    until("a Ready pod with its tritonserver", lambda: lab.tritons.endpoints(), lambda e: len(e) == 1, 90)
    until(
        "MetricsAvailable with traffic-free pods",
        lambda: lab.bm("auto"),
        lambda b: condition(b, ConditionType.METRICS_AVAILABLE).get("status") == "True",
        60,
    )
    assert lab.replicas("auto") == 1

    # 1. saturating load on one replica -> 2 replicas through the scale subresource
    high = 1.5 * one_replica
    lab.load.set_rate(high)
    t_step = time.monotonic()
    until("scale-out to 2", lambda: lab.replicas("auto"), lambda n: n == 2, 90)
    reaction_s = time.monotonic() - t_step
    dep = lab.kube.apps.read_namespaced_deployment("auto-triton", lab.ns)
    assert any(m.manager == "batchfill" and m.subresource == "scale" for m in dep.metadata.managed_fields), [
        (m.manager, m.subresource) for m in dep.metadata.managed_fields
    ]
    status = until(
        "status after the scale-out", lambda: lab.bm("auto")["status"], lambda s: s.get("desiredReplicas") == 2, 30
    )
    assert status["lastScaleReason"] in SCALE_OUT_ON_EVIDENCE, status
    assert status.get("lastScaleTime")
    # under 15 min of rate history the variability is unknown (policy/headroom.py): targetUtilization holds
    assert status["effectiveTargetUtilization"] == 0.8, status
    assert "rateVariability" not in status.get("observed", {}), status
    events = lab.kube.core.list_namespaced_event(lab.ns, field_selector="involvedObject.name=auto").items
    assert any(e.reason == status["lastScaleReason"] and "1 -> 2" in e.message for e in events), [
        (e.reason, e.message) for e in events
    ]
    until("both replicas serving", lambda: lab.tritons.endpoints(), lambda e: len(e) == 2, 90)
    time.sleep(15)  # a full signal window on 2 replicas
    observed = lab.bm("auto")["status"]["observed"]
    assert observed["requestRate"] == pytest.approx(high, rel=0.3), observed
    assert lab.replicas("auto") == 2, "more than the load needs (1.5 replicas' worth)"

    # 2. Prometheus down: held (no scale-in although the load drops), condition set; back: scale-in to 1
    lab.load.set_rate(0.3 * one_replica)
    lab.prometheus.stop()
    bm = until(
        "MetricsAvailable=False",
        lambda: lab.bm("auto"),
        lambda b: condition(b, ConditionType.METRICS_AVAILABLE).get("status") == "False",
        30,
    )
    assert condition(bm, ConditionType.METRICS_AVAILABLE)["reason"] in (
        SignalsReason.PROMETHEUS_UNAVAILABLE,
        SignalsReason.PROMETHEUS_TIMEOUT,
    )
    assert bm["status"]["lastScaleReason"] == ScalingReason.HOLD_METRICS_UNKNOWN
    assert "observed" not in bm["status"], "unknown signals must not leave numbers in status.observed"
    time.sleep(30)  # longer than the stabilization window: missing data is not zero load
    assert lab.replicas("auto") == 2
    warnings = [
        e for e in lab.kube.core.list_namespaced_event(lab.ns, field_selector="involvedObject.name=auto").items
        if e.type == "Warning" and e.reason == ScalingReason.HOLD_METRICS_UNKNOWN
    ]  # fmt: skip
    assert len(warnings) == 1, "one Warning event per outage, not one per tick"
    lab.prometheus.start()
    until(
        "MetricsAvailable=True again",
        lambda: lab.bm("auto"),
        lambda b: condition(b, ConditionType.METRICS_AVAILABLE).get("status") == "True",
        60,
    )
    t_back = time.monotonic()
    until(
        "scale-in to 1 after the stabilization window",
        lambda: (lab.replicas("auto"), lab.bm("auto")["status"], scale_events(lab, "auto")[-3:]),
        lambda v: v[0] == 1,
        120,
    )
    assert time.monotonic() - t_back >= 15, "scaled in before the stabilization window (20 s) of real data"
    assert lab.bm("auto")["status"]["lastScaleReason"] == ScalingReason.SCALE_IN_LOAD_FITS
    lab.load.set_rate(0)
    lab.custom.delete_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, "auto")
    print(f"scale-out reaction {reaction_s:.1f} s after the load step")


def test_advise_only_recommends(lab: Lab) -> None:
    lab.following = "advise"
    lab.custom.create_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, sleep_model("advise", "Advise"))
    bm = until("Planned", lambda: lab.bm("advise"), is_planned, 60)
    one_replica = bm["status"]["plan"]["capacityPerReplicaRps"] * 0.8
    until("its pod serving", lambda: lab.tritons.endpoints(), lambda e: len(e) == 1, 90)
    lab.load.set_rate(1.5 * one_replica)
    status = until(
        "a recommendation of 2", lambda: lab.bm("advise")["status"], lambda s: s.get("desiredReplicas") == 2, 120
    )
    assert status["lastScaleReason"] in SCALE_OUT_ON_EVIDENCE, status
    time.sleep(10)
    lab.load.set_rate(0)
    assert lab.replicas("advise") == 1, "Advise changed the Deployment"
    assert "lastScaleTime" not in status


def test_pending_for_gpus_is_reported_with_the_schedulers_reason(lab: Lab) -> None:
    """A replica that no node can hold (5 GPUs; the fake nodes have 4) is Pending: CapacityLimited=True with the
    scheduler's message, and no chain of scale-ups."""
    body = sleep_model("big", "Auto")
    body["spec"]["triton"]["gpusPerReplica"] = 5
    lab.custom.create_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, body)
    bm = until(
        ConditionType.CAPACITY_LIMITED,
        lambda: lab.bm("big"),
        lambda b: condition(b, ConditionType.CAPACITY_LIMITED).get("status") == "True",
        90,
    )
    limited = condition(bm, ConditionType.CAPACITY_LIMITED)
    assert limited["reason"] == ConditionReason.REPLICAS_PENDING
    assert "nvidia.com/gpu" in limited["message"], limited
    time.sleep(10)
    assert lab.replicas("big") == 1, "a Pending replica must not trigger more replicas"
    lab.custom.delete_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, "big")


def test_manual_replica_edits_restored_in_auto_respected_in_off_and_advise(lab: Lab) -> None:
    """Auto owns spec.replicas (a hand edit is restored, with an Event); Off leaves them to the user; switching
    Advise -> Auto does not take the recommendation for a hand edit (status.appliedReplicas is Auto's alone)."""
    lab.following = ""  # no tritonservers: the signals stay unknown, which must not matter for this
    name = "manual"
    lab.custom.create_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, sleep_model(name, "Auto"))
    until("appliedReplicas", lambda: lab.bm(name).get("status") or {}, lambda s: s.get("appliedReplicas") == 1, 90)
    apps = lab.kube.apps

    def events(reason: str) -> list[Any]:
        items = lab.kube.core.list_namespaced_event(lab.ns, field_selector=f"involvedObject.name={name}").items
        return [e for e in items if e.reason == reason]

    apps.patch_namespaced_deployment_scale(f"{name}-triton", lab.ns, {"spec": {"replicas": 3}})
    until("the hand edit restored", lambda: lab.replicas(name), lambda n: n == 1, 30)
    assert len(events(EventReason.MANUAL_SCALE_REVERTED)) == 1

    def mode(m: str) -> None:
        lab.custom.patch_namespaced_custom_object(
            GROUP, VERSION, lab.ns, PLURAL, name, {"spec": {"scaling": {"mode": m}}}
        )

    mode("Off")
    until(
        "appliedReplicas dropped in Off",
        lambda: lab.bm(name).get("status") or {},
        lambda s: "appliedReplicas" not in s,
        30,
    )
    apps.patch_namespaced_deployment_scale(f"{name}-triton", lab.ns, {"spec": {"replicas": 2}})
    time.sleep(10)
    assert lab.replicas(name) == 2, "Off must leave a hand-set replica count alone"
    assert lab.bm(name)["status"]["lastScaleReason"] == ScalingReason.SCALING_OFF
    mode("Advise")
    time.sleep(6)
    mode("Auto")
    time.sleep(10)
    assert lab.replicas(name) == 2, "switching to Auto restored a count Auto never applied"
    assert len(events(EventReason.MANUAL_SCALE_REVERTED)) == 1
    assert lab.bm(name)["status"].get("appliedReplicas") == 2  # Auto owns it from here on
    lab.custom.delete_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, name)


def test_a_triton_that_dies_and_restarts_changes_no_replica(lab: Lab) -> None:
    """The pod's tritonserver is SIGKILLed (gone while its pod stays Ready) and started again (its counters reset
    to 0): no tick scales on the gap or on the reset, and the signals come back to the load."""
    name = "restart"
    lab.following = name
    lab.custom.create_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, sleep_model(name, "Auto"))
    bm = until("Planned", lambda: lab.bm(name), is_planned, 60)
    rate = 0.5 * bm["status"]["plan"]["capacityPerReplicaRps"] * 0.8  # half of what one replica should carry
    until("its pod serving", lambda: lab.tritons.endpoints(), lambda e: len(e) == 1, 90)
    lab.load.set_rate(rate)
    until(
        "signals of the load",
        lambda: lab.bm(name)["status"].get("observed") or {},
        lambda o: o.get("requestRate", 0) > 0.5 * rate,
        60,
    )
    replicas: list[int] = []
    pod, server = next(iter(lab.tritons.servers.items()))
    pid = server.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    server.stop()  # reap; the LocalTriton object (its pod IP and ports) is started again below
    deadline = time.monotonic() + 20  # two signal windows with the pod Ready and no server behind it
    while time.monotonic() < deadline:
        replicas.append(lab.replicas(name))
        time.sleep(1)
    gap = lab.bm(name)["status"]
    server.start()
    bm = until(
        "MetricsAvailable and the load's rate again",
        lambda: lab.bm(name),
        lambda b: (
            condition(b, ConditionType.METRICS_AVAILABLE).get("status") == "True"
            and (b["status"].get("observed") or {}).get("requestRate", 0) > 0.5 * rate
        ),
        90,
    )
    for _ in range(15):  # the window now spans the reset
        replicas.append(lab.replicas(name))
        time.sleep(1)
    bm = lab.bm(name)
    print(f"pod {pod}: during the gap {gap.get('lastScaleReason')}, after the restart {bm['status']['observed']}")
    assert set(replicas) == {1}, f"a replica change on a dead or restarted server: {replicas}"
    assert bm["status"]["observed"]["requestRate"] == pytest.approx(rate, rel=0.35), bm["status"]["observed"]
    scale_events = [
        e.reason
        for e in lab.kube.core.list_namespaced_event(lab.ns, field_selector=f"involvedObject.name={name}").items
        if e.reason.startswith("Scale")
    ]
    assert not scale_events, scale_events
    lab.load.set_rate(0)
    lab.custom.delete_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, name)


def test_operator_killed_between_status_and_scale_converges_without_double_scaling(lab: Lab) -> None:
    """The half-applied scale: status says appliedReplicas 2 (written first, with a resourceVersion precondition)
    while the Deployment still has 1 replica (the scale call after it never happened), then the operator is
    SIGKILLed. With the operator dead nothing changes; the restarted operator changes the Deployment once, to the
    count its status recorded (2), and holds 2 under the same load: no double apply."""
    name = "midscale"
    dep = f"{name}-triton"
    lab.following = name
    lab.custom.create_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, sleep_model(name, "Auto"))
    bm = until("Planned", lambda: lab.bm(name), is_planned, 60)
    one_replica = bm["status"]["plan"]["capacityPerReplicaRps"] * 0.8  # u·C
    until("a Ready pod with its tritonserver", lambda: lab.tritons.endpoints(), lambda e: len(e) == 1, 90)
    until(
        "MetricsAvailable with traffic-free pods",
        lambda: lab.bm(name),
        lambda b: condition(b, ConditionType.METRICS_AVAILABLE).get("status") == "True",
        60,
    )
    assert lab.replicas(name) == 1

    # The real API server refuses the second write of the tick (the scale subresource) and accepts the first (the
    # status): this stands in for the operator dying between the two writes, deterministically, and leaves the
    # same state behind. Only deployments/scale is matched: the Deployment itself (its controller's writes, the
    # operator's server-side apply of its template) is not.
    denied = "no scaling here (test policy)"
    policy = f"deny-scale-{lab.ns}"

    def events() -> list[Any]:
        items = lab.kube.core.list_namespaced_event(lab.ns, field_selector=f"involvedObject.name={name}").items
        return sorted(items, key=lambda e: (e.metadata.creation_timestamp, e.metadata.name))

    def scale_refused() -> bool:
        try:  # dry run: admission runs, nothing is stored
            lab.kube.apps.patch_namespaced_deployment_scale(dep, lab.ns, {"spec": {"replicas": 1}}, dry_run="All")
        except ApiException as e:
            return denied in (e.body or "")
        return False

    def state() -> tuple[dict[str, Any], int]:
        proc = lab.operator.proc
        assert lab.operator.alive(), f"the operator exited ({proc and proc.returncode}) before the test killed it"
        return lab.bm(name)["status"], lab.replicas(name)

    deny = DenyPolicy(lab.kube, lab.ns, policy, ["apps/deployments/scale"], ["UPDATE"], denied)
    try:
        time.sleep(2)  # the policy reaches the API server's cache; then checked:
        until("the scale subresource refused", scale_refused, bool, 30)

        # saturating load: the operator decides 1 -> 2, writes status, and its scale call is refused
        lab.load.set_rate(1.5 * one_replica)
        half = until(
            "status appliedReplicas 2 with the Deployment at 1",
            state,
            lambda sr: sr[0].get("appliedReplicas") == 2 and sr[0].get("desiredReplicas") == 2 and sr[1] == 1,
            90,
        )[0]
        until("the refused scale call in the operator's log", lambda: denied in lab.operator.log(), bool, 15)
        lab.operator.kill()
        before_kill = [(e.reason, e.message) for e in events()]
        deny.remove()

        # the operator is dead: nothing scales (the API server would now accept the scale call)
        dead: list[int] = []
        for _ in range(20):
            dead.append(lab.replicas(name))
            time.sleep(0.5)
        assert set(dead) == {1}, f"the Deployment changed with the operator dead: {dead}"
        status = lab.bm(name)["status"]
        assert (status.get("appliedReplicas"), status.get("desiredReplicas")) == (2, 2), status
        generation = lab.kube.apps.read_namespaced_deployment(dep, lab.ns).metadata.generation
        seen = {e.metadata.name for e in events()}

        lab.start_operator()
        restarted = time.monotonic()
        converging: list[int] = []
        while time.monotonic() - restarted < 60:
            converging.append(lab.replicas(name))
            if converging[-1] != 1:
                break
            time.sleep(0.5)
        took_s = time.monotonic() - restarted
        assert converging[-1] == 2, f"not exactly 2 replicas within 60 s of the restart: {converging}"
        held: list[int] = []
        for _ in range(40):  # 20 s under the same load: a second apply would show as 3
            held.append(lab.replicas(name))
            time.sleep(0.5)
        assert set(held) == {2}, f"the replicas moved after the restart's scale to 2: {held}"
        assert lab.kube.apps.read_namespaced_deployment(dep, lab.ns).metadata.generation == generation + 1, (
            "the Deployment's spec changed more than once after the restart"
        )
        status = lab.bm(name)["status"]
        assert status.get("appliedReplicas") == 2, status
        assert status.get("desiredReplicas") == 2, status
        assert lab.operator.alive(), lab.operator.log()[-3000:]

        after = [e for e in events() if e.metadata.name not in seen]
        to_two = [e for e in after if re.search(r"-> 2\b|\bset 2\b", e.message or "")]
        # What the restarted operator says: status.appliedReplicas (2) differs from the Deployment (1), whose
        # replicas batchfill still owns (managedFields): its own scale, recorded but never made, is completed as
        # ScaleResumed, not reported as a hand edit. (The scale-out itself was never posted as an event: the
        # killed operator's tick failed at the scale call, before its events.)
        assert [e.reason for e in to_two] == [EventReason.SCALE_RESUMED], [(e.reason, e.message) for e in after]
        assert to_two[0].message.startswith("1 -> 2: status recorded a scale to 2"), to_two[0].message
        assert not [e for e in after if e.reason == EventReason.MANUAL_SCALE_REVERTED], [
            (e.reason, e.message) for e in after
        ]
        print(
            f"\nhalf-applied: status {half.get('lastScaleReason')} (applied {half.get('appliedReplicas')}) with "
            f"the Deployment at 1; events before the kill: {before_kill}"
            f"\nrestarted: 2 replicas {took_s:.1f} s after the restart (samples {converging}); events since: "
            f"{[(e.reason, e.message) for e in after]}; lastScaleReason now {status.get('lastScaleReason')}"
        )
    finally:
        deny.remove()
        lab.load.set_rate(0)
        if not lab.operator.alive():  # failed while it was dead: the later tests need it
            lab.start_operator()
    lab.custom.delete_namespaced_custom_object(GROUP, VERSION, lab.ns, PLURAL, name)
    lab.following = ""
