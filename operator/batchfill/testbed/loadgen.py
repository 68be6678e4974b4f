"""Open-loop Poisson load generator for a Triton model (component tests, demo, simulator validation).

Arrivals are a Poisson process of rate λ: exponential inter-arrival times from a seeded numpy RNG, fixed
before the run, so two runs with the same seed offer exactly the same load. Each arrival is one request of a
single sample (batch 1), sent asynchronously over gRPC (``tritonclient.grpc.aio``, one event loop, one HTTP/2
channel), so requests overlap and the offered load never waits for the server (open loop). The server's
dynamic batcher forms the batches.

Latency is measured from the *scheduled* arrival time to the response, so a late sender cannot hide queueing
(no coordinated omission); ``send_lag`` says how late the sender was. If its p99 is more than a few ms the
generator, not the server, was the bottleneck and :attr:`LoadResult.generator_saturated` is true.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

#: A sender later than this (p99) is treated as the bottleneck of the run.
GENERATOR_LAG_LIMIT_MS = 5.0


def poisson_arrivals(
    rate_rps: float, *, duration_s: float | None = None, count: int | None = None, seed: int = 0
) -> npt.NDArray[np.float64]:
    """Arrival times (s from 0) of a Poisson process of ``rate_rps``, up to ``duration_s`` or ``count``."""
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise ValueError(f"rate must be a positive finite number, got {rate_rps}")
    if (duration_s is None) == (count is None):
        raise ValueError("give exactly one of duration_s and count")
    rng = np.random.default_rng(seed)
    if count is not None:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        out: npt.NDArray[np.float64] = np.cumsum(rng.exponential(1.0 / rate_rps, size=count))
        return out
    assert duration_s is not None
    if duration_s <= 0:
        raise ValueError(f"duration must be > 0, got {duration_s}")
    n = int(rate_rps * duration_s + 6 * math.sqrt(rate_rps * duration_s) + 16)
    t = np.cumsum(rng.exponential(1.0 / rate_rps, size=n))
    while t[-1] < duration_s:  # practically never: the draw above covers mean + 6 sigma
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate_rps, size=n))])
    kept: npt.NDArray[np.float64] = t[t < duration_s]
    return kept


def varying_poisson_arrivals(
    rate_at: Callable[[float], float], duration_s: float, *, rate_max_rps: float, seed: int = 0
) -> npt.NDArray[np.float64]:
    """Arrival times (s from 0, before ``duration_s``) of a Poisson process whose rate follows ``rate_at(t)``.

    Lewis-Shedler thinning: candidates of a homogeneous process at ``rate_max_rps`` (drawn as
    :func:`poisson_arrivals` does, with ``seed``), each kept with probability ``rate_at(t) / rate_max_rps``
    (uniforms from a second generator seeded with ``seed + 1``). ``rate_at`` must stay within
    ``[0, rate_max_rps]``; a value outside raises ``ValueError``. Same seed, same arrivals.
    """
    candidates = poisson_arrivals(rate_max_rps, duration_s=duration_s, seed=seed)
    rates = np.fromiter((rate_at(float(t)) for t in candidates), dtype=np.float64, count=len(candidates))
    if rates.size and (not np.all(np.isfinite(rates)) or rates.min() < 0 or rates.max() > rate_max_rps * (1 + 1e-9)):
        raise ValueError(f"rate_at must stay within [0, {rate_max_rps}] on [0, {duration_s})")
    keep = np.random.default_rng(seed + 1).random(len(candidates)) * rate_max_rps < rates
    kept: npt.NDArray[np.float64] = candidates[keep]
    return kept


def _pct(a: npt.NDArray[np.float64], q: float) -> float:
    return float(np.percentile(a, q)) if a.size else math.nan


@dataclass
class LoadResult:
    """What one Poisson run measured on the client side."""

    rate_rps: float  # requested λ
    duration_s: float  # span the arrivals were drawn over
    sent: int
    ok: int
    failed: int
    latency_ms: npt.NDArray[np.float64]  # successful requests: response time - scheduled arrival time
    send_lag_ms: npt.NDArray[np.float64]  # every request: actual send time - scheduled arrival time
    wall_s: float  # first send to last response
    errors: list[str] = field(default_factory=list)  # the first few distinct error messages
    priming_requests: int = 0  # sent before the clock started to open the channel; not in any count above

    @property
    def achieved_rate_rps(self) -> float:
        """Successful requests per second over the arrival window."""
        return self.ok / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def p50_ms(self) -> float:
        return _pct(self.latency_ms, 50)

    @property
    def p99_ms(self) -> float:
        return _pct(self.latency_ms, 99)

    @property
    def max_ms(self) -> float:
        return float(self.latency_ms.max()) if self.latency_ms.size else math.nan

    @property
    def send_lag_p99_ms(self) -> float:
        return _pct(self.send_lag_ms, 99)

    @property
    def generator_saturated(self) -> bool:
        return bool(self.send_lag_ms.size) and self.send_lag_p99_ms > GENERATOR_LAG_LIMIT_MS

    def summary(self) -> str:
        return (
            f"λ={self.rate_rps:.1f}/s over {self.duration_s:.1f}s: sent {self.sent}, ok {self.ok}, "
            f"failed {self.failed}, achieved {self.achieved_rate_rps:.1f}/s, p50 {self.p50_ms:.2f} ms, "
            f"p99 {self.p99_ms:.2f} ms, max {self.max_ms:.2f} ms, send lag p99 {self.send_lag_p99_ms:.2f} ms"
        )


async def run_poisson_async(
    url: str,
    model: str,
    make_inputs: Callable[[], Sequence[Any]],
    arrivals_s: npt.NDArray[np.float64],
    *,
    rate_rps: float,
    duration_s: float,
    outputs: Sequence[Any] | None = None,
    timeout_s: float = 30.0,
    model_version: str = "",
    priming_requests: int = 1,
) -> LoadResult:
    """Send one request per arrival time (seconds from start) to ``model`` at ``url`` (gRPC ``host:port``)."""
    import tritonclient.grpc.aio as grpcaio

    inputs = list(make_inputs())  # one sample; shared read-only by every request
    n = len(arrivals_s)
    lat = np.full(n, np.nan)
    lag = np.full(n, np.nan)
    errors: list[str] = []
    failed = 0
    loop = asyncio.get_running_loop()
    client = grpcaio.InferenceServerClient(url)
    try:
        # One request before the clock starts opens the channel (not counted).
        await client.infer(model, inputs, outputs=outputs, model_version=model_version, client_timeout=timeout_s)
        start = loop.time() + 0.01
        last_done = start

        async def one(i: int, scheduled: float) -> None:
            nonlocal failed, last_done
            lag[i] = (loop.time() - scheduled) * 1e3
            try:
                await client.infer(
                    model, inputs, outputs=outputs, model_version=model_version, client_timeout=timeout_s
                )
            except Exception as e:  # any failure is counted, the run goes on
                failed += 1
                msg = f"{type(e).__name__}: {e}"[:300]
                if len(errors) < 5 and msg not in errors:
                    errors.append(msg)
                return
            now = loop.time()
            lat[i] = (now - scheduled) * 1e3
            last_done = max(last_done, now)

        tasks = []
        for i, a in enumerate(arrivals_s):
            scheduled = start + float(a)
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, scheduled)))
        if tasks:
            await asyncio.gather(*tasks)
        wall = last_done - start
    finally:
        await client.close()
    ok_lat = lat[~np.isnan(lat)]
    return LoadResult(
        rate_rps=rate_rps,
        duration_s=duration_s,
        sent=n,
        ok=int(ok_lat.size),
        failed=failed,
        latency_ms=ok_lat,
        send_lag_ms=lag[~np.isnan(lag)],
        wall_s=wall,
        errors=errors,
        priming_requests=priming_requests,
    )


def run_poisson(
    url: str,
    model: str,
    make_inputs: Callable[[], Sequence[Any]],
    rate_rps: float,
    *,
    duration_s: float | None = None,
    count: int | None = None,
    seed: int = 0,
    outputs: Sequence[Any] | None = None,
    timeout_s: float = 30.0,
    model_version: str = "",
    priming_requests: int = 1,
) -> LoadResult:
    """Blocking open-loop Poisson run: ``rate_rps`` single-sample requests/s for ``duration_s`` or ``count``.

    ``make_inputs()`` returns the ``tritonclient.grpc.InferInput`` list of one single-sample request.
    """
    arrivals = poisson_arrivals(rate_rps, duration_s=duration_s, count=count, seed=seed)
    span = duration_s if duration_s is not None else (float(arrivals[-1]) if len(arrivals) else 0.0)
    return asyncio.run(
        run_poisson_async(
            url,
            model,
            make_inputs,
            arrivals,
            rate_rps=rate_rps,
            duration_s=span,
            outputs=outputs,
            timeout_s=timeout_s,
            model_version=model_version,
            priming_requests=priming_requests,
        )
    )


def grpc_fp32_input(name: str, sample_shape: Sequence[int], *, seed: int = 0) -> Callable[[], list[Any]]:
    """``make_inputs`` for one FP32 input: a random batch-1 tensor of shape ``[1, *sample_shape]``."""

    def make() -> list[Any]:
        import tritonclient.grpc as grpcclient

        data = np.random.default_rng(seed).random((1, *sample_shape), dtype=np.float32)
        inp = grpcclient.InferInput(name, list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        return [inp]

    return make
