"""What teams run today (compare.baselines): each configuration's batcher semantics on known arrivals, its
capacity at SLA, the best-HPA-target search, the policy names, and baselines inside a comparison and its tables."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from batchfill.api.spec import BatchedModelSpec
from batchfill.api.validate import load_model
from batchfill.compare.baselines import (
    BASELINE_POLICIES,
    HPA_TARGET_GRID,
    Batching,
    PolicyName,
    best_hpa_target,
    configuration,
    parse_policy,
)
from batchfill.compare.report import END_TO_END_COLUMNS, end_to_end_markdown, end_to_end_rows
from batchfill.compare.run import CompareError, Options, check_policies, compare, expand_policies, prepare
from batchfill.policy.plan import plan_batching
from batchfill.sim import traces
from batchfill.sim.batcher import BatcherConfig, simulate_batcher
from batchfill.sim.fleet import FleetRun

# l(1) = 10, l(4) = 16, l(8) = 20 ms (linear in between); SLA 100 ms, 10 ms outside Triton: T = 90 ms, and the
# seed rule D = 100 - l(8) - 10 = 70 ms
PROFILE = {1: 10.0, 4: 16.0, 8: 20.0}


def model_doc(profile: dict[int, float], sla_ms: float, network_ms: float, **batching: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batchfill.io/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": {
            "model": {
                "name": "m",
                "platform": "onnxruntime_onnx",
                "inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [4]}],
                "outputs": [{"name": "y", "dataType": "TYPE_FP32", "dims": [1]}],
            },
            "sla": {"latencyP99Ms": sla_ms, "networkOverheadMs": network_ms},
            "profile": [{"batchSize": b, "latencyMs": v} for b, v in profile.items()],
            "scaling": {"minReplicas": 1, "maxReplicas": 200},
            "batching": batching,
        },
    }


def spec_of(profile: dict[int, float] = PROFILE, sla_ms: float = 100.0, network_ms: float = 10.0, **kw: Any) -> Any:
    return load_model(copy.deepcopy(model_doc(profile, sla_ms, network_ms, **kw))).spec


@pytest.fixture(scope="module")
def spec() -> BatchedModelSpec:
    out: BatchedModelSpec = spec_of()
    return out


def batches(spec: BatchedModelSpec, batching: Batching, arrivals_ms: list[float]) -> tuple[list[int], list[float]]:
    """(batch sizes, dispatch times in ms) of one replica of ``batching`` on ``arrivals_ms``."""
    conf = configuration(batching, spec, plan_batching(spec).to_status())
    run = simulate_batcher(arrivals_ms, conf.batcher, conf.latency_ms)
    return run.batch_sizes.tolist(), [round(t, 9) for t in run.dispatch_ms.tolist()]


ARRIVALS = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 200.0, 201.0]


# ------------------------------------------------------------------------------------------------ batcher semantics


def test_batching_off_runs_every_request_alone_in_arrival_order(spec: BatchedModelSpec) -> None:
    sizes, starts = batches(spec, Batching.OFF, ARRIVALS)
    assert sizes == [1] * len(ARRIVALS)
    # l(1) = 10 ms back to back while requests wait, then at each arrival
    assert starts == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 210.0]


def test_triton_default_takes_what_is_queued_when_the_instance_frees(spec: BatchedModelSpec) -> None:
    sizes, starts = batches(spec, Batching.TRITON_DEFAULT, ARRIVALS)
    # no delay: the first request runs alone at once; the five that queue during its 10 ms form the next batch
    # the moment the instance frees; a lone request later runs alone at its arrival
    assert sizes == [1, 5, 1, 1, 1]
    assert starts == [0.0, 10.0, 100.0, 200.0, 210.0]


def test_triton_default_batches_stop_at_max_batch_size(spec: BatchedModelSpec) -> None:
    sizes, starts = batches(spec, Batching.TRITON_DEFAULT, [float(t) for t in range(12)])
    # 10 requests queue during the first execution (1..10 ms): 8 (max_batch_size) go at 10 ms, for l(8) = 20 ms,
    # then the 3 left (9, 10, 11) at 30 ms
    assert sizes == [1, 8, 3]
    assert starts == [0.0, 10.0, 30.0]


def test_seed_rule_waits_for_its_preferred_size_or_the_delay(spec: BatchedModelSpec) -> None:
    sizes, starts = batches(spec, Batching.SEED_RULE, ARRIVALS)
    # D = 70 ms: fewer than 8 pending, so each batch starts when its oldest request has waited 70 ms
    assert sizes == [6, 1, 2]
    assert starts == [70.0, 170.0, 270.0]
    sizes, starts = batches(spec, Batching.SEED_RULE, [float(t) for t in range(9)])
    # the 8th pending request completes the preferred size [8]: dispatched at its arrival, not after the delay
    assert sizes == [8, 1]
    assert starts == [7.0, 78.0]


# ------------------------------------------------------------------------------------------------ configurations


def test_configurations_and_their_capacities(spec: BatchedModelSpec) -> None:
    result = plan_batching(spec)
    plan = result.to_status()
    off = configuration(Batching.OFF, spec, plan)
    assert off.batcher == BatcherConfig(0)
    assert off.latency_ms == (0.0, 10.0)
    off_spec = spec.model_copy(update={"batching": spec.batching.model_copy(update={"maxBatchSize": 0})})
    assert off.capacity_rps == plan_batching(off_spec).chosen.capacity_rps
    # one request at a time at 10 ms: below 100 req/s, and within the SLA well below it
    assert 50.0 < off.capacity_rps < 100.0

    default = configuration(Batching.TRITON_DEFAULT, spec, plan)
    assert default.batcher == BatcherConfig(8, (), 0)
    assert len(default.latency_ms) == 9
    # up to 8 in 20 ms: below 400 req/s, and above what batching off serves
    assert off.capacity_rps < default.capacity_rps < 400.0

    seed = configuration(Batching.SEED_RULE, spec, plan)
    assert plan.seedRule is not None
    assert seed.batcher == BatcherConfig(8, (8,), 70_000)
    assert seed.capacity_rps == plan.seedRule.capacityPerReplicaRps
    assert "70,000 µs" in seed.summary


def test_triton_default_uses_the_declared_max_batch_size() -> None:
    s = spec_of(maxBatchSize=4)
    conf = configuration(Batching.TRITON_DEFAULT, s, plan_batching(s).to_status())
    assert conf.batcher == BatcherConfig(4, (), 0)


@pytest.mark.parametrize("batching", [Batching.TRITON_DEFAULT, Batching.SEED_RULE])
def test_a_model_that_does_not_batch_has_no_batching_baseline(batching: Batching) -> None:
    s = spec_of(maxBatchSize=0)
    with pytest.raises(CompareError, match=r"spec\.batching\.maxBatchSize=0"):
        configuration(batching, s, plan_batching(s).to_status())


def test_triton_default_beyond_the_budget_names_the_configuration() -> None:
    # l(8) = 95 ms exceeds T = 90 ms: Triton's default max batch cannot keep the SLA even for one batch
    s = spec_of({1: 10.0, 8: 95.0})
    with pytest.raises(CompareError, match=r"^triton-default: "):
        configuration(Batching.TRITON_DEFAULT, s, plan_batching(s).to_status())


# ------------------------------------------------------------------------------------------------ policy names


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("batchfill", PolicyName(None, "batchfill")),
        ("hpa-gpu@best", PolicyName(None, "hpa-gpu@best")),
        ("batching-off/hpa-gpu", PolicyName(Batching.OFF, "hpa-gpu")),
        ("triton-default/hpa-gpu@70", PolicyName(Batching.TRITON_DEFAULT, "hpa-gpu@70")),
        ("seed-rule/static-peak", PolicyName(Batching.SEED_RULE, "static-peak")),
    ],
)
def test_parse_policy(name: str, expected: PolicyName) -> None:
    assert parse_policy(name) == expected


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("batching-on/hpa-gpu", "unknown batching configuration 'batching-on'"),
        ("seed-rule/keda-rps", "a baseline runs behind hpa-gpu, hpa-gpu@best, static-peak"),
        ("seed-rule/batchfill", "not 'batchfill'"),
    ],
)
def test_parse_policy_rejects(name: str, match: str) -> None:
    with pytest.raises(CompareError, match=match):
        parse_policy(name)
    with pytest.raises(CompareError, match=match):
        check_policies([name])


def test_baselines_alias_expands_to_nine_policies_once() -> None:
    assert len(BASELINE_POLICIES) == 9
    expanded = expand_policies(["batchfill", "baselines", "batching-off/hpa-gpu", "keda-rps"])
    assert expanded == ["batchfill", *BASELINE_POLICIES, "keda-rps"]
    check_policies(expanded)
    with pytest.raises(CompareError, match=r"'batching-off/hpa-gpu@0': the target after '@'"):
        check_policies(["batching-off/hpa-gpu@0"])


# ------------------------------------------------------------------------------------------------ best target


def fake_run(target: float, attainment: float, gpu_seconds: float) -> FleetRun:
    return FleetRun(
        policy=f"t{target}",
        duration_s=3600.0,
        gpu_seconds=gpu_seconds,
        requests=1_000_000,
        within_sla=round(attainment * 1_000_000),
        refused=0,
        latency_histogram=np.zeros(1, dtype=np.int64),
        scale_events=0,
        ticks=(),
        arrivals_per_minute=np.zeros(60, dtype=np.int64),
        peak_replicas=1,
    )


def counting(attainment: Callable[[float], float]) -> tuple[Callable[[float], FleetRun], list[float]]:
    asked: list[float] = []

    def run_at(t: float) -> FleetRun:
        asked.append(t)
        return fake_run(t, attainment(t), 100.0 / t)  # fewer replicas at a higher target

    return run_at, asked


@pytest.mark.parametrize("edge", [0.3, 0.45, 0.65, 0.8, 0.95])
def test_best_target_is_the_highest_that_keeps_the_slo(edge: float) -> None:
    run_at, asked = counting(lambda t: 1.0 if t <= edge + 1e-9 else 0.99)
    target, run = best_hpa_target(run_at)
    assert target == pytest.approx(edge)
    assert run.gpu_seconds == pytest.approx(100.0 / edge)
    assert len(asked) <= math.ceil(math.log2(len(HPA_TARGET_GRID) + 1)), asked
    assert len(set(asked)) == len(asked), "no target is simulated twice"


def test_best_target_without_any_target_keeping_the_slo_is_the_lowest() -> None:
    run_at, _ = counting(lambda t: 0.99)
    target, run = best_hpa_target(run_at)
    assert target == HPA_TARGET_GRID[0]
    assert run.policy == f"t{HPA_TARGET_GRID[0]}"


def test_best_target_prefers_the_cheapest_run_that_keeps_the_slo() -> None:
    # a run that keeps the SLO at a lower target but holds fewer GPUs (a fleet that oscillates at the higher one)
    def run_at(t: float) -> FleetRun:
        return fake_run(t, 1.0 if t <= 0.65 else 0.9, 50.0 if t == 0.6 else 100.0)

    assert best_hpa_target(run_at, grid=(0.5, 0.6, 0.65, 0.7))[0] == 0.6


# ------------------------------------------------------------------------------------------------ in a comparison


def test_a_comparison_with_baselines(spec: BatchedModelSpec) -> None:
    trace = traces.spike(200.0, 200.0, start_s=0.0, length_s=1.0, duration_s=300.0, seed=2)
    setup = prepare(spec)
    names = ["batchfill", "batching-off/static-peak", "batching-off/hpa-gpu", "seed-rule/hpa-gpu@best"]
    c = compare(spec, trace, names, Options(balancing="random"), setup=setup)
    assert [r.policy for r in c.runs] == names
    off = c.baseline(Batching.OFF)
    assert off is not None
    assert c.baseline(Batching.SEED_RULE) is not None
    assert c.baseline(Batching.TRITON_DEFAULT) is None, "only the configurations asked for are built"
    static = c.run("batching-off/static-peak")
    assert static is not None
    # ceil(peak minute / C) with batching off's own capacity, all the time
    assert static.peak_replicas == math.ceil(c.peak_rps / off.capacity_rps - 1e-9)
    assert static.gpu_seconds == pytest.approx(static.peak_replicas * 300.0)
    assert set(c.best_targets) == {"seed-rule/hpa-gpu@best"}
    assert c.best_targets["seed-rule/hpa-gpu@best"] in HPA_TARGET_GRID
    # batching off needs more GPUs than the plan for the same traffic
    ours = c.run("batchfill")
    assert ours is not None
    assert static.gpu_seconds > ours.gpu_seconds

    cells = end_to_end_rows(c)
    assert cells[0][:2] == ["plan", "batchfill"]
    assert [row[0] for row in cells] == ["plan", "batching-off", "batching-off", "seed-rule"]
    assert all(len(row) == len(END_TO_END_COLUMNS) for row in cells)
    assert cells[1][1] == f"static peak ({static.peak_replicas})"
    assert cells[1][3] == f"{static.gpu_seconds / ours.gpu_seconds:.2f}"
    best = c.best_targets["seed-rule/hpa-gpu@best"]
    assert cells[3][1] == f"HPA GPU util, best {best:.0%}"
    assert end_to_end_markdown(c).startswith("| Triton batching | autoscaler |")
    # without a baseline run there is no end-to-end table
    plain = compare(spec, trace, ["batchfill", "hpa-gpu"], setup=setup)
    assert end_to_end_rows(plain) == []
    assert end_to_end_markdown(plain) == ""


def test_comparison_rejects_an_unknown_balancing(spec: BatchedModelSpec) -> None:
    trace = traces.spike(10.0, 10.0, start_s=0.0, length_s=1.0, duration_s=60.0, seed=2)
    with pytest.raises(CompareError, match="balancing='nearest'"):
        compare(spec, trace, ["batchfill"], Options(balancing="nearest"))
