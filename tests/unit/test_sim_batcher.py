"""The batcher model against hand-worked traces of Triton's dynamic-batcher rules."""

from __future__ import annotations

import numpy as np
import pytest

from batchfill.sim.batcher import BatcherConfig, poisson_unit_arrivals, simulate_batcher

# l(b) = 10 + 5 b ms for b = 1..8
TABLE = [0.0] + [10.0 + 5.0 * b for b in range(1, 9)]


def run(arrivals: list[float], **cfg: int | tuple[int, ...]) -> tuple[list[int], list[float], list[float]]:
    r = simulate_batcher(arrivals, BatcherConfig(**cfg), TABLE)  # type: ignore[arg-type]
    return r.batch_sizes.tolist(), r.dispatch_ms.tolist(), r.latencies_ms.round(6).tolist()


def test_preferred_size_reached_dispatches_at_once() -> None:
    sizes, starts, lat = run([0, 1, 2, 3], max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=50_000)
    assert sizes == [4]
    assert starts == [3.0]
    assert lat == [33.0, 32.0, 31.0, 30.0]  # 3 + l(4)=30 - arrival


def test_lone_request_waits_out_the_delay() -> None:
    sizes, starts, lat = run([0, 100], max_batch_size=8, max_queue_delay_us=10_000)
    assert sizes == [1, 1]
    assert starts == [10.0, 110.0]
    assert lat == [25.0, 25.0]  # delay 10 + l(1) 15


def test_batch_grows_while_the_instance_is_busy() -> None:
    # first request runs alone from t=10 until t=25; five arrive meanwhile and all start together at 25.
    sizes, starts, _ = run([0, 11, 12, 13, 14, 15], max_batch_size=8, max_queue_delay_us=10_000)
    assert sizes == [1, 5]
    assert starts == [10.0, 25.0]


def test_max_batch_size_caps_a_batch() -> None:
    sizes, _, _ = run([0.0] * 10, max_batch_size=4, max_queue_delay_us=10_000)
    assert sizes == [4, 4, 2]


def test_batching_off_runs_each_request_alone_without_delay() -> None:
    sizes, starts, lat = run([0, 0, 0], max_batch_size=0, max_queue_delay_us=0)
    assert sizes == [1, 1, 1]
    assert starts == [0.0, 15.0, 30.0]
    assert lat == [15.0, 30.0, 45.0]


def test_parallel_executors_take_batches_side_by_side() -> None:
    sizes, starts, _ = run([0, 0.5], max_batch_size=1, max_queue_delay_us=100, executors=2)
    assert sizes == [1, 1]
    assert starts == [0.0, 0.5]


def test_violation_budget_stops_an_exploding_queue_early() -> None:
    unit = poisson_unit_arrivals(5000, seed=1)
    arrivals = (unit * (1000 / 1000.0)).tolist()  # 1000 req/s, far beyond 8/50ms = 160 req/s
    r = simulate_batcher(
        arrivals,
        BatcherConfig(max_batch_size=8, max_queue_delay_us=1000),
        TABLE,
        budget_ms=90.0,
        max_violations=50,
    )
    assert not r.completed
    assert r.violations > 50
    assert r.batch_sizes.sum() < 5000


def test_same_seed_same_arrivals_and_other_seed_differs() -> None:
    a, b = poisson_unit_arrivals(100, 7), poisson_unit_arrivals(100, 7)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, poisson_unit_arrivals(100, 8))
    assert np.all(np.diff(a) > 0)


@pytest.mark.parametrize(
    "bad",
    [
        {"max_batch_size": -1},
        {"max_batch_size": 4, "executors": 0},
        {"max_batch_size": 4, "preferred_batch_sizes": (8,)},
    ],
)
def test_invalid_config_is_rejected(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=r"must be >= |outside"):
        BatcherConfig(**bad)  # type: ignore[arg-type]
