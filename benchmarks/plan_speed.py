"""How long `batchfill plan` takes: a 10-point profile against the 3-point seed example, side by side.

Target (README.md, Tests and benchmarks): <= 2 s for the 10-point profile on a 2-core machine. Prints figures;
not a pass/fail test.
Run: .venv/bin/python benchmarks/plan_speed.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from batchfill.api.validate import load_model
from batchfill.policy.plan import plan_batching

TARGET_S = 2.0


def doc(points: list[tuple[int, float]]) -> dict[str, Any]:
    return {
        "spec": {
            "model": {"name": "bench", "backend": "python"},
            "sla": {"latencyP99Ms": 100, "networkOverheadMs": 10},
            "profile": [{"batchSize": b, "latencyMs": lat} for b, lat in points],
        }
    }


SEED = doc([(1, 10), (4, 28), (8, 50)])
TEN_POINT = doc([(b, round(4 + 0.9 * b + 0.004 * b * b, 2)) for b in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)])


def time_plan(d: dict[str, Any], repeat: int) -> tuple[list[float], int, float]:
    spec = load_model(d).spec
    times: list[float] = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = plan_batching(spec)
        times.append(time.perf_counter() - t0)
    assert result is not None
    simulated = sum(1 for c in result.candidates if not c.pruned)
    return times, simulated, result.chosen.capacity_rps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    table = Table(title="batchfill plan: wall time (median of runs)")
    for col in (
        "profile",
        "median s",
        "min s",
        "candidates simulated",
        "capacity req/s",
        "ratio to seed",
        "target",
    ):
        table.add_column(col, justify="right")
    base, base_sim, base_cap = time_plan(SEED, args.repeat)
    ten, ten_sim, ten_cap = time_plan(TEN_POINT, args.repeat)
    b_med, t_med = statistics.median(base), statistics.median(ten)
    table.add_row(
        "3-point seed example",
        f"{b_med:.3f}",
        f"{min(base):.3f}",
        str(base_sim),
        f"{base_cap:.1f}",
        "1.00",
        "",
    )
    table.add_row(
        "10-point profile",
        f"{t_med:.3f}",
        f"{min(ten):.3f}",
        str(ten_sim),
        f"{ten_cap:.1f}",
        f"{t_med / b_med:.2f}",
        f"{'met' if t_med <= TARGET_S else 'MISSED'} (<= {TARGET_S:g} s)",
    )
    Console().print(table)


if __name__ == "__main__":
    main()
