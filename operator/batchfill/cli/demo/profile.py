"""The demo's first step on this machine: the example model's execution latency per batch size, measured as
``batchfill profile`` measures it, so the plan and the load fit this machine's speed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from batchfill.adapters.profiler import (
    ModelInfo,
    ProfileError,
    SizeMeasurement,
    connect,
    input_maker,
    measure,
    read_model_info,
)
from batchfill.api.validate import load_model
from batchfill.cli.demo.results import EXAMPLE_MODEL, DemoError
from batchfill.cli.profile import DEFAULT_QUANTILE, profile_points
from batchfill.cli.serve import profile_table, provisional_plan
from batchfill.render import render_model_config
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.triton_local import LocalTriton, TritonStartError

#: Unmeasured requests per batch size before the measured ones: the first execution of a new input shape pays
#: onnxruntime's one-time allocations (the first batch of 1 took about twice a warm one on a 2-core machine).
PROFILE_WARMUP = 1
#: Measured executions per batch size. With ``batchfill profile``'s p90 (numpy's "higher" quantile) of ten
#: executions the profile is the slowest of them: on a busy machine, the side to err on for a p99 SLA. Eleven
#: executions of each of the example's batch sizes 1, 2, 4, 8 and 16 (341 samples) took 12-38 s on a 2-core
#: machine shared with other work, depending on how busy it was.
PROFILE_REPEATS = 10


def measure_example_profile(
    example: Mapping[str, Any], work: Path, console: Console, *, seed: int = 0
) -> list[dict[str, Any]]:
    """``spec.profile`` of the example model as measured on this machine, what a user gets from ``batchfill profile``.

    One local tritonserver serves the model with a config that accepts every batch size of the declared profile
    (:func:`batchfill.cli.serve.provisional_plan`, ``KIND_CPU``); :func:`batchfill.adapters.profiler.measure`
    sends :data:`PROFILE_WARMUP` then :data:`PROFILE_REPEATS` requests of each size, one at a time and in rounds
    (:func:`_measure_in_rounds`), and reads each execution's latency from Triton's statistics (compute input +
    infer + output, no transport or queueing). The profile value is ``batchfill profile``'s default quantile
    (p90) of those executions, not their mean as ``batchfill serve`` takes: the plan treats ``l(b)`` as the
    latency of every execution, so a mean would plan as if the slow executions of a busy machine did not happen.
    The declared and measured profiles are printed side by side; the server is stopped (and ``work`` left for the
    caller to remove) however this ends.

    Args:
        example: the example BatchedModel document (``spec.profile`` gives the batch sizes measured).
        work: a new directory for the model repository and the server log.

    Returns:
        ``[{"batchSize": b, "latencyMs": ms}, ...]``, increasing in ``b``.

    Raises:
        DemoError: tritonserver did not start or the measurement failed (with the server log's path).
    """
    spec = load_model(example).spec
    model = spec.model.name
    declared = {p.batchSize: p.latencyMs for p in spec.profile or []}
    sizes = sorted(declared) or [1, 2, 4, 8, 16]  # serve's sizes for a model without a profile
    config = render_model_config(spec, provisional_plan(spec, sizes), instance_kind="KIND_CPU")
    write_model(work / "models", model, config, EXAMPLE_MODEL)
    log = work / "tritonserver.log"
    triton = LocalTriton(work / "models", log_path=log, startup_timeout_s=180)
    t0 = time.monotonic()
    with _interrupt_not_printed_by_gevent():
        try:  # start() inside: an interrupt while it waits for readiness must stop the server it spawned too
            with console.status(f"starting a tritonserver to measure {model} on this machine ..."):
                triton.start()
            client = connect(triton.http_url)
            try:
                info = read_model_info(client, triton.http_url, model)
                make = input_maker(info, triton.http_url, seed=seed)
                with console.status(f"measuring the execution latency of {model} for batch sizes {sizes} ..."):
                    measured = _measure_in_rounds(client, info, make, sizes)
            finally:
                client.close()
        except (TritonStartError, ProfileError) as e:
            raise DemoError(f"measuring the profile of {model} failed: {e}\ntritonserver log {log}") from None
        finally:
            triton.stop()
    points = profile_points(measured, DEFAULT_QUANTILE)
    console.log(
        f"measured {model} on this machine in {time.monotonic() - t0:.0f} s: p{DEFAULT_QUANTILE * 100:g} of "
        f"{PROFILE_REPEATS} executions per batch size after {PROFILE_WARMUP} warm-up"
    )
    profile_table(console, declared, {p["batchSize"]: p["latencyMs"] for p in points})
    return points


@contextlib.contextmanager
def _interrupt_not_printed_by_gevent() -> Iterator[None]:
    """While inside, gevent's hub (tritonclient.http's event loop) passes Ctrl-C and SIGTERM on without printing
    them first, as `batchfill serve` has it (cli/main.py); the interrupt still reaches the caller."""
    import gevent

    hub = gevent.get_hub()
    not_error = hub.NOT_ERROR
    hub.NOT_ERROR = (*not_error, KeyboardInterrupt)
    try:
        yield
    finally:
        hub.NOT_ERROR = not_error


def _measure_in_rounds(
    client: Any, info: ModelInfo, make: Callable[[int], list[Any]], sizes: list[int]
) -> list[SizeMeasurement]:
    """:data:`PROFILE_REPEATS` rounds of one execution of every size (the warm-up in the first), merged per size.

    :func:`batchfill.adapters.profiler.measure` runs a size's executions back to back: the ten of batch 1 take
    0.3 s and catch the machine's load of that moment only (on a shared machine it changes from second to
    second; measured here: batch 1 at 0.77 of the declared latency, batch 16, measured seconds later, at 1.88).
    In rounds, every size is sampled across the whole measurement, so each quantile sees the same load.
    """
    rounds = [
        measure(client, info, make, sizes, warmup=PROFILE_WARMUP if i == 0 else 0, repeats=1)
        for i in range(PROFILE_REPEATS)
    ]
    return [
        SizeMeasurement(b, tuple(ms for r in rounds for m in r if m.batch_size == b for ms in m.executions_ms))
        for b in sizes
    ]


def with_profile(doc: Mapping[str, Any], profile: list[dict[str, Any]]) -> dict[str, Any]:
    """A copy of the BatchedModel document ``doc`` whose ``spec.profile`` is ``profile``; nothing else differs."""
    return {**doc, "spec": {**doc["spec"], "profile": [dict(p) for p in profile]}}
