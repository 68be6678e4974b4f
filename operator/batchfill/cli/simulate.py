"""`batchfill simulate`: a BatchedModel against a trace under batchfill's policy and the baselines.

The edge of :mod:`batchfill.compare`: builds the trace from the options, shows a progress bar, prints the table
and the targets, writes the PNG (and optionally JSON). Everything it prints is computed by pure code.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from batchfill.api.errors import SpecError
from batchfill.api.spec import BatchedModelSpec
from batchfill.cli.common import EXIT_OK, EXIT_USAGE, TRACES, err_line, one_model
from batchfill.compare.report import (
    COLUMN_LEGEND,
    COLUMNS,
    END_TO_END_COLUMNS,
    END_TO_END_LEGEND,
    checks,
    configurations_text,
    end_to_end_rows,
    figure,
    rows,
    table_cells,
)
from batchfill.compare.run import (
    POLICIES,
    CompareError,
    Comparison,
    Options,
    check_policies,
    compare,
    expand_policies,
    prepare,
)
from batchfill.sim import traces

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, flag: str = "duration") -> float:
    """``90``, ``90s``, ``15m``, ``24h``, ``2d`` -> seconds.

    Raises:
        ValueError: for anything else, or a duration that is not positive; the message starts with ``flag``.
    """
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{flag} {text!r} is not a number with an optional unit s, m, h or d")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{flag} {text!r} must be positive")
    return seconds


@dataclass(frozen=True)
class TraceOptions:
    """How to build the trace. Rates in req/s, times in seconds; None: the trace's default."""

    kind: str = "diurnal"
    mean_rps: float | None = None
    duration_s: float | None = None
    peak_to_trough: float = 5.0
    cv: float = 4.0
    peak_rps: float | None = None
    start_s: float | None = None
    length_s: float | None = None
    rates_file: str | None = None
    seed: int = 0


def default_mean_rps(spec: BatchedModelSpec, capacity_rps: float) -> float:
    """40 % of ``maxReplicas · C``: a diurnal peak (2 x the mean at peak/trough 5) stays within maxReplicas."""
    return 0.4 * spec.scaling.maxReplicas * capacity_rps


#: Trace parameters -> the `batchfill simulate` flags that set them (error messages name the flag).
_FLAGS = {
    "mean_rps": "--mean-rps",
    "base_rps": "--mean-rps",
    "peak_rps": "--peak-rps",
    "cv": "--cv",
    "peak_to_trough": "--peak-to-trough",
    "duration_s": "--duration",
    "start_s": "--start",
    "length_s": "--length",
}


MAX_TRACE_REQUESTS = traces.MAX_TRACE_REQUESTS
#: Largest --rates file read: a year of per-minute 'minute,rps' lines is about 10 MB.
MAX_RATE_FILE_BYTES = 32 * 2**20


def build_trace(opts: TraceOptions, spec: BatchedModelSpec, capacity_rps: float) -> traces.Trace:
    """The trace the options describe.

    Raises:
        ValueError: bad parameters, an unreadable rate file (message names the flag), or a trace of more than
            :data:`MAX_TRACE_REQUESTS` expected arrivals.
    """
    try:
        trace = _build_trace(opts, spec, capacity_rps)
    except ValueError as e:
        text = str(e)
        name = text.split("=", 1)[0]
        raise ValueError(_FLAGS[name] + text[len(name) :] if name in _FLAGS else text) from None
    expected = trace.mean_rps * trace.duration_s
    if expected > MAX_TRACE_REQUESTS:
        raise ValueError(
            f"--mean-rps/--duration: the trace holds about {expected:.3g} requests ({trace.mean_rps:.4g} req/s for "
            f"{trace.duration_s:g} s), over the {MAX_TRACE_REQUESTS:.0e} a simulation takes: shorten --duration or "
            "lower the rate"
        )
    return trace


def _read_rate_file(path: str) -> str:
    with Path(path).open("rb") as f:
        data = f.read(MAX_RATE_FILE_BYTES + 1)
    if len(data) > MAX_RATE_FILE_BYTES:
        raise ValueError(f"is over the {MAX_RATE_FILE_BYTES // 2**20} MiB a rate file may have")
    return data.decode("utf-8")


def _build_trace(opts: TraceOptions, spec: BatchedModelSpec, capacity_rps: float) -> traces.Trace:
    mean = opts.mean_rps if opts.mean_rps is not None else default_mean_rps(spec, capacity_rps)
    if opts.kind == "diurnal":
        return traces.diurnal(
            mean, duration_s=opts.duration_s or 86_400.0, peak_to_trough=opts.peak_to_trough, seed=opts.seed
        )
    if opts.kind == "bursty":
        return traces.bursty(mean, cv=opts.cv, duration_s=opts.duration_s or 3600.0, seed=opts.seed)
    if opts.kind in ("spike", "step"):
        duration = opts.duration_s or 3600.0
        start = opts.start_s if opts.start_s is not None else duration / 3
        length = opts.length_s if opts.length_s is not None else (duration / 6 if opts.kind == "spike" else duration)
        peak = opts.peak_rps if opts.peak_rps is not None else 2.0 * mean  # within maxReplicas at the default mean
        return traces.spike(mean, peak, start_s=start, length_s=length, duration_s=duration, seed=opts.seed)
    if opts.kind == "replay":
        if not opts.rates_file:
            raise ValueError("--trace replay needs --rates FILE (one req/s value per minute, or 'minute,rps' lines)")
        try:
            text = _read_rate_file(opts.rates_file)
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--rates {opts.rates_file}: cannot read: {e}") from None
        except ValueError as e:
            raise ValueError(f"--rates {opts.rates_file}: {e}") from None
        try:
            rates = traces.parse_rate_file(text)
        except ValueError as e:
            raise ValueError(f"--rates {opts.rates_file}: {e}") from None
        return traces.replay(rates, seed=opts.seed, name=Path(opts.rates_file).stem)
    raise ValueError(f"--trace {opts.kind!r}: choose from {', '.join(TRACES)}")


def _wide(out: Console) -> Console:
    """``out``, or a console on the same file at least 120 columns wide (a pipe gets 80, too few for the tables)."""
    return out if out.width >= 120 else Console(file=out.file, width=120, soft_wrap=True, no_color=out.no_color)


def print_end_to_end(c: Comparison, out: Console) -> None:
    """The end-to-end table (batchfill against what teams run today), when ``c`` has baseline runs."""
    cells = end_to_end_rows(c)
    if not cells:
        return
    out.print("[bold]end to end: batchfill against what teams run today[/bold]", highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(END_TO_END_COLUMNS):
        table.add_column(col, justify="left" if i < 2 else "right")
    for row in cells:
        table.add_row(*row)
    _wide(out).print(table)
    out.print(END_TO_END_LEGEND, highlight=False, style="dim")
    for line in configurations_text(c):
        out.print(line, highlight=False, style="dim")


def print_comparison(c: Comparison, out: Console, *, targets: bool = True) -> None:
    """The end-to-end table when baselines ran, the plan line, the table and (``targets``) the cost benchmark's
    targets, which are set for a diurnal day."""
    print_end_to_end(c, out)
    st = c.setup
    need = math.ceil(c.peak_rps / st.capacity_rps - 1e-9)
    cap = st.spec.scaling.maxReplicas
    if need > cap:
        out.print(
            f"note: the peak minute ({c.peak_rps:.4g} req/s) needs {need} replicas at capacity; "
            f"spec.scaling.maxReplicas={cap} caps every autoscaler (static-peak is not capped)",
            style="yellow",
            highlight=False,
        )
    for b in c.baselines:
        need_b = math.ceil(c.peak_rps / b.capacity_rps - 1e-9) if b.capacity_rps > 0 else 0
        if need_b > cap:
            out.print(
                f"note: {b.batching.value} needs {need_b} replicas at capacity for the peak minute; "
                f"spec.scaling.maxReplicas={cap} caps its HPA runs (its static-peak is not capped)",
                style="yellow",
                highlight=False,
            )
    out.print(
        f"[bold]{c.trace_description}[/bold]\n"
        f"plan: max_batch_size {st.plan.maxBatchSize}, max_queue_delay {st.plan.maxQueueDelayMicroseconds} us, "
        f"capacity at SLA C = {st.capacity_rps:.4g} req/s per replica ({st.gpus_per_replica} GPU), "
        f"T = {st.plan.serverBudgetMs:g} ms; mean {c.mean_rps:.4g} req/s, peak minute {c.peak_rps:.4g} req/s\n"
        f"baseline targets: keda-rps {st.per_replica_target_rps:.4g} req/s per replica (u*C), keda-queue "
        f"{st.queue_ms_at_target:.3g} ms, hpa-gpu {c.options.hpa_gpu_target:.0%} (busy at u*C: "
        f"{st.gpu_busy_at_target:.0%}); start-up {c.options.startup_s:g} s, tick {c.options.tick_s:g} s",
        highlight=False,
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(COLUMNS):
        table.add_column(col, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows(c):
        table.add_row(*table_cells(row))
    _wide(out).print(table)
    out.print(COLUMN_LEGEND, highlight=False, style="dim")
    found = checks(c) if targets else []
    if found:
        out.print("targets of the cost benchmark (set for a diurnal day):", highlight=False)
    for check in found:
        mark = "[green]met[/green]" if check.met else "[red]missed[/red]"
        out.print(f"{mark}  {check.target}: {check.measured}", highlight=False)


def comparison_json(c: Comparison, *, targets: bool = True) -> dict[str, Any]:
    """The figures of ``c`` as a JSON-ready dict (``checks`` empty unless ``targets``: they are set for a
    diurnal day)."""
    return {
        "trace": c.trace_description,
        "durationSeconds": c.duration_s,
        "meanRps": c.mean_rps,
        "peakMinuteRps": c.peak_rps,
        "capacityPerReplicaRps": c.setup.capacity_rps,
        "serverBudgetMs": c.setup.plan.serverBudgetMs,
        "staticReplicas": c.static_replicas,
        "rows": [asdict(r) for r in rows(c)],
        "endToEnd": [dict(zip(END_TO_END_COLUMNS, row, strict=True)) for row in end_to_end_rows(c)],
        "bestTargets": c.best_targets,
        "balancing": c.options.balancing,
        "checks": [asdict(k) for k in checks(c)] if targets else [],
    }


def run_simulation(
    spec: BatchedModelSpec,
    trace_opts: TraceOptions,
    policies: list[str],
    options: Options,
    out: Console,
    err: Console,
    *,
    plot: Path | None,
    json_path: Path | None = None,
) -> Comparison:
    """Prepare, build the trace, run every policy with a progress bar, print, write the plot.

    Raises:
        CompareError, ValueError: bad spec, trace options or policy names (messages name them).
    """
    check_policies(policies)
    policies = expand_policies(policies)
    setup = prepare(spec, seed=options.seed)
    trace = build_trace(trace_opts, spec, setup.capacity_rps)
    with Progress(
        TextColumn("{task.description:>12}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% of {task.fields[span]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        tasks = {p: bar.add_task(p, total=trace.duration_s, span=f"{trace.duration_s / 3600:g} h") for p in policies}

        def progress(policy: str, t_s: float) -> None:
            bar.update(tasks[policy], completed=t_s)

        result = compare(spec, trace, policies, options, setup=setup, progress=progress)
        for task in tasks.values():
            bar.update(task, completed=trace.duration_s)
    print_comparison(result, out, targets=trace_opts.kind == "diurnal")
    if plot is not None:
        fig = figure(result)
        plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot, dpi=110)
        out.print(f"plot: {plot}", highlight=False)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(comparison_json(result, targets=trace_opts.kind == "diurnal"), indent=2) + "\n", encoding="utf-8"
        )
        out.print(f"json: {json_path}", highlight=False)
    return result


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """A BatchedModel against a trace under batchfill's policy and the baselines (fleet simulator)."""
    bm = one_model(args.file, "simulate", err)
    if isinstance(bm, int):
        return bm
    try:
        numbers = {"--mean-rps": args.mean_rps, "--peak-rps": args.peak_rps, "--startup": args.startup}
        for flag, value in numbers.items():
            if value is not None and not (value >= 0 and value != float("inf")):
                raise ValueError(f"{flag}={value} must be a finite number >= 0")
        if args.mean_rps is not None and args.mean_rps == 0:
            raise ValueError("--mean-rps=0 must be > 0 req/s")
        if not 0 < args.hpa_gpu_target <= 100:
            raise ValueError(f"--hpa-gpu-target={args.hpa_gpu_target} must be a percentage in (0, 100]")
        if args.seed < 0:
            raise ValueError(f"--seed={args.seed} must be >= 0")
        trace_opts = TraceOptions(
            kind=args.trace,
            mean_rps=args.mean_rps,
            duration_s=parse_duration(args.duration, "--duration") if args.duration else None,
            peak_to_trough=args.peak_to_trough,
            cv=args.cv,
            peak_rps=args.peak_rps,
            start_s=parse_duration(args.start, "--start") if args.start else None,
            length_s=parse_duration(args.length, "--length") if args.length else None,
            rates_file=args.rates,
            seed=args.seed,
        )
        options = Options(
            startup_s=args.startup,
            hpa_gpu_target=args.hpa_gpu_target / 100.0,
            seed=args.seed,
            balancing=args.balancing,
        )
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        run_simulation(
            bm.spec,
            trace_opts,
            policies,
            options,
            out,
            err,
            plot=None if args.plot == "" else Path(args.plot),
            json_path=Path(args.json) if args.json else None,
        )
    except SpecError as e:
        for p in e.problems:
            err_line(err, f"{args.file}: {p}")
        return EXIT_USAGE
    except (CompareError, ValueError) as e:
        err_line(err, f"{args.file}: {e}")
        return EXIT_USAGE
    return EXIT_OK


__all__ = [
    "POLICIES",
    "TRACES",
    "CompareError",
    "TraceOptions",
    "build_trace",
    "command",
    "parse_duration",
    "run_simulation",
]
