"""End to end: batchfill against what teams run today, per profile shape; and the figures the case rests on.

For each profile shape (a small fixed cost like ResNet-50 on a GPU, a large fixed cost, a nearly linear cost),
one compressed diurnal day at a mean of 500 req/s (peak about 1,000) is served by the policies below; the small
fixed cost also at 4,000 req/s, where the plan needs several replicas, without batching off:

* batchfill (its plan and its policy) and KEDA on request rate at u·C (the plan's capacity: the best tuned
  competitor);
* what teams run today (:mod:`batchfill.compare.baselines`): batching off, ``dynamic_batching {}`` with
  Triton's defaults and the seed rule ``D = S - l(B) - N``, each behind the HPA on GPU utilization at 80 %, at
  the best target for that configuration (found by simulation) and behind static peak provisioning.

Requests are routed at random per request, as kube-proxy does (:mod:`batchfill.sim.routing`); round robin
would hand each of many small replicas a far smoother stream than Poisson and flatter batching off.

The figures section checks, at 1,000 req/s, the GPUs each profile needs with batching off and with the plan, and
where the HPA at 80 % settles with batching off (under random routing and under round robin).

``fleet_cost.py`` runs this first and puts it at the head of docs/benchmarks.md; run alone it prints the tables.
About 4 minutes on 2 cores (``--quick``: a 20-minute day, about a minute).

Run: .venv/bin/python benchmarks/end_to_end.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from batchfill.api.spec import BatchedModelSpec
from batchfill.api.validate import load_model
from batchfill.cli.simulate import print_end_to_end
from batchfill.compare.baselines import BASELINE_POLICIES, SLO_TARGET, Batching, configuration, parse_policy
from batchfill.compare.report import END_TO_END_LEGEND, configurations_text, end_to_end_markdown
from batchfill.compare.run import Comparison, Options, compare, prepare
from batchfill.sim import traces
from batchfill.sim.fleet import FleetRun

ROOT = Path(__file__).resolve().parents[1]
SPEC_FILE = ROOT / "examples" / "seed-example.yaml"
MEAN_RPS = 500.0
FIGURES_RPS = 1000.0
MAX_REPLICAS = 200
POLICIES = ("batchfill", "keda-rps", "baselines")
BALANCING = "random"


@dataclass(frozen=True)
class Shape:
    """One profile shape: execution latency per batch size (ms) and the SLA."""

    key: str
    title: str
    profile: dict[int, float]
    sla_ms: float
    network_ms: float
    #: the GPUs needed at 1,000 req/s (batching off, plan) the case is argued with; None: not stated
    stated_gpus: tuple[int, int] | None = None
    #: the day's mean rate (req/s), its length as a fraction of the benchmark's day, the policies run, and
    #: whether the shape is one of the 1,000 req/s figures
    mean_rps: float = MEAN_RPS
    day_fraction: float = 1.0
    policies: tuple[str, ...] = POLICIES
    in_figures: bool = True


SHAPES = (
    Shape(
        "small-fixed",
        "Small fixed cost (ResNet-50-like)",
        {1: 2.1, 2: 2.6, 4: 3.5, 8: 5.4, 16: 9.3, 32: 17.5},
        30.0,
        5.0,
        (3, 1),
    ),
    Shape("large-fixed", "Large fixed cost", {1: 20.0, 8: 24.0, 16: 28.0, 32: 36.0, 64: 52.0}, 150.0, 10.0, (30, 1)),
    # l(b) = 1 + 9 b ms: batching saves only the 1 ms fixed part
    Shape("nearly-linear", "Nearly linear", {1: 10.0, 4: 37.0, 8: 73.0, 16: 145.0}, 200.0, 10.0),
    # at 500 req/s one replica of the plan, of triton-default and of the seed rule serves the peak: a fleet of
    # several tells their capacities apart (batching off, 4 x the GPUs, would take most of the run time)
    Shape(
        "small-fixed-fleet",
        "Small fixed cost on a larger fleet (mean 4,000 req/s, half the day's length)",
        {1: 2.1, 2: 2.6, 4: 3.5, 8: 5.4, 16: 9.3, 32: 17.5},
        30.0,
        5.0,
        mean_rps=4000.0,
        day_fraction=0.5,
        policies=("batchfill", "keda-rps", *(p for p in BASELINE_POLICIES if not p.startswith(Batching.OFF.value))),
        in_figures=False,
    ),
)


def spec_of(shape: Shape) -> BatchedModelSpec:
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(SPEC_FILE.read_text(encoding="utf-8")))
    doc["metadata"]["name"] = shape.key
    doc["spec"]["profile"] = [{"batchSize": b, "latencyMs": v} for b, v in shape.profile.items()]
    doc["spec"]["sla"] = {"latencyP99Ms": shape.sla_ms, "networkOverheadMs": shape.network_ms}
    doc["spec"]["scaling"]["maxReplicas"] = MAX_REPLICAS
    return load_model(doc).spec


def profile_text(shape: Shape) -> str:
    points = ", ".join(f"{b}: {v:g}" for b, v in shape.profile.items())
    return f"l(b) = {{{points}}} ms, p99 SLA {shape.sla_ms:g} ms with {shape.network_ms:g} ms outside Triton"


@dataclass(frozen=True)
class Figures:
    """The 1,000 req/s figures of one shape."""

    shape: Shape
    off_capacity_rps: float
    plan_capacity_rps: float

    @property
    def gpus(self) -> tuple[int, int]:
        return math.ceil(FIGURES_RPS / self.off_capacity_rps), math.ceil(FIGURES_RPS / self.plan_capacity_rps)


@dataclass(frozen=True)
class Settle:
    """Batching off behind the HPA at 80 % at a constant 1,000 req/s: where it settles, per routing."""

    balancing: str
    replicas: tuple[int, ...]
    p99_ms: tuple[float, float]
    attainment: float
    budget_ms: float


def settle(spec: BatchedModelSpec) -> list[Settle]:
    setup = prepare(spec)
    trace = traces.spike(FIGURES_RPS, FIGURES_RPS, start_s=0.0, length_s=1.0, duration_s=900.0, seed=5)
    out = []
    for balancing in ("random", "round-robin"):
        c = compare(spec, trace, ["batching-off/hpa-gpu"], Options(balancing=balancing), setup=setup)
        # the fleet starts at ceil(λ / (u·C)); the first scale-down waits out the 300 s stabilization window
        ticks = [k for k in c.runs[0].ticks if k.t_s >= 420.0 and k.p99_ms is not None]
        p99 = [k.p99_ms for k in ticks if k.p99_ms is not None]
        out.append(
            Settle(
                balancing,
                tuple(sorted({k.current for k in ticks})),
                (min(p99), max(p99)),
                c.runs[0].slo_attainment,
                setup.plan.serverBudgetMs,
            )
        )
    return out


def cheapest_within_slo(c: Comparison, batching: Batching | None) -> FleetRun | None:
    """The configuration's run with the fewest GPU-hours among those keeping the SLO target (99.9 %)."""
    runs = [r for r in c.runs if parse_policy(r.policy).batching is batching and r.policy != "keda-rps"]
    kept = [r for r in runs if r.slo_attainment >= SLO_TARGET]
    return min(kept, key=lambda r: r.gpu_seconds) if kept else None


def _cell(c: Comparison, run: FleetRun | None, batching: Batching) -> str:
    ours = c.run("batchfill")
    if c.baseline(batching) is None:
        return "not run"
    if run is None or ours is None:
        best = max((r for r in c.runs if parse_policy(r.policy).batching is batching), key=lambda r: r.slo_attainment)
        return f"none keeps {SLO_TARGET:.1%} (best {best.slo_attainment:.2%}, {parse_policy(best.policy).scaler})"
    scaler = parse_policy(run.policy).scaler
    if scaler == "hpa-gpu@best":
        scaler = f"hpa-gpu@{c.best_targets[run.policy] * 100:g}"
    return f"{run.gpu_hours:.2f} GPU-h, {run.gpu_seconds / ours.gpu_seconds:.2f} x, {run.slo_attainment:.3%} ({scaler})"


def summary_table(results: list[tuple[Shape, Comparison]]) -> list[str]:
    """Per shape: batchfill's GPU-hours and attainment, and the cheapest way to run each baseline configuration
    within the SLO target."""
    head = ["profile", "batchfill", "KEDA req/s at u·C", *(f"{b.value}: cheapest within SLO" for b in Batching)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, c in results:
        ours, keda = c.run("batchfill"), c.run("keda-rps")
        assert ours is not None
        assert keda is not None
        cells = [
            shape.title,
            f"{ours.gpu_hours:.2f} GPU-h, {ours.slo_attainment:.3%} in SLA",
            f"{keda.gpu_hours:.2f} GPU-h, {keda.gpu_seconds / ours.gpu_seconds:.2f} x, {keda.slo_attainment:.3%}",
            *(_cell(c, cheapest_within_slo(c, b), b) for b in Batching),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def note(c: Comparison) -> str:
    """What one shape's table shows, from its figures (each claim only where its figures bear it out)."""
    ours = c.run("batchfill")
    off80, default80 = c.run("batching-off/hpa-gpu"), c.run("triton-default/hpa-gpu")
    off = c.baseline(Batching.OFF)
    assert ours is not None
    assert default80 is not None
    text = ""
    if off is not None and off80 is not None:
        text = (
            f"Batching off serves {off.capacity_rps:.4g} req/s per GPU within the SLA against the plan's "
            f"{c.setup.capacity_rps:.4g}. Behind the HPA at 80 % it holds {off80.gpu_hours:.2f} GPU-hours "
            f"({off80.gpu_seconds / ours.gpu_seconds:.2f} x batchfill) and keeps {off80.slo_attainment:.2%} of "
            f"requests within the SLA (batchfill: {ours.slo_attainment:.3%})."
        )
    ratio = default80.gpu_seconds / ours.gpu_seconds
    if ratio > 1.05 and default80.slo_attainment >= ours.slo_attainment - 1e-4:
        text += (
            f" With `dynamic_batching {{}}` the HPA at 80 % holds {default80.gpu_hours:.2f} GPU-hours ({ratio:.2f} x)"
            " at no better attainment: a batching replica's GPU is busy running small batches back to back long "
            "before its batches fill, so utilization overstates its load."
        )
    elif default80.slo_attainment < SLO_TARGET:
        text += (
            f" With `dynamic_batching {{}}` the HPA at 80 % holds {default80.gpu_hours:.2f} GPU-hours ({ratio:.2f} x) "
            f"and keeps only {default80.slo_attainment:.2%}: 80 % busy is past what these replicas serve within "
            "the SLA."
        )
    if ours.slo_attainment < SLO_TARGET:
        text += (
            f" batchfill itself keeps only {ours.slo_attainment:.3%} here, below the {SLO_TARGET:.1%} target, so its "
            "GPU-hours are not directly comparable with those of the runs that keep it."
        )
    return (text + _tie(c, ours)).strip()


def _tie(c: Comparison, ours: FleetRun) -> str:
    """When one replica of the plan serves the peak, the batching baselines can tie with it: say so, with the
    capacities that would tell them apart on a larger fleet."""
    if ours.peak_replicas > 1:
        return ""
    others = [b for b in c.baselines if b.batching is not Batching.OFF]
    caps = ", ".join(f"{b.batching.value} {b.capacity_rps:.4g}" for b in others)
    return (
        f" One replica of the plan serves this day's peak ({c.peak_rps:.4g} req/s), and so does one replica of the "
        "batching baselines: behind static peak or a well-chosen HPA target they tie with batchfill. Their "
        f"capacities at SLA (plan {c.setup.capacity_rps:.4g} req/s; {caps}) would tell them apart only on a larger "
        "fleet."
    )


def run(quick: bool, out: Console) -> tuple[list[tuple[Shape, Comparison]], list[Figures], list[Settle], float]:
    """Every shape's comparison, the 1,000 req/s figures and the settle runs; and the day's length (s)."""
    day = 1200.0 if quick else 7200.0
    results, figures = [], []
    for shape in SHAPES:
        t0 = time.perf_counter()
        spec = spec_of(shape)
        setup = prepare(spec)
        length = day * shape.day_fraction
        trace = traces.diurnal(shape.mean_rps, duration_s=length, period_s=length, peak_to_trough=5.0, seed=11)
        c = compare(spec, trace, shape.policies, Options(balancing=BALANCING), setup=setup)
        out.rule(f"{shape.title} ({time.perf_counter() - t0:.0f} s)")
        print_end_to_end(c, out)
        results.append((shape, c))
        if shape.in_figures:
            off = configuration(Batching.OFF, spec, setup.plan)
            figures.append(Figures(shape, off.capacity_rps, setup.capacity_rps))
    settles = settle(spec_of(next(s for s in SHAPES if s.key == "large-fixed")))
    return results, figures, settles, day


def figures_lines(figures: list[Figures], settles: list[Settle]) -> list[str]:
    lines = [
        f"| profile | C batching off (req/s) | C plan (req/s) | GPUs at {FIGURES_RPS:,.0f} req/s: off / plan "
        "| stated |",
        "|---|---:|---:|---:|---:|",
    ]
    for f in figures:
        off, plan = f.gpus
        stated = "" if f.shape.stated_gpus is None else "{} / {}".format(*f.shape.stated_gpus)
        lines.append(
            f"| {f.shape.title} | {f.off_capacity_rps:.4g} | {f.plan_capacity_rps:.4g} | {off} / {plan} | {stated} |"
        )
    lines += ["", f"Batching off behind the HPA at 80 % on the large fixed cost at a constant {FIGURES_RPS:,.0f} "
              "req/s (stated: it settles at about 25 replicas that each miss the SLA):", ""]  # fmt: skip
    for s in settles:
        verdict = "misses" if s.p99_ms[0] > s.budget_ms else ("meets" if s.p99_ms[1] <= s.budget_ms else "mixed")
        lines.append(
            f"- {s.balancing} routing: settles at {', '.join(map(str, s.replicas))} replicas; p99 per tick "
            f"{s.p99_ms[0]:.0f} to {s.p99_ms[1]:.0f} ms against T = {s.budget_ms:g} ms ({verdict}); "
            f"{s.attainment:.2%} of requests within it"
        )
    return lines


def _length(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min"


def markdown_lines(
    results: list[tuple[Shape, Comparison]], figures: list[Figures], settles: list[Settle], day_s: float
) -> list[str]:
    """The report's leading section (markdown lines)."""
    lines = [
        "## End to end: batchfill against what teams run today",
        "",
        f"Each profile serves one compressed diurnal day ({_length(day_s)}, Poisson, mean {MEAN_RPS:g} req/s, "
        "peak/trough 5; the last row: 4,000 req/s over half the length) under batchfill and under the "
        "configurations teams run today: Triton without "
        "`dynamic_batching` (batching-off), `dynamic_batching {}` with Triton's defaults (triton-default: no delay, "
        "the model's max batch) and the seed rule `D = S - l(B) - N` with `preferred_batch_size: [B]` "
        "(seed-rule), each behind the HPA on GPU utilization at 80 %, at the target that is cheapest for that "
        f"configuration while it keeps {SLO_TARGET:.1%} of requests within the SLA (`hpa-gpu@best`, a bisection "
        "over 30...95 % in steps of 5 on the same day), and behind static peak provisioning with the "
        "configuration's own capacity at SLA. KEDA on request rate at u·C (batchfill's capacity) is the best "
        "tuned competitor. Requests are routed at random per request (kube-proxy), so each replica's share stays "
        "Poisson. The seed rule is simulated with the pending batch growing while the instance is busy; the "
        "real Triton 2.51 does worse with a sparse preferred list (last section), so the saving against it is "
        "a lower bound.",
        "",
        *summary_table(results),
        "",
        "Cheapest within SLO: the configuration's run (HPA at 80 %, at its best target, or static peak) with the "
        f"fewest GPU-hours among those that keep {SLO_TARGET:.1%} of requests within the SLA, and its GPU-hours "
        "over batchfill's.",
        "",
    ]
    for shape, c in results:
        lines += [f"### {shape.title}", "", profile_text(shape) + ".", ""]
        lines += [f"- {t}" for t in configurations_text(c)]
        lines += ["", end_to_end_markdown(c), "", END_TO_END_LEGEND + ".", "", note(c), ""]
    lines += ["### The figures the case rests on, on this simulator", ""]
    lines += figures_lines(figures, settles)
    lines += [
        "",
        "The large fixed cost needs one GPU more with batching off than stated: the planner's capacity search "
        "(12,000 requests per probe, confirmed on 40,000) stops on the safe side of the long-run figure; on 2 "
        "million simulated requests one replica keeps its p99 within 140 ms up to about 34 req/s, which needs 30 "
        "GPUs. Under "
        "round robin each replica gets every n-th request, so a fleet of many small replicas queues far less "
        "than Poisson traffic would make it; the HPA's count is the same, its replicas then meet the SLA.",
        "",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 20-minute day (for a smoke run)")
    args = parser.parse_args()
    out = Console(soft_wrap=True, width=140)
    _, figures, settles, _ = run(args.quick, out)
    for line in figures_lines(figures, settles):
        out.print(line, highlight=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
