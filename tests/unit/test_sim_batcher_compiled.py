"""The compiled batcher (sim.batcher): compiled without numba's disk cache where no cache location is writable."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest

from batchfill.sim import batcher
from batchfill.sim.batcher import BatcherConfig, simulate_batcher


def test_a_read_only_install_compiles_without_the_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    real_njit = numba.njit
    asked: list[bool] = []

    def njit(*args: Any, **options: Any) -> Any:
        if args or "cache" not in options:  # numba's own uses while it compiles
            return real_njit(*args, **options)
        asked.append(options["cache"])
        if options["cache"]:
            # what numba raises at decoration when neither __pycache__ nor NUMBA_CACHE_DIR nor HOME is writable
            raise RuntimeError("cannot cache function '_run': no locator available for file 'batcher.py'")
        return real_njit(**options)

    monkeypatch.setattr(numba, "njit", njit)
    monkeypatch.setattr(batcher, "_compiled", [])
    run = simulate_batcher([0.0, 0.5, 3.0], BatcherConfig(2, (), 1000), [0.0, 2.0, 3.0])
    assert asked == [True, False]
    # the first two fill the batch at 0.5 ms and are done at 3.5 ms; the third waits out the 1 ms delay alone
    assert np.array_equal(run.batch_sizes, [2, 1])
    assert np.array_equal(run.dispatch_ms, [0.5, 4.0])
    assert np.array_equal(run.latencies_ms, [3.5, 3.0, 3.0])


def test_arrays_and_lists_give_the_same_run() -> None:
    arrivals = np.cumsum(np.full(50, 0.7))
    config = BatcherConfig(4, (1, 2, 3, 4), 100, executors=2)
    table = [0.0, 1.0, 1.5, 2.0, 2.5]
    a, b = simulate_batcher(arrivals, config, np.asarray(table)), simulate_batcher(arrivals.tolist(), config, table)
    assert np.array_equal(a.latencies_ms, b.latencies_ms)
    assert np.array_equal(a.batch_sizes, b.batch_sizes)
