"""`batchfill profile`: measure a live model, print a `profile:` ready to paste and the plan it gives.

The measuring is :mod:`batchfill.adapters.profiler`; this module builds the BatchedModel document (from a file
the user gives, or from the model's metadata and the SLA flags), prints it and plans it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from batchfill.adapters.profiler import (
    ModelInfo,
    ProfileError,
    SizeMeasurement,
    connect,
    default_batch_sizes,
    input_maker,
    measure,
    read_model_info,
)
from batchfill.api.validate import load_model
from batchfill.policy.plan import plan_batching

#: Default quantile of the executions that becomes the profile value.
DEFAULT_QUANTILE = 0.9
_DNS1123 = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class ProfileOptions:
    """What `batchfill profile` measures and how (see the CLI help)."""

    url: str
    model: str
    version: str = ""
    batch_sizes: tuple[int, ...] = ()
    warmup: int = 5
    repeats: int = 30
    quantile: float = DEFAULT_QUANTILE
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    latency_p99_ms: float | None = None
    network_overhead_ms: float = 0.0
    base_document: dict[str, Any] | None = None
    seed: int = 0


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=d1,d2`` -> (name, dims).

    Raises:
        ValueError: naming the text when it is not ``NAME=`` followed by positive integers.
    """
    name, sep, dims = text.partition("=")
    try:
        values = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
    except ValueError:
        values = (-1,)
    if not sep or not name or not values or any(d < 1 for d in values):
        raise ValueError(f"--shape {text!r} must be NAME=d1,d2,... with positive integer dims")
    return name, values


def profile_points(measured: list[SizeMeasurement], quantile: float) -> list[dict[str, Any]]:
    """``spec.profile`` entries: the ``quantile`` of each size's executions, ms, 3 decimals (at least 0.001)."""
    return [{"batchSize": m.batch_size, "latencyMs": max(0.001, round(m.quantile_ms(quantile), 3))} for m in measured]


def document_for(info: ModelInfo, points: list[dict[str, Any]], opts: ProfileOptions) -> dict[str, Any]:
    """The BatchedModel document: the user's with the measured profile, or one built from the metadata."""
    if opts.base_document is not None:
        doc = dict(opts.base_document)
        doc["spec"] = {**doc.get("spec", {}), "profile": points}
        return doc
    model: dict[str, Any] = {"name": info.name}
    if info.platform and info.platform not in ("python", info.backend):
        model["platform"] = info.platform
    else:
        model["backend"] = info.backend or info.platform
    model["inputs"] = [{"name": t.name, "dataType": t.config_type, "dims": list(t.dims)} for t in info.inputs]
    model["outputs"] = [{"name": t.name, "dataType": t.config_type, "dims": list(t.dims)} for t in info.outputs]
    spec: dict[str, Any] = {"model": model}
    if opts.latency_p99_ms is not None:
        spec["sla"] = {"latencyP99Ms": opts.latency_p99_ms, "networkOverheadMs": opts.network_overhead_ms}
    spec["profile"] = points
    if info.max_batch_size > 0:
        spec["batching"] = {"maxBatchSize": info.max_batch_size}
    name = _DNS1123.sub("-", info.name.lower()).strip("-")[:63] or "model"
    return {"apiVersion": "batchfill.io/v1alpha1", "kind": "BatchedModel", "metadata": {"name": name}, "spec": spec}


def run_profile(opts: ProfileOptions, out: Console, err: Console, *, output: str = "table") -> dict[str, Any]:
    """Measure, print, plan. Returns the BatchedModel document (or, without an SLA, ``{"profile": ...}``).

    Raises:
        ProfileError: server, model or input problems (one line, with the URL and model).
        SpecError: the resulting document does not validate or plan (field-named).
    """
    if not 0 < opts.quantile < 1:
        raise ProfileError(f"--quantile={opts.quantile} must be in (0, 1)")
    if opts.repeats < 1 or opts.warmup < 0:
        raise ProfileError(f"--repeats={opts.repeats} must be >= 1 and --warmup={opts.warmup} >= 0")
    client = connect(opts.url)
    try:
        info = read_model_info(client, opts.url, opts.model, opts.version)
        make = input_maker(info, opts.url, dict(opts.shapes), seed=opts.seed)
        sizes = list(opts.batch_sizes) or default_batch_sizes(info.max_batch_size)
        with Progress(
            TextColumn(f"profiling {info.name}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task("executions", total=len(sizes) * opts.repeats)
            measured = measure(
                client,
                info,
                make,
                sorted(set(sizes)),
                warmup=opts.warmup,
                repeats=opts.repeats,
                progress=lambda done, _total: bar.update(task, completed=done),
            )
    finally:
        client.close()
    points = profile_points(measured, opts.quantile)
    has_sla = opts.base_document is not None or opts.latency_p99_ms is not None
    doc = document_for(info, points, opts) if has_sla else {"profile": points}
    if output == "yaml":
        out.out(yaml.safe_dump(doc, sort_keys=False), end="", highlight=False)
    else:
        _table(out, info, measured, opts)
        out.out(yaml.safe_dump(doc, sort_keys=False), end="", highlight=False)
    if has_sla:
        bm = load_model(doc)
        plan = plan_batching(bm.spec, seed=opts.seed).to_status()
        line = (
            f"plan: max_batch_size {plan.maxBatchSize}, preferred {plan.preferredBatchSizes}, "
            f"max_queue_delay_microseconds {plan.maxQueueDelayMicroseconds}, capacity at SLA "
            f"{plan.capacityPerReplicaRps:g} req/s per replica, predicted p99 {plan.predictedP99Ms:g} ms "
            f"<= T {plan.serverBudgetMs:g} ms"
        )
        (err if output == "yaml" else out).print(line, highlight=False, markup=False)
    elif output != "yaml":
        out.print("pass --latency-p99-ms (or -f a BatchedModel) to see the plan this profile gives", style="dim")
    return doc


def _table(out: Console, info: ModelInfo, measured: list[SizeMeasurement], opts: ProfileOptions) -> None:
    q = f"p{opts.quantile * 100:g}"
    t = Table(title=f"{info.name} on {opts.url}: execution latency per batch size (Triton statistics)")
    for col in ("batch size", "executions", "p50 ms", f"{q} ms (profile)", "p99 ms", "p99/p50"):
        t.add_column(col, justify="right")
    for m in measured:
        p50, p99 = m.quantile_ms(0.5), m.quantile_ms(0.99)
        t.add_row(
            str(m.batch_size),
            str(len(m.executions_ms)),
            f"{p50:.3f}",
            f"{m.quantile_ms(opts.quantile):.3f}",
            f"{p99:.3f}",
            f"{p99 / p50:.2f}" if p50 > 0 else "-",
        )
    out.print(t)


__all__ = ["ProfileError", "ProfileOptions", "parse_shape", "run_profile"]
