"""`batchfill simulate --fleet FILE_OR_FOLDER`: several BatchedModels on shared GPUs over time, re-planned as rates
move (:func:`batchfill.compare.shared_fleet.replan_fleet`).

Input: the models as `batchfill plan --rate` reads them (:func:`batchfill.cli.placement.fleet_documents`: a file of
several documents or a folder of them), and per-model rates: ``--rates FILE``, a YAML/JSON mapping of model name to
a list of req/s, one per minute, or ``--fleet-trace diurnal`` (the default), each model at ``--mean-rps`` (default
half its capacity at SLA) with its own seeded phase. Each ``--replan-minutes`` period is planned on the previous
period's mean rates (the first on its own) and served at its own. Prints GPU-hours of the shared placement, of one
model per GPU and of the fractional bound, each model's SLO attainment (the worst named) and the moves; ``--json``
writes the figures. Bad input exits 2 with one line per problem, each naming its flag or field.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from batchfill.api.documents import parse_documents
from batchfill.api.errors import Problem, SpecError
from batchfill.api.validate import load_model
from batchfill.cli.common import EXIT_OK, EXIT_USAGE, err_line, read_text
from batchfill.cli.placement import _pairs, fleet_documents, gpu_memory_problems, memory_mib, split_pools
from batchfill.cli.simulate import _wide, parse_duration
from batchfill.compare.shared_fleet import FleetModels, FleetRun, attainment, diurnal_rates, replan_fleet
from batchfill.policy.plan import plan_batching
from batchfill.sim.traces import MAX_RATE_RPS, MAX_TRACE_REQUESTS

#: Most models one fleet simulation takes (a file holds at most 100 documents: api/documents.py).
MAX_FLEET_MODELS = 100
#: Longest simulated span, s (a week), and most periods (a week of 5-minute periods): the work is periods x models.
MAX_DURATION_S = 7 * 86_400.0
MAX_PERIODS = 2016
#: Bounds of --replan-minutes (a minute to a day) and --sample-seconds (per period, after the warm-up).
REPLAN_MINUTES = (1.0, 1440.0)
MAX_SAMPLE_S = 600.0
#: Log-normal noise of the generated rates per period and model (log-σ), as benchmarks/fleet_shared.py uses.
NOISE_SIGMA = 0.1
#: Default mean rate of a generated trace, as a fraction of each model's capacity at SLA alone on a GPU.
DEFAULT_MEAN_FRACTION = 0.5


def _models(path: str, memory: dict[str, float]) -> tuple[FleetModels | None, list[Problem]]:
    """The fleet's models (each planned alone), or the problems of every document."""
    try:
        docs = fleet_documents(path)
    except OSError as e:
        return None, [Problem(path, f"cannot read: {e.strerror or e}")]
    except SpecError as e:
        return None, list(e.problems)
    docs, _, problems = split_pools(docs)
    problems += [] if docs else [Problem(path, "no YAML documents")]
    specs, plans = {}, {}
    for label, doc in docs:
        try:
            bm = load_model(doc)
            name = bm.metadata.name
            if name in specs:
                problems.append(Problem(f"{label}: metadata.name", f"={name!r} appears twice: names must be unique"))
                continue
            plans[name] = plan_batching(bm.spec)
            specs[name] = bm.spec
        except SpecError as e:
            problems += [Problem(f"{label}: {q.path}", q.message) for q in e.problems]
    if len(specs) > MAX_FLEET_MODELS:
        problems.append(Problem(path, f"holds {len(specs)} models, over the {MAX_FLEET_MODELS} a fleet may"))
    problems += [Problem("--memory", f"{n}: no such model in {path}") for n in sorted(set(memory) - set(specs))]
    if problems:
        return None, problems
    names = tuple(specs)
    return FleetModels(names, specs, plans, {n: memory_mib(n, specs[n], memory) for n in names}), []


def _series(path: str, names: tuple[str, ...]) -> tuple[dict[str, list[float]], list[Problem]]:
    """``--rates FILE``: per model its req/s per minute."""
    try:
        docs = parse_documents(read_text(path))
    except OSError as e:
        return {}, [Problem("--rates", f"{path}: cannot read: {e.strerror or e}")]
    except SpecError as e:
        return {}, [Problem(f"--rates {path}: {q.path}", q.message) for q in e.problems]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        return {}, [Problem("--rates", f"{path}: must hold one mapping of model name to a list of req/s per minute")]
    out: dict[str, list[float]] = {}
    problems: list[Problem] = []
    for name, values in docs[0].items():
        where = f"--rates {path}: {name}"
        if name not in names:
            problems.append(Problem(where, "no such model in the fleet"))
        elif not isinstance(values, list) or not values:
            problems.append(Problem(where, "must be a non-empty list of req/s, one per minute"))
        else:
            bad = [i for i, v in enumerate(values) if not _rate_ok(v)]
            if bad:
                problems.append(Problem(f"{where}[{bad[0]}]", f"={values[bad[0]]!r} must be a req/s in [0, 1e7]"))
            else:
                out[name] = [float(v) for v in values]
    problems += [Problem(f"--rates {path}", f"{n}: has no rates") for n in names if n not in docs[0]]
    return out, problems


def _rate_ok(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_RATE_RPS


def _period_means(series: dict[str, list[float]], names: tuple[str, ...], periods: int, minutes: float) -> Any:
    """[period, model] mean req/s of the minutes each period spans (a period of a fraction of a minute takes the
    minute it starts in)."""
    out = np.empty((periods, len(names)))
    for j, n in enumerate(names):
        s = np.asarray(series[n])
        for k in range(periods):
            lo = int(k * minutes)
            out[k, j] = s[lo : max(lo + 1, int((k + 1) * minutes))].mean()
    return out


def _check_numbers(args: argparse.Namespace, duration_s: float | None) -> list[Problem]:
    problems = []
    lo, hi = REPLAN_MINUTES
    if not lo <= args.replan_minutes <= hi:
        problems.append(Problem("--replan-minutes", f"={args.replan_minutes:g} must be in [{lo:g}, {hi:g}] minutes"))
    if not 0 < args.sample_seconds <= MAX_SAMPLE_S:
        problems.append(Problem("--sample-seconds", f"={args.sample_seconds:g} must be in (0, {MAX_SAMPLE_S:g}] s"))
    if args.mean_rps is not None and not 0 < args.mean_rps <= MAX_RATE_RPS:
        problems.append(Problem("--mean-rps", f"={args.mean_rps:g} must be a req/s in (0, 1e7]"))
    if not 1 <= args.peak_to_trough < math.inf:
        problems.append(Problem("--peak-to-trough", f"={args.peak_to_trough:g} must be finite and >= 1"))
    if args.seed < 0:
        problems.append(Problem("--seed", f"={args.seed} must be >= 0"))
    if args.fleet_trace and args.rates:
        problems.append(Problem("--fleet-trace", f"={args.fleet_trace} and --rates both give the rates: choose one"))
    problems += gpu_memory_problems(args.gpu_memory_mib)
    if duration_s is not None and duration_s > MAX_DURATION_S:
        problems.append(Problem("--duration", f"={args.duration} is over the {MAX_DURATION_S / 86400:g} days allowed"))
    return problems


def _check_requests(true_rps: Any, sample_s: float) -> list[Problem]:
    """The run's simulated requests are bounded like ``batchfill simulate``'s (both placements serve each period's
    sample; the warm-up is a fixed few seconds more)."""
    total = 2.0 * float(np.sum(true_rps)) * sample_s
    if total <= MAX_TRACE_REQUESTS:
        return []
    why = (f"the fleet's rates make about {total:.3g} simulated requests (both placements, {sample_s:g} s per period), "
           f"over the {MAX_TRACE_REQUESTS:.0e} a simulation takes: lower the rates or --sample-seconds")  # fmt: skip
    return [Problem("--sample-seconds", why)]


def _rates(
    args: argparse.Namespace, fleet: FleetModels, duration_s: float | None
) -> tuple[Any, float, str, list[Problem]]:
    """([period, model] true req/s, duration s, trace description, problems)."""
    period_s = args.replan_minutes * 60.0
    if args.rates:
        series, problems = _series(args.rates, fleet.names)
        if problems:
            return None, 0.0, "", problems
        shortest = min(len(series[n]) for n in fleet.names) * 60.0
        duration = duration_s if duration_s is not None else shortest
        if duration > shortest:
            why = f"={args.duration} is longer than --rates' {shortest / 60:g} min"
            return None, 0.0, "", [Problem("--duration", why)]
    else:
        duration = duration_s if duration_s is not None else 86_400.0
    periods = duration / period_s
    if abs(periods - round(periods)) > 1e-9 or round(periods) < 1:
        why = f"={duration / 60:g} min must be a whole number (>= 1) of --replan-minutes={args.replan_minutes:g}"
        return None, 0.0, "", [Problem("--duration", why)]
    if round(periods) > MAX_PERIODS:
        why = f"={args.replan_minutes:g} makes {round(periods)} periods of the duration, over the {MAX_PERIODS} allowed"
        return None, 0.0, "", [Problem("--replan-minutes", why)]
    n = round(periods)
    if args.rates:
        return _period_means(series, fleet.names, n, args.replan_minutes), duration, f"rates from {args.rates}", []
    capacity = [fleet.plans[m].chosen.capacity_rps for m in fleet.names]
    mean = [args.mean_rps or DEFAULT_MEAN_FRACTION * c for c in capacity]
    rates = diurnal_rates(
        mean, n, period_s, peak_to_trough=args.peak_to_trough, noise_sigma=NOISE_SIGMA,
        rng=np.random.default_rng(args.seed),
    )  # fmt: skip
    what = f"diurnal (peak/trough {args.peak_to_trough:g}, a seeded phase per model, noise σ {NOISE_SIGMA:g})"
    return rates, duration, f"{what}, seed {args.seed}", []


def fleet_json(run: FleetRun, fleet: FleetModels, true_rps: Any, duration_s: float, trace: str) -> dict[str, Any]:
    """The figures as a JSON-ready dict: GPU-hours, SLO attainment (fractions), moves, per period and per model."""
    shared, single, bound = run.gpu_hours()
    att = {k: attainment(v) for k, v in (("shared", run.attainment_shared), ("single", run.attainment_single))}
    moves = sum(run.moves)

    def frac(c: list[float]) -> float:
        return c[1] / c[0] if c[0] else 1.0

    return {
        "trace": trace,
        "durationSeconds": duration_s,
        "replanMinutes": run.period_h * 60,
        "models": list(fleet.names),
        "gpuHours": {"shared": shared, "oneModelPerGpu": single, "fractionalBound": round(bound, 6)},
        "sloAttainment": {
            key: {"allRequests": a, "worstModel": w, "worstModelName": who}
            for key, (a, w, who) in (("shared", att["shared"]), ("oneModelPerGpu", att["single"]))
        },
        "moves": moves,
        "movesPerDay": round(moves * 24 / (len(run.moves) * run.period_h), 6),
        "periods": [
            {
                "startSeconds": k * run.period_h * 3600,
                "sharedGpus": run.shared_gpus[k],
                "dedicatedGpus": run.dedicated_gpus[k],
                "oneModelPerGpuGpus": run.single_gpus[k],
                "fractionalBound": round(run.bound[k], 6),
                "moves": run.moves[k],
            }
            for k in range(len(run.moves))
        ],
        "perModel": [
            {
                "name": n,
                "meanRps": round(float(np.mean(true_rps[:, j])), 6),
                "sloAttainmentShared": frac(run.attainment_shared[n]),
                "sloAttainmentOneModelPerGpu": frac(run.attainment_single[n]),
            }
            for j, n in enumerate(fleet.names)
        ],
    }


def _print(doc: dict[str, Any], out: Console) -> None:
    d = doc["durationSeconds"]
    span = f"{d / 3600:g} h" if d >= 3600 else f"{d / 60:g} min"
    out.print(
        f"[bold]{len(doc['models'])} models on shared GPUs, {span} of {doc['trace']}, "
        f"re-planned every {doc['replanMinutes']:g} min[/bold]",
        highlight=False,
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(("placement", "GPU-hours", "x bound", "worst model in SLO", "all in SLO", "moves")):
        table.add_column(col, justify="left" if i == 0 else "right", no_wrap=True)
    g, a = doc["gpuHours"], doc["sloAttainment"]
    bound = g["fractionalBound"]
    for label, key, gkey, moves in (
        ("one model per GPU", "oneModelPerGpu", "oneModelPerGpu", "0"),
        ("shared (joint plan)", "shared", "shared", str(doc["moves"])),
    ):
        x = f"{g[gkey] / bound:.3f}" if bound > 0 else "-"
        s = a[key]
        worst = f"{s['worstModel']:.4%} ({s['worstModelName']})"
        table.add_row(label, f"{g[gkey]:.2f}", x, worst, f"{s['allRequests']:.4%}", moves)
    table.add_row("fractional bound Σ λ/C", f"{bound:.2f}", "1.000", "", "", "")
    _wide(out).print(table)
    out.print(
        "GPU-hours: GPUs held x period; in SLO: requests within the model's server budget (each period sampled "
        "after a warm-up); moves: models moved between shared GPUs by a re-plan",
        highlight=False,
        style="dim",
    )


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Simulate the fleet; exit 2 on any bad input (nothing is simulated then)."""
    try:
        duration_s = parse_duration(args.duration, "--duration") if args.duration else None
    except ValueError as e:
        err_line(err, str(e))
        return EXIT_USAGE
    memory, problems = _pairs(args.memory or [], "--memory", "MiB")
    problems += _check_numbers(args, duration_s)
    fleet, bad = _models(args.file, memory) if not problems else (None, [])
    problems += bad
    if fleet is not None and not problems:
        true, duration, trace, problems = _rates(args, fleet, duration_s)
        problems += [] if problems else _check_requests(true, args.sample_seconds)
    if problems or fleet is None:
        for q in problems:
            err_line(err, str(q))
        return EXIT_USAGE
    planned = np.vstack([true[:1], true[:-1]])
    try:
        with Progress(TextColumn("fleet"), BarColumn(), TextColumn("period {task.completed}/{task.total}"),
                      console=err, transient=True, disable=not err.is_terminal) as bar:  # fmt: skip
            task = bar.add_task("fleet", total=len(true))
            run = replan_fleet(
                fleet, true, planned, period_s=args.replan_minutes * 60.0, sample_s=args.sample_seconds,
                gpu_memory_mib=args.gpu_memory_mib, seed=args.seed,
                on_period=lambda k, _: bar.update(task, completed=k + 1),
            )  # fmt: skip
    except SpecError as e:  # a model whose memory does not fit a GPU
        for q in e.problems:
            err_line(err, str(q))
        return EXIT_USAGE
    doc = fleet_json(run, fleet, true, duration, trace)
    _print(doc, out)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        out.print(f"json: {path}", highlight=False)
    return EXIT_OK
