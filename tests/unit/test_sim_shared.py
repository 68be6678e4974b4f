"""The shared-GPU server (sim.shared): one model reproduces today's batcher exactly; several share the GPU."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfill.sim.batcher import BatcherConfig, poisson_unit_arrivals, simulate_batcher
from batchfill.sim.replica import ReplicaBatcher
from batchfill.sim.shared import SharedModel, SharedReplica, poisson_arrivals, simulate_shared

#: l(b) tables: the seed example's (10 ms at 1, 28 at 4, 50 at 8, linear between), a steep one and a flat one
PROFILES = {
    "seed": [0.0, 10.0, 16.0, 22.0, 28.0, 33.5, 39.0, 44.5, 50.0],
    "linear": [0.0] + [4.0 + 3.0 * b for b in range(1, 17)],
    "flat": [0.0] + [2.0 + 0.1 * b for b in range(1, 33)],
}
BUDGET_MS = 60.0


def _cut(a: np.ndarray, cuts: list[float]) -> list[np.ndarray]:
    edges = [0.0, *cuts, math.inf]
    return [a[int(np.searchsorted(a, lo)) : int(np.searchsorted(a, hi))] for lo, hi in pairwise(edges)]


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("seed", [0, 1, 7, 2024])
@pytest.mark.parametrize(
    ("config", "load"),
    [
        (BatcherConfig(8, tuple(range(1, 9)), 100), 0.9),
        (BatcherConfig(8, (4,), 5_000), 0.6),
        (BatcherConfig(4, (), 20_000, executors=2), 1.3),
        (BatcherConfig(0, (), 0), 0.7),
    ],
)
def test_one_model_reproduces_simulate_batcher_and_replica_sample_for_sample(
    profile: str, seed: int, config: BatcherConfig, load: float
) -> None:
    table = PROFILES[profile][: config.batch_cap + 1]
    # the rate at `load` x the full-batch throughput of the config's executors
    rate_per_ms = load * config.executors * config.batch_cap / table[config.batch_cap]
    a = poisson_unit_arrivals(3_000, seed) / rate_per_ms
    ref = simulate_batcher(a.tolist(), config, table)
    cuts = [float(c) for c in np.linspace(0, a[-1], 17)[1:-1]]
    shared = SharedReplica([SharedModel(config, tuple(table), BUDGET_MS)], gpus=config.executors)
    replica = ReplicaBatcher(config, table, BUDGET_MS)
    got: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    for chunk, until in zip(_cut(a, cuts), [*cuts, math.inf], strict=True):
        iv = shared.advance([chunk], until)
        one = replica.advance(chunk, until)
        m = iv.models[0]
        assert (m.completed, m.executions, m.pending, m.within_budget) == (
            one.completed,
            one.executions,
            one.pending,
            one.within_budget,
        )
        assert m.busy_ms == pytest.approx(one.busy_ms, rel=1e-12)
        assert m.queue_ms == pytest.approx(one.queue_ms, rel=1e-12, abs=1e-9)
        assert m.last_end_ms == one.last_end_ms
        assert iv.gpu_wait_ms == (0.0,), "one model never waits for its own GPU"
        got.append(m.latencies_ms)
        sizes.append(iv.batch_sizes[0])
    assert np.array_equal(np.concatenate(got), ref.latencies_ms)
    assert np.array_equal(np.concatenate(sizes), ref.batch_sizes)
    run = simulate_shared([a], [SharedModel(config, tuple(table), BUDGET_MS)], gpus=config.executors)
    assert np.array_equal(run.latencies_ms[0], ref.latencies_ms)


def test_two_models_take_turns_on_the_gpu_in_dispatch_order() -> None:
    # A: l(b) = 10 + 2b, B: l(b) = 5 + b; both work-conserving (dispatch at once), batches up to 4.
    a_table = (0.0, 12.0, 14.0, 16.0, 18.0)
    b_table = (0.0, 6.0, 7.0, 8.0, 9.0)
    cfg = BatcherConfig(4, (1, 2, 3, 4), 100)
    models = [SharedModel(cfg, a_table, 30.0), SharedModel(cfg, b_table, 30.0)]
    # A at 0 runs [0, 12); B at 1 is dispatched at 1 (its instance is free) and waits for the GPU: [12, 18);
    # A's arrivals at 2 and 3 form its next batch when A's instance frees at 12: [18, 32) for 2 requests;
    # B's arrival at 13 is dispatched when B's instance frees at 18, after A's batch dispatched at 12: [32, 38).
    run = simulate_shared([[0.0, 2.0, 3.0], [1.0, 13.0]], models)
    assert run.latencies_ms[0].tolist() == [12.0, 30.0, 29.0]
    assert run.latencies_ms[1].tolist() == [17.0, 25.0]
    assert [s.tolist() for s in run.batch_sizes] == [[1, 2], [1, 1]]
    assert run.gpu_busy_fraction == pytest.approx((12 + 6 + 14 + 6) / 38)


def test_waiting_for_the_gpu_is_reported_and_two_gpus_remove_it() -> None:
    cfg = BatcherConfig(1, (), 100)
    models = [SharedModel(cfg, (0.0, 10.0), 50.0), SharedModel(cfg, (0.0, 10.0), 50.0)]
    one = SharedReplica(models, gpus=1).advance([[0.0], [0.0]], math.inf)
    assert one.gpu_wait_ms == (0.0, 10.0), "the tie in dispatch time goes to the first model"
    assert [m.latencies_ms.tolist() for m in one.models] == [[10.0], [20.0]]
    assert one.gpu_busy_ms == 20.0
    two = SharedReplica(models, gpus=2).advance([[0.0], [0.0]], math.inf)
    assert two.gpu_wait_ms == (0.0, 0.0)
    assert [m.latencies_ms.tolist() for m in two.models] == [[10.0], [10.0]]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    rates=st.lists(st.sampled_from([0.0, 0.02, 0.1, 0.3]), min_size=1, max_size=4),
    delays=st.lists(st.sampled_from([100, 3_000, 20_000]), min_size=4, max_size=4),
    caps=st.lists(st.sampled_from([0, 1, 4, 8]), min_size=4, max_size=4),
    cut_fractions=st.lists(st.floats(0.0, 1.2, allow_nan=False), max_size=10),
)
def test_cutting_several_models_arrivals_changes_nothing(
    seed: int, rates: list[float], delays: list[int], caps: list[int], cut_fractions: list[float]
) -> None:
    profiles = [PROFILES["seed"], PROFILES["linear"], PROFILES["flat"], PROFILES["seed"]]
    models = [
        SharedModel(BatcherConfig(caps[i], (), delays[i]), tuple(profiles[i][: max(1, caps[i]) + 1]), 40.0)
        for i in range(len(rates))
    ]
    arrivals = poisson_arrivals([r * 1000 for r in rates], 2.0, seed)
    whole = simulate_shared(arrivals, models)
    server = SharedReplica(models)
    cuts = sorted({round(f * 2000.0, 3) for f in cut_fractions if f > 0})
    pieces = [_cut(a, cuts) for a in arrivals]
    got: list[list[np.ndarray]] = [[] for _ in models]
    for k, until in enumerate([*cuts, math.inf]):
        iv = server.advance([p[k] for p in pieces], until)
        for i, m in enumerate(iv.models):
            got[i].append(m.latencies_ms)
            assert m.pending == server.pending[i]
    assert server.pending == (0,) * len(models)
    for i, a in enumerate(arrivals):
        lat = np.concatenate(got[i])
        assert np.array_equal(lat, whole.latencies_ms[i])
        assert len(lat) == len(a)
        # never faster than running alone: the execution of a batch of one
        assert (lat >= models[i].latency_ms[1] - 1e-9).all()
    assert 0.0 <= whole.gpu_busy_fraction <= 1.0 + 1e-12


def test_a_neighbour_only_adds_latency() -> None:
    # the same arrivals of model A alone and next to a busy B: every request of A is at least as late
    cfg = BatcherConfig(8, tuple(range(1, 9)), 100)
    table = tuple(PROFILES["seed"])
    a, b = poisson_arrivals([60.0, 60.0], 30.0, 3)
    alone = simulate_shared([a], [SharedModel(cfg, table, 90.0)]).latencies_ms[0]
    together = simulate_shared([a, b], [SharedModel(cfg, table, 90.0)] * 2).latencies_ms[0]
    assert together.mean() > alone.mean()
    assert np.quantile(together, 0.99) > np.quantile(alone, 0.99)


def test_poisson_arrivals_are_seeded_and_independent_per_model() -> None:
    one = poisson_arrivals([100.0, 5.0], 10.0, 42)
    again = poisson_arrivals([100.0, 5.0], 10.0, 42)
    more = poisson_arrivals([100.0, 5.0, 50.0], 10.0, 42)
    assert all(np.array_equal(x, y) for x, y in zip(one, again, strict=True))
    assert np.array_equal(one[0], more[0]), "adding a model changes no other"
    assert np.array_equal(one[1], more[1]), "adding a model changes no other"
    assert abs(len(one[0]) - 1000) < 4 * math.sqrt(1000)
    assert all((np.diff(x) >= 0).all() and (x < 10_000).all() for x in one)
    slow, fast = poisson_arrivals([10.0], 10.0, 5)[0], poisson_arrivals([20.0], 10.0, 5)[0]
    assert np.allclose(fast[: len(slow)], slow / 2, rtol=1e-12), "common random numbers: twice the rate, half the gaps"
    assert len(fast) > len(slow)
    assert len(poisson_arrivals([0.0], 10.0, 1)[0]) == 0
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals([-1.0], 1.0, 0)


def test_bad_inputs_raise() -> None:
    cfg = BatcherConfig(8)
    with pytest.raises(ValueError, match="need 8"):
        SharedModel(cfg, (0.0, 1.0), 10.0)
    with pytest.raises(ValueError, match="at least one model"):
        SharedReplica([])
    with pytest.raises(ValueError, match="gpus"):
        SharedReplica([SharedModel(BatcherConfig(1), (0.0, 1.0), 5.0)], gpus=0)
    with pytest.raises(ValueError, match="2 arrival sequences for 1 models"):
        SharedReplica([SharedModel(BatcherConfig(1), (0.0, 1.0), 5.0)]).advance([[], []], 1.0)
