"""Pure parts of the scaling tick: pod classification, status.observed, and the shared signal cache."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from batchfill.adapters.metrics import QueryFailure, QueryResults, SignalTarget
from batchfill.adapters.signal_hub import SignalHub
from batchfill.api.reasons import ConditionReason, ConditionType, ScalingReason, SignalsReason
from batchfill.controller.pods import pod_counts
from batchfill.controller.status import changed_fields, observed_status, replicas_managers
from batchfill.policy.signals import ModelSignals, SignalState


def pod(name: str, *, ready: bool = False, scheduled: bool | None = True, message: str = "", deleting: bool = False
        ) -> dict[str, Any]:  # fmt: skip
    conditions = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True" if scheduled else "False",
                           "reason": "" if scheduled else "Unschedulable", "message": message})  # fmt: skip
    conditions.append({"type": "Ready", "status": "True" if ready else "False"})
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T12:00:00Z"
    return {"metadata": meta, "status": {"conditions": conditions}}


def test_pod_counts_ready_starting_pending_and_terminating() -> None:
    gpu = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    counts = pod_counts(
        [
            pod("a", ready=True),
            pod("b", ready=True, deleting=True),  # terminating: neither capacity nor on the way
            pod("c"),  # scheduled, model loading
            pod("d", scheduled=False, message=gpu),
            pod("e", scheduled=None),  # just created, not looked at by the scheduler yet
        ]
    )
    assert counts.ready == frozenset({"a"})
    assert (counts.starting, counts.pending, counts.pending_reason) == (2, 1, gpu)


def test_observed_status_is_rounded_and_empty_when_unknown() -> None:
    ok = ModelSignals(state=SignalState.OK, pods=2, request_rate_rps=123.456, inference_rate_rps=123.456,
                      avg_batch_size=3.14159, batch_fill=0.392699, queue_time_ms=1.23456, p99_ms=None,
                      rate_change_rms=0.0412345)  # fmt: skip
    assert observed_status(ok) == {
        "requestRate": 123.0, "avgBatchSize": 3.14, "batchFill": 0.393, "queueTimeMs": 1.23, "p99Ms": None,
        "rateVariability": 0.0412,
    }  # fmt: skip
    idle = ModelSignals(state=SignalState.IDLE, pods=1, request_rate_rps=0.0, inference_rate_rps=0.0)
    assert observed_status(idle) == {
        "requestRate": 0.0, "avgBatchSize": None, "batchFill": None, "queueTimeMs": None, "p99Ms": None,
        "rateVariability": None,
    }  # fmt: skip
    assert observed_status(ModelSignals.unknown(SignalsReason.PROMETHEUS_UNAVAILABLE, "down")) is None
    json.dumps(observed_status(ok), allow_nan=False)


def test_changed_fields_treats_none_as_absent_like_a_merge_patch() -> None:
    stored = {"observed": {"requestRate": 0.0}, "desiredReplicas": 2}
    same = {"observed": {"requestRate": 0.0, "batchFill": None}, "desiredReplicas": 2}
    assert changed_fields(stored, same) == {}
    assert changed_fields(stored, {"observed": None}) == {"observed": None}  # removes it
    assert changed_fields({}, {"observed": None}) == {}  # already absent: no write


class CountingSource:
    """Stands in for PrometheusSignals to count query sets: what is tested is the hub's cache, not Prometheus
    (the real server is in tests/component/test_metrics_real.py)."""

    window_s = 10.0

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str]]] = []
        self.fail = False

    def query_all(self, targets: Any) -> QueryResults | QueryFailure:
        self.calls.append(sorted(t.key for t in targets))
        if self.fail:
            return QueryFailure(SignalsReason.PROMETHEUS_UNAVAILABLE, "refused")
        key = ("ns", "p1", "m")
        return QueryResults(success={key: 100.0}, inferences={key: 100.0}, executions={key: 50.0},
                            queue_us={key: 2000.0}, p99_us={}, pending={key: 0.0})  # fmt: skip


def test_signal_hub_runs_one_query_set_per_tick_for_all_models() -> None:
    now = [0.0]
    source = CountingSource()
    hub = SignalHub(source, max_age_s=5.0, clock=lambda: now[0])  # type: ignore[arg-type]
    a = SignalTarget("ns", "a", "m", 8, frozenset({"p1"}))
    b = SignalTarget("ns", "b", "m", 8, frozenset({"p2"}))
    first = hub.signals(a)
    assert first.state == SignalState.OK
    assert first.request_rate_rps == 10.0  # 100 successes over the 10 s window
    hub.signals(b)  # same model name & namespace: already covered by a's query set
    assert len(source.calls) == 1
    assert hub.signals(b).state == SignalState.UNKNOWN  # b's pod has no series: NoSeries, from the cached answer
    now[0] = 6.0  # next tick: one new query set covering both
    hub.signals(a)
    hub.signals(b)
    assert source.calls == [[("ns", "a")], [("ns", "a"), ("ns", "b")]]
    other = SignalTarget("ns2", "c", "m2", 8, frozenset({"q"}))
    hub.signals(other)  # not covered by the last query set: asked at once, for itself alone
    assert source.calls[-1] == [("ns2", "c")]
    assert hub.signals(a).request_rate_rps == 10.0, "a's answer is kept next to c's"
    assert len(source.calls) == 3
    idle_target = SignalTarget("ns", "d", "m", 8, frozenset())
    assert hub.signals(idle_target).reason == SignalsReason.NO_READY_PODS  # no pods: nothing to ask
    assert len(source.calls) == 3
    source.fail = True
    now[0] = 12.0
    failed = hub.signals(a)
    assert (failed.state, failed.reason) == (SignalState.UNKNOWN, SignalsReason.PROMETHEUS_UNAVAILABLE)
    hub.forget("ns", "b")
    now[0] = 18.0
    hub.signals(a)
    assert ("ns", "b") not in source.calls[-1]


def test_low_concurrency_becomes_a_batching_condition_and_stays_put() -> None:
    """docs/field-cases.md#low-concurrency: the status says why batching does nothing; its transition time does not
    move between ticks."""
    from batchfill.controller.desired import desired_state
    from batchfill.controller.status import desired_status, scaling_conditions
    from batchfill.policy.scaling import Decision

    decision = Decision(
        1, 1, 1, ScalingReason.HOLD_WITHIN_TOLERANCE, "", (), metrics_available=True, low_concurrency=True
    )
    signals = ModelSignals(state=SignalState.OK, pods=1, request_rate_rps=10.0, avg_batch_size=1.0)
    extra = scaling_conditions(decision, signals)
    by_type = {u.type: u for u in extra}
    batching = by_type[ConditionType.BATCHING_EFFECTIVE]
    assert (batching.status, batching.reason) == ("False", ConditionReason.LOW_CONCURRENCY)
    assert by_type[ConditionType.METRICS_AVAILABLE].status == "True"
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "seed-example.yaml").read_text())
    body = {"metadata": {"generation": 1}, "spec": doc["spec"], "status": {}}
    desired = desired_state(doc["spec"])
    first = desired_status(body, desired, None, now=1000.0, extra=extra)
    body["status"] = first
    second = desired_status(body, desired, None, now=2000.0, extra=extra)
    assert changed_fields(first, second) == {}
    effective = next(c for c in second["conditions"] if c["type"] == ConditionType.BATCHING_EFFECTIVE)
    assert effective["lastTransitionTime"] == "1970-01-01T00:16:40Z"


def test_signal_hub_queries_once_per_pass_however_long_the_pass() -> None:
    now = [0.0]
    source = CountingSource()
    hub = SignalHub(source, max_age_s=15.0, clock=lambda: now[0])  # type: ignore[arg-type]
    targets = [SignalTarget("ns", f"m{i}", f"model{i}", 8, frozenset({f"p{i}"})) for i in range(3)]
    for t in targets:
        hub.signals(t)
    assert len(source.calls) == 3  # first pass: the models are new, one small query set each
    for _ in range(2):
        hub.new_pass()
        for t in targets:
            now[0] += 6.0  # a slow pass: 18 s for three models, longer than half the interval
            hub.signals(t)
    assert source.calls[3:] == [[("ns", "m0"), ("ns", "m1"), ("ns", "m2")]] * 2


def test_models_whose_pods_turn_ready_between_passes_share_one_query_set() -> None:
    """A fleet coming up: pods turn Ready between passes. Each pass is one query set, not one per model that is
    Ready for the first time (benchmarks/scale.py counted 800 to 1,000 queries per pass while 1,000 came up)."""
    now = [0.0]
    source = CountingSource()
    hub = SignalHub(source, max_age_s=15.0, clock=lambda: now[0])  # type: ignore[arg-type]
    waiting = [SignalTarget("ns", f"m{i}", f"model{i}", 8) for i in range(4)]
    for t in waiting:  # pass 1: no pod Ready yet, nothing to ask
        assert hub.signals(t).reason == SignalsReason.NO_READY_PODS
    assert source.calls == []
    hub.new_pass()
    now[0] += 15.0
    for t in waiting[:3]:  # pass 2: three are Ready now
        hub.signals(replace(t, ready_pods=frozenset({f"p-{t.name}"})))
    assert source.calls == [[("ns", "m0"), ("ns", "m1"), ("ns", "m2"), ("ns", "m3")]]
    # models never asked for before, named by the pass (ScalingLoop lists them first): covered by its query set
    named = [SignalTarget("ns2", f"n{i}", f"other{i}", 8) for i in range(3)]
    hub.new_pass(named)
    now[0] += 15.0
    for t in named:
        hub.signals(replace(t, ready_pods=frozenset({f"q-{t.name}"})))
    assert len(source.calls) == 2
    assert {("ns2", "n0"), ("ns2", "n1"), ("ns2", "n2")} <= set(source.calls[-1])


def test_a_pass_names_each_model_by_namespace_and_triton_model() -> None:
    from batchfill.controller.loops import expected_target

    body = {"metadata": {"namespace": "ns", "name": "bm"}, "spec": {"model": {"name": "resnet"}},
            "status": {"plan": {"maxBatchSize": 16}}}  # fmt: skip
    assert expected_target(body) == SignalTarget("ns", "bm", "resnet", 16)
    assert expected_target({**body, "status": {}}) == SignalTarget("ns", "bm", "resnet", 1)
    flag = {"plan": {"maxBatchSize": True}}
    assert expected_target({**body, "status": flag}) == SignalTarget("ns", "bm", "resnet", 1)
    assert expected_target({**body, "spec": {"model": "resnet"}}) is None
    assert expected_target({**body, "spec": {}}) is None


def test_replicas_managers_tell_a_hand_edit_from_batchfills_own_unfinished_scale() -> None:
    def entry(manager: str, spec: dict[str, Any], subresource: str = "") -> dict[str, Any]:
        out = {"manager": manager, "operation": "Update", "fieldsV1": {"f:spec": spec}}
        return out | ({"subresource": subresource} if subresource else {})

    template = {"f:template": {"f:metadata": {}}}
    created = {"metadata": {"managedFields": [entry("batchfill", {"f:replicas": {}, **template})]}}
    assert replicas_managers(created) == ["batchfill"]
    scaled_by_hand = {
        "metadata": {
            "managedFields": [
                entry("batchfill", template),  # the apply lost spec.replicas to the later update
                entry("kubectl", {"f:replicas": {}}, "scale"),
            ]
        }
    }
    assert replicas_managers(scaled_by_hand) == ["kubectl"]
    assert replicas_managers({"metadata": {}}) == []
    assert replicas_managers({"metadata": {"managedFields": [{"manager": "x", "fieldsV1": {"f:spec": "junk"}}]}}) == []
