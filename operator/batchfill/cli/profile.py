"""`batchfill profile`: measure a live model, print a `profile:` ready to paste and the plan it gives.

The measuring is :mod:`batchfill.adapters.profiler`; this module builds the BatchedModel document (from a file
the user gives, or from the model's metadata and the SLA flags), prints it and plans it.

Everything that can be checked before measuring is: the flags (:func:`check_options`), then, once the server
has described the model, the batch sizes against its ``max_batch_size`` and the document the profile will go
into. Nothing is printed and nothing is sent to the model before all of that passed.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from batchfill.adapters.profiler import (
    ModelInfo,
    ProfileError,
    ProfileUsageError,
    SizeMeasurement,
    check_url,
    connect,
    default_batch_sizes,
    input_maker,
    measure,
    one_line,
    read_model_info,
)
from batchfill.api.documents import parse_documents
from batchfill.api.errors import SpecError
from batchfill.api.spec import API_VERSION, KIND, SLASpec
from batchfill.api.validate import load_model
from batchfill.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, err_line, input_error, read_text
from batchfill.policy.plan import plan_batching

#: Default quantile of the executions that becomes the profile value.
DEFAULT_QUANTILE = 0.9
_DNS1123 = re.compile(r"[^a-z0-9-]+")
_SLA_FLAGS = {"latencyP99Ms": "--latency-p99-ms", "networkOverheadMs": "--network-overhead-ms"}
#: Comment above a printed BatchedModel without ``spec.model.repository`` (Triton does not say where its files are).
NO_REPOSITORY_COMMENT = (
    "# spec.model.repository is not set: Triton does not report where its model files are. Add it (pvc, image or\n"
    "# uri) before applying this BatchedModel to a cluster; `batchfill plan` does not need it.\n"
)


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
    network_overhead_ms: float | None = None
    base_document: dict[str, Any] | None = None
    base_path: str = ""
    seed: int = 0


def check_options(opts: ProfileOptions) -> None:
    """The checks that need no server: counts, the quantile and the SLA flags (ms), and how they combine with -f.

    Raises:
        ProfileUsageError: naming the option and its value (the command line exits 2).
    """
    check_url(opts.url)
    if not 0 < opts.quantile < 1:
        raise ProfileUsageError(f"--quantile={opts.quantile} must be between 0 and 1, both excluded (e.g. 0.9 for p90)")
    if opts.repeats < 1:
        raise ProfileUsageError(f"--repeats={opts.repeats} must be >= 1 (measured executions per batch size)")
    if opts.warmup < 0:
        raise ProfileUsageError(f"--warmup={opts.warmup} must be >= 0 (unmeasured requests per batch size)")
    flags = {"--latency-p99-ms": opts.latency_p99_ms, "--network-overhead-ms": opts.network_overhead_ms}
    if opts.latency_p99_ms is not None and not 0 < opts.latency_p99_ms < math.inf:  # NaN too
        finite = "" if opts.latency_p99_ms <= 0 or math.isnan(opts.latency_p99_ms) else "a finite number "
        raise ProfileUsageError(f"--latency-p99-ms={opts.latency_p99_ms} must be {finite}> 0 ms")
    for flag, value in flags.items():
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ProfileUsageError(f"{flag}={value} must be a finite number >= 0 (ms)")
    given = [flag for flag, value in flags.items() if value is not None]
    if opts.base_document is not None and given:
        raise ProfileUsageError(
            f"{given[0]} cannot be combined with -f {opts.base_path or '(file)'}: the file's spec.sla is used; "
            "change it there"
        )
    if opts.base_document is not None:
        name = ((opts.base_document.get("spec") or {}).get("model") or {}).get("name")
        if name != opts.model:
            raise ProfileUsageError(f"-f {opts.base_path or '(file)'}: spec.model.name={name} but --model {opts.model}")
        return
    if opts.network_overhead_ms is not None and opts.latency_p99_ms is None:
        raise ProfileUsageError(
            f"--network-overhead-ms={opts.network_overhead_ms} needs --latency-p99-ms (the SLA it is part of)"
        )
    if opts.latency_p99_ms is not None:
        if (opts.network_overhead_ms or 0.0) >= opts.latency_p99_ms:
            raise ProfileUsageError(
                f"--network-overhead-ms={opts.network_overhead_ms} must be less than "
                f"--latency-p99-ms={opts.latency_p99_ms}: Triton's budget is the difference (ms)"
            )
        try:  # the bounds of spec.sla itself (e.g. at most an hour)
            SLASpec(latencyP99Ms=opts.latency_p99_ms, networkOverheadMs=opts.network_overhead_ms or 0.0)
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            flag = _SLA_FLAGS.get(str(first["loc"][0]) if first["loc"] else "", "--latency-p99-ms")
            value = opts.network_overhead_ms if flag == "--network-overhead-ms" else opts.latency_p99_ms
            raise ProfileUsageError(f"{flag}={value}: {first['msg']} (ms)") from None


def batch_sizes_for(info: ModelInfo, opts: ProfileOptions) -> tuple[list[int], str | None]:
    """The batch sizes to measure, increasing, and a note for the user (or None).

    ``--batch-sizes`` are measured as given; without them, the powers of two up to the server's
    ``max_batch_size`` and that maximum. The note lists the batch sizes of the -f file's ``spec.profile`` above
    that maximum, which the measured profile replaces without measuring them.

    Raises:
        ProfileUsageError: a requested batch size above the model's ``max_batch_size`` on the server (1 for a
            model without batching), naming ``--batch-sizes`` and the numbers.
    """
    cap = max(1, info.max_batch_size)
    where = f"{info.name!r} on {opts.url}"
    if opts.batch_sizes:
        sizes = sorted(set(opts.batch_sizes))
        above = [b for b in sizes if b > cap]
        if above:
            if info.max_batch_size <= 0:
                raise ProfileUsageError(
                    f"--batch-sizes {_sizes(above)}: model {where} does not batch (max_batch_size=0), so every "
                    "request holds one sample: the only batch size is 1"
                )
            verb = "exceeds" if len(above) == 1 else "exceed"
            raise ProfileUsageError(
                f"--batch-sizes {_sizes(above)} {verb} the max_batch_size={info.max_batch_size} of model {where}"
            )
        return sizes, None
    sizes = default_batch_sizes(info.max_batch_size)
    note = None
    if opts.base_document is not None:
        profile = (opts.base_document.get("spec") or {}).get("profile") or []
        dropped = sorted({int(p["batchSize"]) for p in profile if int(p["batchSize"]) > cap})
        if dropped:
            what = f"batch size {dropped[0]} is" if len(dropped) == 1 else f"batch sizes {_sizes(dropped)} are"
            note = (
                f"note: -f {opts.base_path or '(file)'}: spec.profile {what} above the max_batch_size="
                f"{info.max_batch_size} of model {where}; the measured profile replaces the file's and stops at {cap}"
            )
    return sizes, note


def _sizes(sizes: Any) -> str:
    return ",".join(str(b) for b in sizes)


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
        spec["sla"] = {"latencyP99Ms": opts.latency_p99_ms, "networkOverheadMs": opts.network_overhead_ms or 0.0}
    spec["profile"] = points
    # 0 too: without it the plan would batch the model (max_batch_size >= 1 adds a batch dimension to every input)
    spec["batching"] = {"maxBatchSize": max(0, info.max_batch_size)}
    name = _DNS1123.sub("-", info.name.lower()).strip("-")[:63] or "model"
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def check_file_matches(info: ModelInfo, opts: ProfileOptions) -> None:
    """The -f file's ``spec.model.inputs`` must be the server's: same names, data types, and dims (without the
    batch dimension; -1 on either side takes any size).

    Raises:
        ProfileUsageError: naming the file, the tensor and both descriptions.
    """
    if opts.base_document is None:
        return
    where = f"model {info.name!r} on {opts.url}"
    path = opts.base_path or "(file)"
    tensors = load_model(opts.base_document).spec.model.inputs
    mine, theirs = [t.name for t in tensors], [t.name for t in info.inputs]
    if sorted(mine) != sorted(theirs):
        raise ProfileUsageError(f"-f {path}: spec.model.inputs are named {mine} but {where} has inputs {theirs}")
    server = {t.name: t for t in info.inputs}
    for i, t in enumerate(tensors):
        dims = list(t.dims[1:] if t.includesBatchDim and info.max_batch_size > 0 else t.dims)
        other = server[t.name]
        label = f"-f {path}: spec.model.inputs[{i}] ({t.name!r})"
        if t.dataType.value != other.config_type:
            raise ProfileUsageError(f"{label} is {t.dataType.value} but {where} declares {other.config_type}")
        if len(dims) != len(other.dims) or any(
            a != b and a >= 0 and b >= 0 for a, b in zip(dims, other.dims, strict=True)
        ):
            raise ProfileUsageError(
                f"{label} has dims {dims} but {where} declares {list(other.dims)} (without the batch dimension)"
            )


def run_profile(opts: ProfileOptions, out: Console, err: Console, *, output: str = "table") -> dict[str, Any]:
    """Check, measure, print, plan. Returns the BatchedModel document (or, without an SLA, ``{"profile": ...}``).

    Every check runs before anything is printed or sent to the model: the options, the batch sizes against the
    server's ``max_batch_size``, and the document the profile goes into (with stand-in latencies).

    Raises:
        ProfileUsageError: a flag or the -f file does not fit (see :func:`check_options`,
            :func:`check_file_matches`, :func:`batch_sizes_for`); the command line exits 2.
        ProfileError: server, model or input problems (one line, with the URL and model).
        SpecError: the document with the measured profile does not validate or plan (field-named).
    """
    check_options(opts)
    has_sla = opts.base_document is not None or opts.latency_p99_ms is not None
    client = connect(opts.url)
    try:
        info = read_model_info(client, opts.url, opts.model, opts.version)
        if opts.base_document is not None:
            check_file_matches(info, opts)
        make = input_maker(info, opts.url, dict(opts.shapes), seed=opts.seed)
        sizes, note = batch_sizes_for(info, opts)
        if has_sla:
            _check_document(info, sizes, opts)
        if note:
            err.print(note, markup=False, highlight=False, soft_wrap=True)
        # not on a terminal (a pipe, a CI log) the bar is never drawn, and rich would end it with a blank line
        with Progress(
            TextColumn(f"profiling {info.name}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=not err.is_interactive,
        ) as bar:
            task = bar.add_task("executions", total=len(sizes) * opts.repeats)
            measured = measure(
                client,
                info,
                make,
                sizes,
                warmup=opts.warmup,
                repeats=opts.repeats,
                progress=lambda done, _total: bar.update(task, completed=done),
            )
    finally:
        client.close()
    points = profile_points(measured, opts.quantile)
    doc = document_for(info, points, opts) if has_sla else {"profile": points}
    if output != "yaml":
        _table(out, info, measured, opts)
    out.out(dump_document(doc), end="", highlight=False)
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


def dump_document(doc: dict[str, Any]) -> str:
    """``doc`` as YAML; a BatchedModel without ``spec.model.repository`` starts with a comment saying so."""
    text = yaml.safe_dump(doc, sort_keys=False)
    model = (doc.get("spec") or {}).get("model") if doc.get("kind") == KIND else None
    if isinstance(model, dict) and not model.get("repository"):
        return NO_REPOSITORY_COMMENT + text
    return text


def _check_document(info: ModelInfo, sizes: list[int], opts: ProfileOptions) -> None:
    """The document the profile goes into must validate with a profile at ``sizes`` (stand-in latencies).

    Raises:
        ProfileUsageError: the -f file does not hold such a profile (e.g. spec.batching.preferredBatchSizes above
            the server's max_batch_size), one problem per ``;``.
        ProfileError: the model as the server describes it is not a valid BatchedModel.
    """
    stand_in = [{"batchSize": b, "latencyMs": 1.0} for b in sizes]
    try:
        load_model(document_for(info, stand_in, opts))
    except SpecError as e:
        problems = "; ".join(str(p) for p in e.problems)
        if opts.base_document is not None:
            raise ProfileUsageError(
                f"-f {opts.base_path or '(file)'} does not fit the profile to measure, at batch sizes "
                f"{_sizes(sizes)} (max_batch_size={info.max_batch_size} of model {info.name!r} on {opts.url}): "
                f"{problems}"
            ) from None
        raise ProfileError(
            f"model {info.name!r} on {opts.url} does not make a valid BatchedModel: {problems}"
        ) from None


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


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Measure a live model's execution latency per batch size; print the profile and the plan it gives.

    Bad flags, a bad -f file, and batch sizes the server's model cannot take exit 2 before anything is printed
    or measured; a server, model or input problem exits 1; both as one line on stderr.
    """
    try:
        sizes = tuple(int(b) for b in args.batch_sizes.split(",")) if args.batch_sizes else ()
    except ValueError:
        err_line(err, f"--batch-sizes {args.batch_sizes!r} must be comma-separated integers")
        return EXIT_USAGE
    if any(b < 1 for b in sizes):
        err_line(err, f"--batch-sizes {args.batch_sizes!r}: every batch size must be >= 1")
        return EXIT_USAGE
    base = None
    try:
        url = check_url(args.url)  # before anything else: no client is ever made for a bad URL
        shapes = tuple(parse_shape(s) for s in args.shape or [])
        if args.file:
            docs = parse_documents(read_text(args.file))
            if len(docs) != 1:
                raise ValueError(f"{args.file}: -f takes one BatchedModel, found {len(docs)} documents")
            load_model(docs[0])  # the document must be valid before minutes of measuring
            base = docs[0]
        opts = ProfileOptions(
            url=url,
            model=args.model,
            version=args.model_version,
            batch_sizes=sizes,
            warmup=args.warmup,
            repeats=args.repeats,
            quantile=args.quantile,
            shapes=shapes,
            latency_p99_ms=args.latency_p99_ms,
            network_overhead_ms=args.network_ms,
            base_document=base,
            base_path=args.file or "",
            seed=args.seed,
        )
        check_options(opts)
    except (OSError, SpecError) as e:
        return input_error(f"{args.file}", e, err)
    except (ValueError, ProfileUsageError) as e:
        err_line(err, str(e))
        return EXIT_USAGE
    try:
        run_profile(opts, out, err, output=args.output)
    except ProfileUsageError as e:  # a flag or the file against the model on the server, before measuring
        err_line(err, one_line(str(e), limit=2000))
        return EXIT_USAGE
    except ProfileError as e:  # the server's words are cut to one line where they are quoted; this is the rest
        err_line(err, f"batchfill profile: {one_line(str(e), limit=2000)}")
        return EXIT_FAILED
    except SpecError as e:
        for p in e.problems:
            err_line(err, f"measured profile: {p}")
        return EXIT_USAGE
    return EXIT_OK


__all__ = [
    "ProfileError",
    "ProfileOptions",
    "ProfileUsageError",
    "batch_sizes_for",
    "check_file_matches",
    "check_options",
    "command",
    "dump_document",
    "parse_shape",
    "run_profile",
]
