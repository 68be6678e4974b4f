"""`batchfill serve`: plan a BatchedModel and prove the plan on a real local tritonserver.

1. start the real tritonserver (nvidia-pytriton's 2.51 build) on 127.0.0.1 with an empty repository;
2. load the model with a provisional config and measure its execution latency per batch size through
   Triton's statistics API (the declared profile is shown next to it: nominal numbers lie);
3. plan from the SLA and the *measured* profile, render config.pbtxt (KIND_CPU: no GPU here) and reload;
4. open-loop Poisson load at a fraction of the predicted capacity; report Triton's own server-side p99
   (``nv_inference_request_summary_us``), the client p99, batch size and queue time against ``T``.

The model code comes from the examples shipped in the package, named by the annotation
``batchfill.io/example-model`` on the BatchedModel (the operator will mount a real repository instead).
"""

from __future__ import annotations

import argparse
import math
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent  # tritonclient.http's event loop
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from rich.console import Console
from rich.table import Table
from tritonclient.utils import np_to_triton_dtype

from batchfill.adapters.triton_stats import (
    ModelStats,
    delta,
    measure_profile,
    read_model_stats,
    summary_quantile_ms,
    wait_for_counts,
)
from batchfill.api.errors import Problem, SpecError
from batchfill.api.spec import BatchedModel, BatchedModelSpec, DataType, ProfilePoint
from batchfill.api.status import PlanStatus
from batchfill.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, err_line, one_model
from batchfill.policy.plan import plan_batching
from batchfill.policy.profile import LatencyProfile
from batchfill.render import render_model_config
from batchfill.testbed.loadgen import run_poisson
from batchfill.testbed.model_repo import EXAMPLE_MODELS, write_model
from batchfill.testbed.triton_local import LocalTriton

EXAMPLE_ANNOTATION = "batchfill.io/example-model"
_NUMPY = {DataType.TYPE_FP32: np.float32, DataType.TYPE_FP16: np.float16, DataType.TYPE_FP64: np.float64}


@dataclass(frozen=True)
class ServeReport:
    """What one `batchfill serve` run measured. Latencies in ms, rates in requests/s."""

    plan: PlanStatus
    measured_profile: dict[int, float]
    offered_rps: float
    achieved_rps: float
    sent: int
    failed: int
    server_p99_ms: float | None
    client_p99_ms: float
    avg_batch_size: float | None
    avg_queue_ms: float | None
    generator_saturated: bool
    served_stats: ModelStats  # Triton's statistics of the load phase (without the measurement and warm-up)

    @property
    def served_slowdown(self) -> float | None:
        """Execution time while serving over what the measured profile gives for the same batches (1.0: as
        measured). None without a measured profile or executions. Batch sizes between measured ones are
        interpolated, as the planner does."""
        if not self.measured_profile or not self.served_stats.batches:
            return None
        profile = LatencyProfile.from_points(
            [ProfilePoint(batchSize=b, latencyMs=v) for b, v in sorted(self.measured_profile.items())]
        )
        stats = self.served_stats.batches.values()
        expected_ns = sum(s.executions * profile.latency_ms(s.batch_size) * 1e6 for s in stats)
        return sum(s.total_ns for s in stats) / expected_ns if expected_ns > 0 else None

    @property
    def sla_kept(self) -> bool:
        """Server p99 within T, no failed request."""
        return self.server_p99_ms is not None and self.server_p99_ms <= self.plan.serverBudgetMs and self.failed == 0


def example_of(bm: BatchedModel) -> str:
    """The shipped example model named by the ``batchfill.io/example-model`` annotation.

    Raises:
        SpecError: when the annotation is missing or names no shipped example.
    """
    annotations = (bm.metadata.model_extra or {}).get("annotations") or {}
    example = annotations.get(EXAMPLE_ANNOTATION)
    if example not in EXAMPLE_MODELS:
        raise SpecError(
            [
                Problem(
                    f"metadata.annotations[{EXAMPLE_ANNOTATION}]",
                    f"={example!r}: `batchfill serve` runs a model shipped with batchfill; "
                    f"use one of {', '.join(EXAMPLE_MODELS)}",
                )
            ]
        )
    return str(example)


def _sample_shape(spec: BatchedModelSpec) -> tuple[str, list[int], Any]:
    if len(spec.model.inputs) != 1:
        raise SpecError([Problem("spec.model.inputs", "`batchfill serve` synthesizes exactly one input")])
    t = spec.model.inputs[0]
    dims = t.dims[1:] if t.includesBatchDim else t.dims
    if any(d < 1 for d in dims) or t.dataType not in _NUMPY:
        raise SpecError(
            [Problem("spec.model.inputs[0]", f"cannot synthesize {t.dataType.value} {t.dims}: fixed float dims only")]
        )
    return t.name, list(dims), _NUMPY[t.dataType]


def provisional_plan(spec: BatchedModelSpec, sizes: list[int]) -> PlanStatus:
    """A plan whose config accepts every batch size in ``sizes``, for measuring (no SLA claim; the README's
    recipe for a Triton to `batchfill profile` uses it too)."""
    return PlanStatus(
        maxBatchSize=max(sizes),
        preferredBatchSizes=[],
        maxQueueDelayMicroseconds=100,
        instanceCount=1,
        serverBudgetMs=spec.sla.server_budget_ms,
        capacityPerReplicaRps=0,
        predictedP99Ms=0,
        minClientTimeoutMs=0,
        rule="provisional: measuring the profile",
    )


def serve(
    bm: BatchedModel,
    console: Console,
    *,
    load_fraction: float = 0.9,
    duration_s: float = 20.0,
    measure: bool = True,
    repeats: int = 20,
    seed: int = 0,
    workdir: Path | None = None,
) -> ServeReport:
    """Run the whole job (module docstring). Raises SpecError for a spec it cannot serve.

    tritonserver (its own process group) and the work directory are removed however it ends, Ctrl-C included;
    the command line turns SIGTERM into the same KeyboardInterrupt.

    Long because the steps share one tritonserver's lifetime (start, measure, reload with the plan, load, stop).
    """
    spec = bm.spec
    example = example_of(bm)
    name = spec.model.name
    input_name, dims, dtype = _sample_shape(spec)
    declared = {p.batchSize: p.latencyMs for p in spec.profile or []}
    sizes = sorted(declared) or [1, 2, 4, 8, 16]

    def inputs(protocol: Any, b: int, rng_seed: int) -> list[Any]:
        data = np.random.default_rng(rng_seed).random((b, *dims)).astype(dtype)
        inp = protocol.InferInput(input_name, list(data.shape), np_to_triton_dtype(dtype))
        inp.set_data_from_numpy(data)
        return [inp]

    def http_inputs(b: int) -> list[Any]:
        return inputs(httpclient, b, seed)

    def grpc_inputs() -> list[Any]:
        return inputs(grpcclient, 1, seed + 1)

    with tempfile.TemporaryDirectory(prefix="batchfill-serve-", dir=workdir) as tmp:
        repo = Path(tmp) / "models"
        repo.mkdir()
        triton = LocalTriton(repo, model_control_mode="explicit", log_path=Path(tmp) / "tritonserver.log")
        try:  # start() inside: an interrupt while it waits for readiness must stop the server it spawned too
            with console.status("starting tritonserver on 127.0.0.1 ..."):
                triton.start()
            client = triton.http_client()
            console.print(
                f"tritonserver ready (pid {triton.pid}, http {triton.http_url}, metrics {triton.metrics_url})"
            )
            measured: dict[int, float] = {}
            if measure:
                # Measure under another model name: Triton's latency summaries are per model name and cover
                # a sliding window, so the served model's p99 must not contain the measuring requests.
                probe = f"{name}_profile"
                probe_spec = spec.model_copy(update={"model": spec.model.model_copy(update={"name": probe})})
                provisional = render_model_config(probe_spec, provisional_plan(spec, sizes), instance_kind="KIND_CPU")
                _load(triton, client, probe, provisional, example)
                with console.status(f"measuring execution latency for batch sizes {sizes} ..."):
                    m = measure_profile(client, probe, http_inputs, sizes, warmup=3, repeats=repeats)
                client.unload_model(probe)
                measured = {b: round(v, 3) for b, v in m.mean_ms.items()}
                profile_table(console, declared, measured)
                spec = spec.model_copy(
                    update={"profile": [ProfilePoint(batchSize=b, latencyMs=v) for b, v in measured.items()]}
                )
            with console.status("planning from the SLA and the profile ..."):
                plan = plan_batching(spec, seed=seed).to_status()
            config = render_model_config(spec, plan, instance_kind="KIND_CPU")
            console.rule("config.pbtxt (derived; KIND_CPU here, KIND_GPU in production manifests)")
            console.print(config, markup=False, highlight=False)
            _load(triton, client, name, config, example)
            rate = load_fraction * plan.capacityPerReplicaRps
            before = read_model_stats(client, name)
            with console.status(f"Poisson load: {rate:.1f} req/s for {duration_s:g} s ..."):
                result = run_poisson(triton.grpc_url, name, grpc_inputs, rate, duration_s=duration_s, seed=seed)
            # Triton records an execution just after its responses: wait until every request is counted.
            after = wait_for_counts(
                client, name, inferences=before.inference_count + result.ok + result.priming_requests
            )
            d = delta(before, after)
            server_p99 = summary_quantile_ms(triton.metrics_text(), name, 0.99)
            client.close()
        finally:
            triton.stop()
    queue_ms = d.queue.ns / d.queue.count / 1e6 if d.queue.count else None
    report = ServeReport(
        plan=plan,
        measured_profile=measured,
        offered_rps=rate,
        achieved_rps=result.achieved_rate_rps,
        sent=result.sent,
        failed=result.failed,
        server_p99_ms=server_p99,
        client_p99_ms=result.p99_ms,
        avg_batch_size=d.avg_batch_size,
        avg_queue_ms=queue_ms,
        generator_saturated=result.generator_saturated,
        served_stats=d,
    )
    _report_table(console, report, load_fraction)
    return report


def _load(triton: LocalTriton, client: Any, name: str, config: str, example: str) -> None:
    write_model(triton.model_repository, name, config, example)
    try:
        client.load_model(name)
    except Exception as e:  # the server's own words, then its log
        raise RuntimeError(f"tritonserver could not load {name}: {e}\n{triton.diagnostics()}") from None


def profile_table(console: Console, declared: dict[int, float], measured: dict[int, float]) -> None:
    """Declared against measured ms per batch size, with their ratio (serve and the demo print it)."""
    t = Table(title="execution latency per batch size (Triton statistics: compute input+infer+output)")
    for col in ("batch size", "declared ms", "measured ms", "measured / declared"):
        t.add_column(col, justify="right")
    for b in sorted(measured):
        dec = declared.get(b)
        ratio = f"{measured[b] / dec:.2f}" if dec else "-"
        t.add_row(str(b), f"{dec:g}" if dec else "-", f"{measured[b]:.2f}", ratio)
    console.print(t)


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None or not math.isfinite(v) else format(v, spec)


def _report_table(console: Console, r: ServeReport, load_fraction: float) -> None:
    p = r.plan
    t = Table(title="plan against the real tritonserver")
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row(
        "max_batch_size / preferred / max_queue_delay_microseconds",
        f"{p.maxBatchSize} / {p.preferredBatchSizes} / {p.maxQueueDelayMicroseconds}",
    )
    t.add_row("predicted capacity per replica at SLA (req/s)", f"{p.capacityPerReplicaRps:.1f}")
    t.add_row(f"offered Poisson load ({load_fraction:.0%} of capacity, req/s)", f"{r.offered_rps:.1f}")
    t.add_row("achieved (req/s)", f"{r.achieved_rps:.1f}")
    t.add_row("requests sent / failed", f"{r.sent} / {r.failed}")
    t.add_row("average batch size / queue time (ms)", f"{_fmt(r.avg_batch_size)} / {_fmt(r.avg_queue_ms)}")
    t.add_row("server budget T (ms)", f"{p.serverBudgetMs:g}")
    t.add_row("server-side p99, Triton summary (ms)", _fmt(r.server_p99_ms))
    t.add_row("client p99, from scheduled arrival (ms)", _fmt(r.client_p99_ms))
    console.print(t)
    if r.generator_saturated:
        console.print("note: the load generator fell behind its schedule; the offered load was lower than planned")
    slowdown = r.served_slowdown
    if slowdown is not None and slowdown > 1 / load_fraction:
        console.print(
            f"note: executions took {slowdown - 1:.0%} longer while serving than when measured (other work on this "
            f"machine?): the offered {load_fraction:.0%} of the capacity was more than the capacity at that speed"
        )
    verdict = "[green]SLA kept[/green]" if r.sla_kept else "[red]SLA missed[/red]"
    console.print(f"{verdict}: server p99 {_fmt(r.server_p99_ms)} ms against T = {p.serverBudgetMs:g} ms")


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Measure, plan and serve on a local tritonserver.

    SIGTERM stops tritonserver and removes the work directory as Ctrl-C does, and exits 143 (Ctrl-C: 130).
    """
    # the flags before anything starts (a bad --load used to fail after tritonserver was up)
    if not (0 < args.load <= 2):  # NaN too
        err_line(err, f"--load={args.load} must be in (0, 2]: the offered load as a fraction of the planned capacity")
        return EXIT_USAGE
    if not (0 < args.duration <= 3600):
        err_line(err, f"--duration={args.duration} must be in (0, 3600] seconds of Poisson load")
        return EXIT_USAGE
    if args.seed < 0:
        err_line(err, f"--seed={args.seed} must be >= 0")
        return EXIT_USAGE
    bm = one_model(args.file, "serve", err)
    if isinstance(bm, int):
        return bm

    terminated = False

    def interrupt(signum: int, frame: Any) -> None:
        nonlocal terminated
        terminated = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        raise KeyboardInterrupt

    # An interrupt that lands in gevent's hub reaches serve() all the same; the hub need not print it first.
    hub = gevent.get_hub()
    not_error = hub.NOT_ERROR
    hub.NOT_ERROR = (*not_error, KeyboardInterrupt)
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        report = serve(
            bm, out, load_fraction=args.load, duration_s=args.duration, measure=not args.no_measure, seed=args.seed
        )
    except SpecError as e:
        for p in e.problems:
            err_line(err, f"{args.file}: {p}")
        return EXIT_USAGE
    except KeyboardInterrupt:  # serve() has stopped tritonserver and removed its work directory
        if terminated:
            return 128 + signal.SIGTERM  # 143, as if SIGTERM had killed the process (Ctrl-C: 130, in main)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        hub.NOT_ERROR = not_error
    return EXIT_OK if report.sla_kept else EXIT_FAILED
