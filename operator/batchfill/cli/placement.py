"""`batchfill plan --rate NAME=RPS ...`: several BatchedModels placed together on shared GPUs (policy.placement).

Prints which models share which GPU, each model's batching configuration and latency headroom, and the GPU count
against one model per GPU and against the fractional bound Σ λ / C; as a table, JSON or YAML (``-o``). Input is a
file of several documents or a folder of them (``*.yaml``, ``*.yml``, in name order); bad input exits 2 with one
line per problem.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from batchfill.api.documents import parse_documents
from batchfill.api.errors import Problem, SpecError
from batchfill.api.pool import POOL_KIND, GPUPool
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.validate import load_model, load_pool
from batchfill.cli.common import EXIT_OK, EXIT_USAGE, err_line, read_text
from batchfill.policy.placement import (
    DEFAULT_MODEL_MEMORY_MIB,
    DEFAULT_SERVER_OVERHEAD_MIB,
    ModelDemand,
    Placement,
    plan_placement,
)
from batchfill.sim.traces import MAX_RATE_RPS

#: Most model files a folder may hold (each file is bounded by api/documents.py; this bounds their number).
MAX_FOLDER_FILES = 2_000


def fleet_documents(path: str) -> list[tuple[str, Any]]:
    """(label, parsed document) for every document of the file, or of every ``*.yaml``/``*.yml`` of the folder in
    name order; the label names the file (and the document's position when a file holds several).

    Raises:
        OSError: unreadable file or folder.
        SpecError: YAML that does not parse (the file is named); a folder of more than :data:`MAX_FOLDER_FILES`.
    """
    folder = path != "-" and Path(path).is_dir()
    files = sorted(str(f) for f in Path(path).iterdir() if f.suffix in (".yaml", ".yml")) if folder else [path]
    if len(files) > MAX_FOLDER_FILES:
        raise SpecError(
            [Problem(path, f"holds {len(files):,} model files, over the {MAX_FOLDER_FILES:,} a folder may")]
        )
    out: list[tuple[str, Any]] = []
    for label in files:
        try:
            docs = parse_documents(read_text(label))
        except SpecError as e:
            raise SpecError([Problem(f"{label}: {q.path}", q.message) for q in e.problems]) from None
        out.extend((label + (f" (document {i + 1})" if len(docs) > 1 else ""), d) for i, d in enumerate(docs))
    return out


def split_pools(docs: list[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], list[tuple[str, GPUPool]], list[Problem]]:
    """The documents that are not GPUPools; the GPUPools that are valid; the problems of the others, each labelled
    with its file. A folder a team keeps in Git holds its pool beside its models: the pool is checked as the
    operator checks it (:func:`batchfill.api.validate.load_pool`), not refused as a BatchedModel that is not."""
    rest: list[tuple[str, Any]] = []
    pools: list[tuple[str, GPUPool]] = []
    problems: list[Problem] = []
    for label, doc in docs:
        if not (isinstance(doc, dict) and doc.get("kind") == POOL_KIND):
            rest.append((label, doc))
            continue
        try:
            pools.append((label, load_pool(doc)))
        except SpecError as e:
            problems += [Problem(f"{label}: {q.path}", q.message) for q in e.problems]
    return rest, pools, problems


def _pairs(values: list[str], flag: str, unit: str) -> tuple[dict[str, float], list[Problem]]:
    """``NAME=NUMBER`` flags as a mapping, and a problem for each malformed one."""
    out: dict[str, float] = {}
    problems: list[Problem] = []
    for v in values:
        name, sep, number = v.partition("=")
        try:
            x = float(number)
        except ValueError:
            x = math.nan
        if not sep or not name or not math.isfinite(x) or x < 0:
            problems.append(
                Problem(flag, f"{v!r} must be NAME={unit}: a model's name, '=', then a finite number, 0 or more")
            )
        else:
            out[name] = x
    return out, problems


def gpu_memory_problems(gpu_memory_mib: float) -> list[Problem]:
    """``--gpu-memory-mib``: finite and above what the Triton server itself holds, MiB."""
    if gpu_memory_mib > DEFAULT_SERVER_OVERHEAD_MIB and math.isfinite(gpu_memory_mib):
        return []
    why = f"={gpu_memory_mib:g} must be finite and over the server's own {DEFAULT_SERVER_OVERHEAD_MIB:g} MiB"
    return [Problem("--gpu-memory-mib", why)]


def memory_mib(name: str, spec: BatchedModelSpec, flags: dict[str, float]) -> float:
    """The GPU memory a model holds, MiB, in the operator's order (controller/pool_sync.py): ``--memory NAME=MIB``,
    else its ``spec.placement.memoryMiB``, else the default. A float whatever its source, so that ``-o json`` spells
    every figure alike."""
    return float(flags.get(name, spec.placement.memoryMiB or DEFAULT_MODEL_MEMORY_MIB))


def _rates(args: argparse.Namespace) -> tuple[dict[str, float], list[Problem]]:
    """--rates FILE (a YAML/JSON mapping name -> req/s) then --rate NAME=RPS flags (which win)."""
    rates: dict[str, float] = {}
    problems: list[Problem] = []
    if args.rates:
        try:
            docs = parse_documents(read_text(args.rates))  # bounded: size, aliases, nesting
        except OSError as e:
            return {}, [Problem("--rates", f"{args.rates}: cannot read a mapping of name to req/s: {e.strerror or e}")]
        except SpecError as e:
            return {}, [Problem("--rates", f"{args.rates}: {q}") for q in e.problems]
        if len(docs) != 1 or not isinstance(docs[0], dict):
            return {}, [Problem("--rates", f"{args.rates}: must hold one mapping of model name to req/s")]
        flags = []
        for k, v in docs[0].items():
            if isinstance(v, bool) or not isinstance(v, int | float):  # never rendered: a value may be any YAML
                problems.append(Problem("--rates", f"{args.rates}: {str(k)[:64]}: must be a number of req/s"))
            else:
                flags.append(f"{k}={v}")
        rates, bad = _pairs(flags, "--rates", "RPS")
        problems += bad
    more, bad = _pairs(args.rate or [], "--rate", "RPS")
    rates.update(more)
    problems += bad
    problems += [Problem("--rate", f"{n}={r:g} is over the {MAX_RATE_RPS:g} req/s a model may have")
                 for n, r in sorted(rates.items()) if r > MAX_RATE_RPS]  # fmt: skip
    return rates, problems


def to_json(p: Placement) -> dict[str, Any]:
    """The JSON shape of the placement (``-o json``): camelCase keys, ms, req/s, MiB."""
    return {
        "gpus": p.gpus,
        "dedicatedGpus": p.dedicated_gpus,
        "sharedGpus": len(p.shared),
        "oneModelPerGpu": p.one_model_per_gpu,
        "fractionalBound": round(p.fractional_bound, 3),
        "gpuMemoryMiB": p.gpu_memory_mib,
        "shared": [
            {
                "gpuId": s.gpu_id,
                "memoryMiB": s.memory_mib,
                "dutyCycleMs": None if math.isinf(s.duty_cycle_ms) else round(s.duty_cycle_ms, 3),
                "models": [
                    {"name": n, "rateRps": round(r, 3), "p99Ms": round(q, 2)}
                    for n, r, q in zip(s.tenants, s.rates_rps, s.p99_ms, strict=True)
                ],
            }
            for s in p.shared
        ],
        "models": [
            {
                "name": m.name,
                "rateRps": m.rate_rps,
                "designRateRps": round(m.design_rate_rps, 3),
                "capacityRps": round(m.capacity_rps, 3),
                "maxBatchSize": m.config.max_batch_size,
                "preferredBatchSizes": list(m.config.preferred_batch_sizes),
                "maxQueueDelayMicroseconds": m.config.max_queue_delay_us,
                "dedicatedGpus": m.dedicated_gpus,
                "sharedGpu": m.shared_gpu,
                "sharedRateRps": round(m.shared_rate_rps, 3),
                "p99Ms": round(m.p99_ms, 2),
                "targetMs": m.target_ms,
                "headroomMs": round(m.headroom_ms, 2),
                "memoryMiB": m.memory_mib,
            }
            for m in p.models
        ],
    }


def _tables(console: Console, p: Placement) -> None:
    gpus = Table(title="GPUs (each model's req/s on it; p99 in ms)", header_style="bold")
    for col in ("GPU", "models", "p99", "memory (MiB)", "Nexus d (ms)"):
        gpus.add_column(col, justify="left" if col.startswith("models") else "right")
    for m in p.models:
        if m.dedicated_gpus:
            name = f"{m.name} ({m.capacity_rps:.1f} each)"
            gpus.add_row(f"{m.dedicated_gpus} dedicated", name, f"<= {m.config.p99_ms:.1f}", "", "")
    for s in p.shared:
        names = ", ".join(f"{n} ({r:.1f})" for n, r in zip(s.tenants, s.rates_rps, strict=True))
        d = "-" if math.isinf(s.duty_cycle_ms) else f"{s.duty_cycle_ms:.1f}"
        gpus.add_row(f"shared {s.gpu_id}", names, ", ".join(f"{q:.1f}" for q in s.p99_ms), f"{s.memory_mib:g}", d)
    console.print(gpus)
    models = Table(
        title="Models: rate λ and capacity C in req/s, B max_batch_size, D max_queue_delay (µs), ded. its dedicated "
        "GPUs, shared the shared GPU it is on (-: none), latencies in ms",
        header_style="bold",
    )
    heads = ("model", "λ", "C", "B", "D", "ded.", "shared", "p99", "target", "headroom")
    for col in heads:
        models.add_column(col, justify="left" if col == "model" else "right")
    for m in p.models:
        models.add_row(
            m.name,
            f"{m.rate_rps:g}",
            f"{m.capacity_rps:.1f}",
            str(m.config.max_batch_size),
            str(m.config.max_queue_delay_us),
            str(m.dedicated_gpus),
            "-" if m.shared_gpu is None else str(m.shared_gpu),
            f"{m.p99_ms:.1f}",
            f"{m.target_ms:g}",
            f"{m.headroom_ms:.1f}",
        )
    console.print(models)
    saved = 1 - p.gpus / p.one_model_per_gpu if p.one_model_per_gpu else 0.0
    ratio = f"{p.gpus / p.fractional_bound:.2f}x" if p.fractional_bound > 0 else "-"
    console.print(
        f"{p.gpus} GPUs ({p.dedicated_gpus} dedicated, {len(p.shared)} shared) vs {p.one_model_per_gpu} with one "
        f"model per GPU ({saved:.0%} fewer); fractional bound Σ λ/C = {p.fractional_bound:.2f} ({ratio})",
        highlight=False,
    )


def _demands(
    docs: list[tuple[str, Any]], rates: dict[str, float], memory: dict[str, float]
) -> tuple[list[ModelDemand], set[str], list[Problem]]:
    """Each valid document as a demand with its rate and memory figure; the names seen; what is wrong."""
    demands: list[ModelDemand] = []
    names: set[str] = set()
    problems: list[Problem] = []
    for label, doc in docs:
        try:
            bm = load_model(doc)
        except SpecError as e:
            problems += [Problem(f"{label}: {q.path}", q.message) for q in e.problems]
            continue
        name = bm.metadata.name
        if name in names:
            problems.append(Problem(f"{label}: metadata.name", f"={name!r} appears twice: names must be unique"))
            continue
        names.add(name)
        if name not in rates:
            problems.append(Problem(f"{label}: {name}", "has no rate: give --rate NAME=RPS or list it in --rates"))
            continue
        demands.append(ModelDemand(name, bm.spec, rates[name], memory_mib(name, bm.spec, memory)))
    return demands, names, problems


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Place every document's model with its rate; exit 2 on any bad input (nothing is placed then)."""
    try:
        docs = fleet_documents(args.file)
    except OSError as e:
        err_line(err, f"{args.file}: cannot read: {e.strerror or e}")
        return EXIT_USAGE
    except SpecError as e:
        for q in e.problems:
            err_line(err, str(q))
        return EXIT_USAGE
    docs, _, problems = split_pools(docs)
    rates, bad = _rates(args)
    problems += bad
    memory, bad = _pairs(args.memory or [], "--memory", "MiB")
    problems += bad
    demands, names, bad = _demands(docs, rates, memory)
    problems += bad
    problems += [Problem("--rate/--rates", f"{n}: no such model in {args.file}") for n in sorted(set(rates) - names)]
    problems += [Problem("--memory", f"{n}: no such model in {args.file}") for n in sorted(set(memory) - names)]
    problems += gpu_memory_problems(args.gpu_memory_mib)
    if not docs:
        problems.append(Problem(args.file, "no YAML documents"))
    if not problems:
        try:
            placement = plan_placement(demands, args.gpu_memory_mib, seed=args.seed)
        except SpecError as e:
            problems += e.problems
        except ValueError as e:  # the GPU memory does not exceed the server's overhead
            problems.append(Problem("--gpu-memory-mib", str(e)))
    if problems:
        for q in problems:
            err_line(err, str(q))
        return EXIT_USAGE
    if args.output == "json":
        print(json.dumps(to_json(placement), indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(to_json(placement), sort_keys=False), end="")
    else:
        _tables(out, placement)
    return EXIT_OK
