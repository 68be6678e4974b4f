"""Load-proportional autoscaling on real parts: reaction times and replica-seconds against the lower bound.

Runs the ramp of tests/component/test_autoscaling_ramp.py (:mod:`batchfill.testbed.scaling_lab`: real
tritonservers with the sleep model, a real Prometheus, Poisson load ramping up, holding and ramping down, the
policy deciding every tick) and prints:

* per load step (the instants the offered load's need ``ceil(λ / (u·C))`` changes): time from the step to the
  scale decision and to Ready capacity (steps down: to the surplus servers being stopped);
* replica-seconds used (every server from its request to its stop: a starting or draining pod holds its GPU)
  against the load-proportional lower bound ``∫ λ(t) / C dt`` (no autoscaler on the same hardware can use less)
  and against ``∫ need(t) dt`` (an autoscaler at ``u·C`` per replica that reacted instantly);
* client and server p99 per phase against ``T``.

It writes a plot of load, replicas, the lower bound and p99 against ``T`` (``--plot``) and, with ``--json``,
the whole record. Prints figures; not a pass/fail test. About 4 minutes with the defaults.

Run: .venv/bin/python benchmarks/scaling_ramp.py [--plot benchmarks/out/scaling_ramp.png] [--json run.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from batchfill.api.spec import ScalingSpec
from batchfill.testbed.scaling_lab import (
    LabConfig,
    LabResult,
    RampShape,
    ScalingLab,
    SleepModel,
    TickRecord,
    ideal_replica_seconds,
    latency_windows,
    lower_bound_replica_seconds,
    phase_stats,
    reactions,
    replica_seconds,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PLOT = ROOT / "benchmarks" / "out" / "scaling_ramp.png"
P99_WINDOW_S = 5.0


def _s(x: float | None, digits: int = 1, unit: str = "") -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}{unit}"


def config_from(args: argparse.Namespace) -> LabConfig:
    defaults = LabConfig()
    ramp = RampShape(
        base=args.base,
        peak=args.peak,
        low=args.low,
        warm_s=args.warm,
        up_s=args.up,
        hold_s=args.hold,
        down_s=args.down,
        low_s=args.low_s,
    )
    scaling = ScalingSpec(
        minReplicas=args.min_replicas,
        maxReplicas=args.max_replicas,
        targetUtilization=args.target_utilization,
        scaleDownStabilizationSeconds=args.stabilization,
    )
    return LabConfig(
        model=SleepModel(alpha_ms=args.alpha, beta_ms=args.beta),
        sla_p99_ms=args.sla,
        network_overhead_ms=args.overhead,
        scaling=scaling,
        ramp=ramp,
        window_s=args.window,
        tick_s=args.tick,
        scrape_s=defaults.scrape_s,
        seed=args.seed,
    )


def print_setup(console: Console, lab: ScalingLab) -> None:
    cfg, plan = lab.config, lab.plan
    unit = cfg.scaling.targetUtilization * plan.capacityPerReplicaRps
    t = Table(title="Setup")
    t.add_column("item")
    t.add_column("value")
    rows = [
        ("sleep model", f"{cfg.model.alpha_ms:g} + {cfg.model.beta_ms:g}·b ms per batch (Python backend, KIND_CPU)"),
        ("SLA", f"p99 {cfg.sla_p99_ms:g} ms, overhead {cfg.network_overhead_ms:g} ms: T = {plan.serverBudgetMs:g} ms"),
        (
            "plan",
            f"B = {plan.maxBatchSize}, D = {plan.maxQueueDelayMicroseconds} µs, C = {plan.capacityPerReplicaRps}"
            f" rps/replica, fill at target {plan.batchFillAtTarget}",
        ),
        (
            "scaling",
            f"u = {cfg.scaling.targetUtilization:g} (u·C = {unit:.1f} rps), replicas "
            f"{cfg.scaling.minReplicas}..{cfg.scaling.maxReplicas}, stabilization "
            f"{cfg.scaling.scaleDownStabilizationSeconds} s",
        ),
        ("loop", f"tick {cfg.tick_s:g} s, signal window {cfg.window_s:g} s, scrape {cfg.scrape_s:g} s"),
        (
            "load",
            ", ".join(
                f"{p.name} {p.end_s - p.start_s:g} s {p.rate_from:.0f}->{p.rate_to:.0f} rps"
                for p in lab.schedule.phases
            ),
        ),
        ("requests", f"{len(lab.arrivals)} Poisson arrivals (seed {cfg.seed})"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)


def print_reactions(console: Console, result: LabResult) -> None:
    t = Table(title="Reaction per load step (need = ceil(offered / (u·C)))")
    for col in ("step at s", "need", "offered rps", "decision after s", "deciding tick", "capacity after s"):
        t.add_column(col, justify="right" if col != "deciding tick" else "left")
    for r in reactions(result):
        trig = r.trigger
        why = "-" if trig is None else f"{trig.reason} (fill {_s(trig.batch_fill, 3)}, p99 {_s(trig.p99_ms)} ms)"
        t.add_row(
            _s(r.step.t),
            f"{r.step.old} -> {r.step.new}",
            _s(result.schedule.rate_at(r.step.t), 0),
            _s(r.to_decision_s),
            why,
            _s(r.to_capacity_s) + ("" if r.step.up else " (stopped)"),
        )
    console.print(t)


def print_cost(console: Console, result: LabResult) -> None:
    used = replica_seconds(result)
    bound = lower_bound_replica_seconds(result)
    ideal = ideal_replica_seconds(result)
    t = Table(title=f"Replica-seconds over the {result.duration_s:.0f} s ramp")
    for col in ("measure", "replica-seconds", "used / this"):
        t.add_column(col, justify="right" if col != "measure" else "left")
    t.add_row("used (request to stop of every server)", _s(used), "1.00")
    t.add_row("lower bound ∫ λ/C dt", _s(bound), _s(used / bound, 2))
    t.add_row(
        f"instant load-proportional ∫ need dt (u = {result.config.scaling.targetUtilization:g})",
        _s(ideal),
        _s(used / ideal, 2),
    )
    console.print(t)


def print_phases(console: Console, result: LabResult) -> None:
    t = Table(title=f"p99 per phase vs T = {result.server_budget_ms:g} ms (SLA {result.sla_ms:g} ms)")
    cols = (
        "phase",
        "s",
        "rps",
        "requests",
        "failed",
        "client p50",
        "client p99",
        "client max",
        "p99 / T",
        "server p99*",
        "replicas",
        "need",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "phase" else "right")
    for p, ph in zip(phase_stats(result), result.schedule.phases, strict=True):
        t.add_row(
            p.name,
            f"{p.t0:.0f}-{p.t1:.0f}",
            f"{ph.rate_from:.0f}->{ph.rate_to:.0f}",
            str(p.requests),
            str(p.failed),
            _s(p.client_p50_ms),
            _s(p.client_p99_ms),
            _s(p.client_max_ms),
            _s(p.client_p99_ms / result.server_budget_ms, 2),
            _s(p.server_p99_ms),
            _s(p.mean_replicas, 2),
            _s(p.mean_need, 2),
        )
    console.print(t)
    windows = [w for w in latency_windows(result, P99_WINDOW_S) if w.requests]
    over = [w for w in windows if w.p99_ms > result.server_budget_ms]
    console.print(
        f"* Triton's summary p99 at the phase's last tick (it covers the last 60 s). Client p99 per "
        f"{P99_WINDOW_S:g} s window: worst {max(w.p99_ms for w in windows):.1f} ms; {len(over)} of {len(windows)} "
        f"windows above T" + (f" (from {', '.join(f'{w.t0:.0f}' for w in over)} s)" if over else "")
    )
    console.print(
        f"{result.ok} requests ok, {result.failed} failed; load generator send lag p99 "
        f"{result.send_lag_p99_ms:.2f} ms; wall {result.wall_s:.0f} s + {result.setup_s:.1f} s setup"
    )


def plot(result: LabResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    end = result.duration_s
    grid = np.linspace(0, end, int(end * 10), endpoint=False)
    offered = np.array([result.schedule.rate_at(float(t)) for t in grid])
    current = np.array([result.current_at(float(t)) for t in grid])
    ready = np.array([result.ready_at(float(t)) for t in grid])
    need = np.array([result.need_at(float(t)) for t in grid])
    ticks: list[TickRecord] = result.ticks
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True, height_ratios=[3, 2])
    ax1.plot(grid, offered, color="tab:gray", lw=1.2, label="offered load (rps)")
    measured = [(k.t, k.request_rate_rps) for k in ticks if k.request_rate_rps is not None]
    if measured:
        ax1.plot(*zip(*measured, strict=True), color="tab:blue", lw=1, ls="--", label="measured rate (10 s window)")
    ax1.set_ylabel("requests/s")
    ax1b = ax1.twinx()
    ax1b.step(grid, current, where="post", color="tab:red", lw=2, label="replicas")
    ax1b.step(grid, ready, where="post", color="tab:orange", lw=1, ls=":", label="Ready replicas")
    ax1b.plot(grid, offered / result.capacity_rps, color="tab:green", lw=1.2, label="lower bound λ/C")
    ax1b.step(grid, need, where="post", color="tab:purple", lw=1, ls="--", label="need ⌈λ/(u·C)⌉")
    ax1b.set_ylabel("replicas")
    ax1b.set_ylim(0, result.config.scaling.maxReplicas + 0.5)
    lines = ax1.get_legend_handles_labels()
    lines_b = ax1b.get_legend_handles_labels()
    ax1.legend(lines[0] + lines_b[0], lines[1] + lines_b[1], loc="upper left", fontsize=8)
    used, bound = replica_seconds(result), lower_bound_replica_seconds(result)
    ax1.set_title(
        f"Load-proportional scaling on real Triton: {used:.0f} replica-s used vs lower bound {bound:.0f} "
        f"(ratio {used / bound:.2f})"
    )
    for r in reactions(result):
        if r.step.up:
            ax1.axvline(r.step.t, color="tab:purple", lw=0.6, alpha=0.5)
            ax2.axvline(r.step.t, color="tab:purple", lw=0.6, alpha=0.5)
    windows = latency_windows(result, P99_WINDOW_S)
    ax2.plot(
        [(w.t0 + w.t1) / 2 for w in windows],
        [w.p99_ms for w in windows],
        marker="o",
        ms=3,
        lw=1,
        color="tab:blue",
        label=f"client p99 per {P99_WINDOW_S:g} s",
    )
    server = [(k.t, k.p99_ms) for k in ticks if k.p99_ms is not None]
    if server:
        ax2.plot(*zip(*server, strict=True), color="tab:orange", lw=1, label="server p99 (Triton summary, 60 s)")
    ax2.axhline(result.server_budget_ms, color="tab:red", lw=1.2, ls="--", label=f"T = {result.server_budget_ms:g} ms")
    ax2.axhline(result.sla_ms, color="tab:red", lw=0.8, ls=":", label=f"SLA = {result.sla_ms:g} ms")
    ax2.set_ylabel("ms")
    ax2.set_xlabel("time since load start (s); purple lines: need steps up")
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    tmp.replace(path)


def main() -> None:
    d = LabConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    parser.add_argument("--json", type=Path, default=None, help="also write the whole record as JSON")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--alpha", type=float, default=d.model.alpha_ms, help="sleep model alpha, ms")
    parser.add_argument("--beta", type=float, default=d.model.beta_ms, help="sleep model beta, ms per sample")
    parser.add_argument("--sla", type=float, default=d.sla_p99_ms, help="SLA p99, ms")
    parser.add_argument("--overhead", type=float, default=d.network_overhead_ms, help="network overhead, ms")
    parser.add_argument("--target-utilization", type=float, default=d.scaling.targetUtilization)
    parser.add_argument("--min-replicas", type=int, default=d.scaling.minReplicas)
    parser.add_argument("--max-replicas", type=int, default=d.scaling.maxReplicas)
    parser.add_argument("--stabilization", type=int, default=d.scaling.scaleDownStabilizationSeconds)
    parser.add_argument("--window", type=float, default=d.window_s, help="signal window, s")
    parser.add_argument("--tick", type=float, default=d.tick_s, help="control loop period, s")
    r = d.ramp
    parser.add_argument("--base", type=float, default=r.base, help="warm load, units of u·C")
    parser.add_argument("--peak", type=float, default=r.peak, help="peak load, units of u·C")
    parser.add_argument("--low", type=float, default=r.low, help="final load, units of u·C")
    parser.add_argument("--warm", type=float, default=r.warm_s, help="seconds at the warm load")
    parser.add_argument("--up", type=float, default=r.up_s, help="seconds of the ramp up")
    parser.add_argument("--hold", type=float, default=r.hold_s, help="seconds at the peak")
    parser.add_argument("--down", type=float, default=r.down_s, help="seconds of the ramp down")
    parser.add_argument("--low-s", type=float, default=r.low_s, help="seconds at the final load")
    args = parser.parse_args()

    console = Console()

    def progress(k: TickRecord) -> None:
        if k.apply or round(k.t) % 20 == 0:
            console.print(
                f"[dim]t={k.t:6.1f} s offered {k.offered_rps:5.1f} rps measured {_s(k.request_rate_rps)} rps, "
                f"replicas {k.current} ({k.ready} Ready) -> {k.desired} {k.reason}, fill {_s(k.batch_fill, 3)}, "
                f"p99 {_s(k.p99_ms)} ms[/dim]"
            )

    lab = ScalingLab(config_from(args), progress=progress)
    print_setup(console, lab)
    t0 = time.monotonic()
    with console.status(f"running the {lab.schedule.duration_s:.0f} s ramp on real servers..."):
        result = lab.run()
    console.print(f"done in {time.monotonic() - t0:.0f} s")
    print_reactions(console, result)
    print_cost(console, result)
    print_phases(console, result)
    plot(result, args.plot)
    console.print(f"plot: {args.plot}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), allow_nan=False))
        console.print(f"record: {args.json}")


if __name__ == "__main__":
    main()
