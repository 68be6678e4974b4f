"""Planning throughput: today's planner against the old one (benchmarks/plan_baseline.py), side by side.

Plans ``--specs`` distinct generated specs (benchmarks/plan_specs.py: seeded, varied profile shapes, noise, SLAs,
network overheads, batch limits and overrides) with both planners in one process and prints, per spec, both
wall times and their ratio, and whether the plans are equal: the same max batch size, preferred sizes and queue
delay, capacity at SLA within 1 %, or the same error (type and message) from both. Then the totals, the ratio and
the projected time for 1,000 distinct specs on one core (target: <= 60 s on the 2-core machine).

The new planner's first plan in a process loads (or, on a cold cache, compiles) the numba-compiled batcher: it is
timed separately as the warm-up and added once to the projection.

Exits 1 when any plan differs. Run: .venv/bin/python benchmarks/plan_speed.py [--specs 100] [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from batchfill.api.errors import InfeasibleSLAError, SpecError
from batchfill.api.validate import load_model
from batchfill.policy import plan as new_plan
from plan_baseline import BaselineUnavailableError, load
from plan_specs import spec_documents

TARGET_1000_S = 60.0
CAPACITY_TOLERANCE = 0.01


@dataclass(frozen=True)
class Outcome:
    seconds: float
    plan: tuple[int, tuple[int, ...], int] | None  # (B, preferred sizes, delay µs)
    capacity_rps: float
    error: str | None


def run(planner: Any, spec: Any) -> Outcome:
    t0 = time.perf_counter()
    try:
        r = planner.plan_batching(spec)
    except (SpecError, InfeasibleSLAError) as err:
        return Outcome(time.perf_counter() - t0, None, 0.0, f"{type(err).__name__}: {err}")
    c = r.chosen
    key = (c.max_batch_size, c.preferred_batch_sizes, c.max_queue_delay_us)
    return Outcome(time.perf_counter() - t0, key, c.capacity_rps, None)


def equal(old: Outcome, new: Outcome) -> tuple[bool, str]:
    if old.error or new.error:
        return old.error == new.error, "same error" if old.error == new.error else f"{old.error!r} vs {new.error!r}"
    if old.plan != new.plan:
        return False, f"plan {old.plan} vs {new.plan}"
    diff = abs(new.capacity_rps - old.capacity_rps) / old.capacity_rps
    return diff <= CAPACITY_TOLERANCE, f"capacity {diff:.2%} apart"


def describe(doc: dict[str, Any]) -> str:
    spec = doc["spec"]
    prof = spec["profile"]
    extra = ",".join(sorted(spec.get("batching", {})))
    return (
        f"{len(prof)}pt<={prof[-1]['batchSize']} l1={prof[0]['latencyMs']:g} S={spec['sla']['latencyP99Ms']:g} "
        f"N={spec['sla']['networkOverheadMs']:g}{' ' + extra if extra else ''}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=int, default=100, help="distinct generated specs (default 100)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the generated specs (default 1)")
    ap.add_argument("--quiet", action="store_true", help="print the summary only, not one row per spec")
    args = ap.parse_args()
    console = Console(width=150)
    docs = spec_documents(args.specs, args.seed)
    specs = []
    for d in docs:
        # a combination the API rejects (e.g. preferred sizes with the Direct strategy) is not a plan
        with contextlib.suppress(SpecError):
            specs.append((d, load_model(d).spec))

    if not specs:
        console.print("no valid specs generated")
        return 1
    try:
        old_plan = load()
    except BaselineUnavailableError as e:
        console.print(f"the old planner cannot be loaded from git history: {e}")
        return 2
    t0 = time.perf_counter()
    run(new_plan, specs[0][1])
    warmup_s = time.perf_counter() - t0

    table = Table(title=f"{len(specs)} distinct specs (seed {args.seed}): old planner vs new, wall s")
    for col in ("#", "spec", "old s", "new s", "ratio", "plan (B, preferred, delay µs)", "equal"):
        table.add_column(col, justify="right" if col.endswith("s") or col in ("#", "ratio") else "left")
    old_times: list[float] = []
    new_times: list[float] = []
    differing = 0
    for i, (doc, spec) in enumerate(specs):
        old, new = run(old_plan, spec), run(new_plan, spec)
        same, why = equal(old, new)
        differing += not same
        old_times.append(old.seconds)
        new_times.append(new.seconds)
        plan = "error" if new.plan is None else f"{new.plan[0]}, {_pref(new.plan[1])}, {new.plan[2]}"
        if not args.quiet or not same:
            table.add_row(str(i), describe(doc), f"{old.seconds:.3f}", f"{new.seconds:.4f}",
                          f"{old.seconds / new.seconds:.0f}x", plan,
                          ("yes" if same else "[red]NO[/red]") + f" ({why})")  # fmt: skip
    if table.row_count:
        console.print(table)
    old_total, new_total = sum(old_times), sum(new_times)
    projected = warmup_s + 1000 * new_total / len(specs)
    summary = Table(title="totals")
    for col in ("planner", "total s", "mean s/spec", "median s", "max s", "projected 1,000 specs s"):
        summary.add_column(col, justify="right")
    summary.add_row("old (099221c)", f"{old_total:.2f}", f"{old_total / len(specs):.4f}",
                    f"{statistics.median(old_times):.4f}", f"{max(old_times):.3f}",
                    f"{1000 * old_total / len(specs):.0f}")  # fmt: skip
    summary.add_row("new", f"{new_total:.2f}", f"{new_total / len(specs):.4f}", f"{statistics.median(new_times):.4f}",
                    f"{max(new_times):.3f}", f"{projected:.1f}")  # fmt: skip
    console.print(summary)
    per_spec = statistics.median(o / n for o, n in zip(old_times, new_times, strict=True))
    console.print(
        f"ratio old/new: {old_total / new_total:.1f}x total, {per_spec:.1f}x "
        f"median per spec; new planner warm-up (first plan in the process) {warmup_s:.2f} s; projected 1,000 "
        f"distinct specs on one core {projected:.1f} s ({'met' if projected <= TARGET_1000_S else 'MISSED'}: "
        f"<= {TARGET_1000_S:g} s); plans differing: {differing}/{len(specs)}"
    )
    return 1 if differing else 0


def _pref(sizes: tuple[int, ...]) -> str:
    """Preferred sizes, with the work-conserving 1..B written as a range."""
    if len(sizes) > 3 and sizes == tuple(range(1, len(sizes) + 1)):
        return f"1..{len(sizes)}"
    return str(list(sizes))


if __name__ == "__main__":
    sys.exit(main())
