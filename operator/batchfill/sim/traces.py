"""Seeded request traces for the fleet simulator: arrival times in seconds, produced block by block.

A day at 1,000 req/s is 86 million arrivals; holding them at once would take 700 MB, so a trace yields its
arrivals in consecutive blocks of ``block_s`` seconds (sorted, in ``[k·block_s, (k+1)·block_s)``) and the
simulator consumes them in order. The same trace object with the same seed yields the same arrivals every time
it is iterated; block boundaries do not change the draws of the rate-driven traces (each block of a
piecewise-constant rate uses its own child seed), and the renewal trace draws one stream in order.

Units: times in seconds from the start of the trace, rates in requests per second (one request = one sample).

Generators:

* :func:`diurnal`: a day-shaped rate ``trough · (1 + (r − 1) · ((1 + cos(2π(t − t_peak)/P)) / 2)^2)`` with
  peak-to-trough ratio ``r``; the squared raised cosine gives a long night and a sharper afternoon peak, as in
  published production inference traces (e.g. Azure Functions, Shahrad et al., ATC'20, Fig. 5), whose daily
  peak-to-trough ratios lie between 2 and 10. Arrivals are Poisson with that rate, piecewise constant per second.
* :func:`bursty`: a renewal process with Gamma inter-arrival times of a chosen coefficient of variation
  (CV 1 is Poisson; CV > 1 is burstier).
* :func:`spike`: Poisson at a base rate with a step to a peak rate for a stated interval (a step when the
  interval runs to the end of the trace).
* :func:`replay`: Poisson with a piecewise-constant rate per minute, from a rate file (one req/s value per
  minute; see :func:`parse_rate_file`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
#: Block length the simulator asks for, seconds: a multiple of every tick and scrape interval it uses.
DEFAULT_BLOCK_S = 15.0
#: Resolution of the piecewise-constant rate of :func:`diurnal`, seconds.
DIURNAL_STEP_S = 1.0
#: A rate file may hold at most this many minutes (a year) and rates up to this many req/s.
MAX_REPLAY_MINUTES = 366 * 24 * 60
MAX_RATE_RPS = 1e7
#: Most requests one simulation serves (``batchfill simulate``'s trace, mean rate x duration; a fleet's periods):
#: run time grows with them, about 30 s on one core for an hour at 2,000 req/s (7.2 million, every policy
#: compared), so this bound is about a quarter of an hour.
MAX_TRACE_REQUESTS = 2e8


@dataclass(frozen=True)
class Trace:
    """A seeded arrival process over ``[0, duration_s)``.

    Attributes:
        name: short name for tables and plots.
        description: what the trace is, with its parameters.
        duration_s: length, seconds.
        mean_rps: expected mean rate, req/s.
        rate_at: nominal rate λ(t) in req/s for plots (for :func:`bursty`, the constant mean rate).
        blocks_from: ``blocks_from(block_s)`` iterates the arrival blocks; use :meth:`blocks`.
    """

    name: str
    description: str
    duration_s: float
    mean_rps: float
    rate_at: Callable[[FloatArray], FloatArray] = field(repr=False)
    blocks_from: Callable[[float], Iterator[FloatArray]] = field(repr=False)

    def blocks(self, block_s: float = DEFAULT_BLOCK_S) -> Iterator[FloatArray]:
        """Arrival times, seconds, one sorted array per ``block_s`` interval (possibly empty), in order.

        The last block may be shorter when ``duration_s`` is not a multiple of ``block_s``.
        """
        if not (block_s > 0 and math.isfinite(block_s)):
            raise ValueError(f"block_s={block_s} must be a positive finite number of seconds")
        return self.blocks_from(block_s)

    def arrivals(self) -> FloatArray:
        """Every arrival at once, seconds (for short traces and tests)."""
        parts = list(self.blocks())
        return np.concatenate(parts) if parts else np.empty(0)


def _check(name: str, value: float, *, low: float = 0.0, strict: bool = True, high: float = math.inf) -> None:
    ok = math.isfinite(value) and (value > low if strict else value >= low) and value <= high
    if not ok:
        rel = ">" if strict else ">="
        raise ValueError(f"{name}={value!r} must be finite, {rel} {low:g} and <= {high:g}")


def _piecewise_poisson(
    rates_rps: FloatArray, step_s: float, duration_s: float, seed: int
) -> Callable[[float], Iterator[FloatArray]]:
    """Blocks of a Poisson process whose rate is ``rates_rps[i]`` on ``[i·step_s, (i+1)·step_s)``.

    Each rate step draws its count and uniform positions from its own ``SeedSequence(seed).spawn`` child, so
    the arrivals do not depend on the block length asked for.
    """
    steps = len(rates_rps)
    root = np.random.SeedSequence(seed)
    # one child per chunk of 4096 steps keeps memory flat and the draws independent of block_s
    chunk = 4096
    children = root.spawn(max(1, math.ceil(steps / chunk)))

    def chunk_arrivals(c: int) -> FloatArray:
        lo, hi = c * chunk, min(steps, (c + 1) * chunk)
        rng = np.random.default_rng(children[c])
        counts = rng.poisson(rates_rps[lo:hi] * step_s)
        starts = np.repeat(np.arange(lo, hi, dtype=np.float64) * step_s, counts)
        t = starts + rng.random(int(counts.sum())) * step_s
        t.sort()
        kept: FloatArray = t[t < duration_s]
        return kept

    def blocks(block_s: float) -> Iterator[FloatArray]:
        pending = np.empty(0)
        c = 0
        k = 0
        while k * block_s < duration_s:
            end = min((k + 1) * block_s, duration_s)
            while c * chunk * step_s < end and c < len(children):
                pending = np.concatenate([pending, chunk_arrivals(c)])
                c += 1
            cut = int(np.searchsorted(pending, end, side="left"))
            yield pending[:cut]
            pending = pending[cut:]
            k += 1

    return blocks


def diurnal(
    mean_rps: float,
    *,
    duration_s: float = 86_400.0,
    peak_to_trough: float = 5.0,
    peak_hour: float = 14.0,
    period_s: float = 86_400.0,
    seed: int = 0,
) -> Trace:
    """A day of Poisson traffic whose rate follows a squared raised cosine (module docstring).

    Args:
        mean_rps: mean rate over a whole period, req/s (> 0).
        duration_s: length, seconds (default one day).
        peak_to_trough: ratio of the highest to the lowest rate (>= 1).
        peak_hour: hour of the day (0-24) of the peak.
        period_s: length of a "day", seconds.
        seed: RNG seed.

    Raises:
        ValueError: on a non-finite, non-positive or out-of-range argument (message names it).
    """
    _check("mean_rps", mean_rps, high=MAX_RATE_RPS)
    _check("duration_s", duration_s)
    _check("peak_to_trough", peak_to_trough, low=1.0, strict=False)
    _check("peak_hour", peak_hour, strict=False, high=24.0)
    _check("period_s", period_s)
    # the mean of ((1 + cos x) / 2)^2 over a period is 3/8
    trough = mean_rps / (1.0 + (peak_to_trough - 1.0) * 3.0 / 8.0)
    phase_s = peak_hour / 24.0 * period_s

    def rate_at(t: FloatArray) -> FloatArray:
        g = ((1.0 + np.cos(2.0 * np.pi * (np.asarray(t, dtype=np.float64) - phase_s) / period_s)) / 2.0) ** 2
        out: FloatArray = trough * (1.0 + (peak_to_trough - 1.0) * g)
        return out

    steps = math.ceil(duration_s / DIURNAL_STEP_S)
    rates = rate_at((np.arange(steps) + 0.5) * DIURNAL_STEP_S)
    return Trace(
        name="diurnal",
        description=(
            f"diurnal day: Poisson, mean {mean_rps:g} req/s over a {period_s / 3600:g} h day, peak/trough "
            f"{peak_to_trough:g} (peak {trough * peak_to_trough:.4g} req/s at {peak_hour:g}h, trough {trough:.4g}), "
            + (
                f"{duration_s / 3600:g} h"
                if duration_s >= period_s
                else f"its first {duration_s / 3600:g} h (mean {float(np.mean(rates)):.4g} req/s)"
            )
            + f", seed {seed}"
        ),
        duration_s=duration_s,
        mean_rps=float(np.mean(rates)),
        rate_at=rate_at,
        blocks_from=_piecewise_poisson(rates, DIURNAL_STEP_S, duration_s, seed),
    )


def bursty(mean_rps: float, *, cv: float, duration_s: float, seed: int = 0) -> Trace:
    """A renewal process with Gamma inter-arrival times: mean ``1/mean_rps`` s, coefficient of variation ``cv``.

    Gamma shape ``k = 1/cv²`` and scale ``1/(mean_rps·k)``; cv = 1 is Poisson, cv = 4 clusters arrivals in
    bursts (the coefficient of variation of inter-arrival times that the burstiest production inference
    traces show).

    Raises:
        ValueError: on a non-finite or non-positive argument.
    """
    _check("mean_rps", mean_rps, high=MAX_RATE_RPS)
    _check("cv", cv, high=100.0)
    _check("duration_s", duration_s)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (mean_rps * shape)

    def blocks(block_s: float) -> Iterator[FloatArray]:
        rng = np.random.default_rng(seed)
        batch = max(1024, int(mean_rps * block_s * 1.5))
        t = 0.0
        buf = np.empty(0)
        k = 0
        while k * block_s < duration_s:
            end = min((k + 1) * block_s, duration_s)
            while (buf[-1] if buf.size else t) < end:
                new = (buf[-1] if buf.size else t) + np.cumsum(rng.gamma(shape, scale, size=batch))
                buf = np.concatenate([buf, new])
            cut = int(np.searchsorted(buf, end, side="left"))
            yield buf[:cut]
            t = float(buf[cut - 1]) if cut else t
            buf = buf[cut:]
            k += 1

    def rate_at(t: FloatArray) -> FloatArray:
        return np.full_like(np.asarray(t, dtype=np.float64), mean_rps)

    return Trace(
        name=f"bursty-cv{cv:g}",
        description=f"bursty: Gamma inter-arrivals, mean {mean_rps:g} req/s, CV {cv:g}, "
        f"{duration_s / 3600:g} h, seed {seed}",
        duration_s=duration_s,
        mean_rps=mean_rps,
        rate_at=rate_at,
        blocks_from=blocks,
    )


def spike(
    base_rps: float, peak_rps: float, *, start_s: float, length_s: float, duration_s: float, seed: int = 0
) -> Trace:
    """Poisson at ``base_rps``, at ``peak_rps`` on ``[start_s, start_s + length_s)``: a spike, or a step when
    the interval reaches the end of the trace. Rates piecewise constant per second.

    Raises:
        ValueError: on a non-finite or negative rate, or an interval outside the trace.
    """
    _check("base_rps", base_rps, strict=False, high=MAX_RATE_RPS)
    _check("peak_rps", peak_rps, strict=False, high=MAX_RATE_RPS)
    _check("duration_s", duration_s)
    _check("start_s", start_s, strict=False, high=duration_s)
    _check("length_s", length_s)

    def rate_at(t: FloatArray) -> FloatArray:
        t = np.asarray(t, dtype=np.float64)
        out: FloatArray = np.where((t >= start_s) & (t < start_s + length_s), peak_rps, base_rps)
        return out

    steps = math.ceil(duration_s)
    rates = rate_at(np.arange(steps) + 0.5)
    kind = "step" if start_s + length_s >= duration_s else "spike"
    return Trace(
        name=kind,
        description=f"{kind}: Poisson {base_rps:g} -> {peak_rps:g} req/s at {start_s:g} s for "
        f"{min(length_s, duration_s - start_s):g} s, {duration_s:g} s, seed {seed}",
        duration_s=duration_s,
        mean_rps=float(np.mean(rates)),
        rate_at=rate_at,
        blocks_from=_piecewise_poisson(rates, 1.0, duration_s, seed),
    )


def replay(rates_per_minute_rps: Sequence[float], *, seed: int = 0, name: str = "replay") -> Trace:
    """Poisson traffic whose rate is ``rates_per_minute_rps[m]`` req/s during minute ``m``.

    Raises:
        ValueError: on an empty sequence, more than a year of minutes, or a rate that is negative, non-finite or
            above 10^7 req/s (the message gives the minute).
    """
    rates = np.asarray(list(rates_per_minute_rps), dtype=np.float64)
    if rates.size == 0:
        raise ValueError("a replay needs at least one per-minute rate")
    if rates.size > MAX_REPLAY_MINUTES:
        raise ValueError(f"{rates.size} minutes exceed the {MAX_REPLAY_MINUTES} a replay may hold")
    for m, r in enumerate(rates):
        if not (math.isfinite(r) and 0 <= r <= MAX_RATE_RPS):
            raise ValueError(f"minute {m}: rate {r!r} req/s must be finite and within [0, {MAX_RATE_RPS:g}]")
    duration_s = 60.0 * rates.size

    def rate_at(t: FloatArray) -> FloatArray:
        idx = np.clip((np.asarray(t, dtype=np.float64) // 60).astype(np.int64), 0, rates.size - 1)
        out: FloatArray = rates[idx]
        return out

    return Trace(
        name=name,
        description=f"{name}: {rates.size} per-minute rates, mean {float(rates.mean()):.4g} req/s, "
        f"max {float(rates.max()):.4g} req/s, seed {seed}",
        duration_s=duration_s,
        mean_rps=float(rates.mean()),
        rate_at=rate_at,
        blocks_from=_piecewise_poisson(rates, 60.0, duration_s, seed),
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_rate_file(text: str) -> list[float]:
    """Per-minute rates from a rate file: one value per line in req/s, or CSV ``minute,rps`` lines.

    Blank lines and lines starting with ``#`` are skipped; a CSV header (the first data line, with a comma and no
    field that is a number, e.g. ``minute,rps``) is skipped. A plain one-value line that is not a number is an
    error, even first: a typo must not shift the replay by a minute. CSV minutes must count 0, 1, 2, ... without
    gaps.

    Raises:
        ValueError: naming the line number and its content when a line cannot be read.
    """
    rates: list[float] = []
    first = True
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        try:
            value = float(fields[-1])
        except ValueError:
            if first and len(fields) > 1 and not any(_is_number(f) for f in fields):
                first = False
                continue
            raise ValueError(f"line {lineno}: {line[:80]!r} is not a rate in req/s") from None
        first = False
        if len(fields) > 2:
            raise ValueError(f"line {lineno}: {line[:80]!r} has {len(fields)} fields, expected 'rps' or 'minute,rps'")
        if len(fields) == 2:
            try:
                minute = float(fields[0])
            except ValueError:
                raise ValueError(f"line {lineno}: minute {fields[0][:40]!r} is not a number") from None
            if minute != len(rates):
                raise ValueError(f"line {lineno}: minute {fields[0]} out of order, expected {len(rates)}")
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"line {lineno}: rate {value!r} req/s must be finite and >= 0")
        rates.append(value)
    if not rates:
        raise ValueError("the rate file holds no rates")
    return rates


#: Day shapes of :func:`noisy_day`: the fraction of the day's peak at phase ``x`` in [0, 1) of the period.
DAY_SHAPES = ("single", "double", "plateau")


def _day_shape(shape: str, x: FloatArray) -> FloatArray:
    """Relative rate in [0, 1] of a day shape at phase ``x`` (0 = midnight, 0.5 = noon)."""
    if shape == "single":  # the squared raised cosine of :func:`diurnal`, peak at 14h
        out: FloatArray = ((1.0 + np.cos(2.0 * np.pi * (x - 14.0 / 24.0))) / 2.0) ** 2
    elif shape == "double":  # a morning and a (higher) evening peak
        out = np.maximum(
            0.8 * ((1.0 + np.cos(2.0 * np.pi * (x - 10.0 / 24.0))) / 2.0) ** 6,
            ((1.0 + np.cos(2.0 * np.pi * (x - 20.0 / 24.0))) / 2.0) ** 6,
        )
    elif shape == "plateau":  # business hours: ramps of 2 h to a flat top from 9h to 17h
        out = np.clip(np.minimum((x * 24.0 - 7.0) / 2.0, (19.0 - x * 24.0) / 2.0), 0.0, 1.0)
    else:
        raise ValueError(f"shape={shape!r}: choose from {', '.join(DAY_SHAPES)}")
    return out


def noisy_day(
    mean_rps: float,
    *,
    shape: str = "single",
    peak_to_trough: float = 5.0,
    noise_sigma: float = 0.1,
    noise_correlation: float = 0.5,
    duration_s: float = 86_400.0,
    period_s: float = 86_400.0,
    seed: int = 0,
) -> Trace:
    """A day of Poisson traffic whose per-minute rate is a day shape times log-normal noise.

    Minute ``m`` has rate ``trough · (1 + (r − 1)·s(x_m)) · exp(σ·z_m − σ²/2)``, ``s`` a :data:`DAY_SHAPES`
    shape at the minute's phase, ``z`` a stationary AR(1) series of unit variance with lag-one correlation ρ
    (``noise_correlation``): the per-minute noise production traces show on top of the daily pattern (Azure
    Functions, Shahrad et al., ATC'20). ``exp(σz − σ²/2)`` has mean 1, so the noise keeps the mean rate. The
    arrivals within a minute are Poisson (so a minute's count is Poisson-modulated by the noise).

    Raises:
        ValueError: on a non-finite or out-of-range argument, or an unknown shape (the message names it).
    """
    _check("mean_rps", mean_rps, high=MAX_RATE_RPS)
    _check("peak_to_trough", peak_to_trough, low=1.0, strict=False)
    _check("noise_sigma", noise_sigma, strict=False, high=2.0)
    _check("noise_correlation", noise_correlation, strict=False, high=0.99)
    _check("duration_s", duration_s, high=MAX_REPLAY_MINUTES * 60.0)
    _check("period_s", period_s)
    minutes = math.ceil(duration_s / 60.0)
    x = ((np.arange(minutes) + 0.5) * 60.0 / period_s) % 1.0
    grid = _day_shape(shape, (np.arange(1440) + 0.5) / 1440.0)
    # the trough is set so the noise-free rate averages mean_rps over a whole period
    trough = mean_rps / (1.0 + (peak_to_trough - 1.0) * float(grid.mean()))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 16]))
    eps = rng.standard_normal(minutes)
    z = np.empty(minutes)
    rho = noise_correlation
    z[0] = eps[0]
    for m in range(1, minutes):
        z[m] = rho * z[m - 1] + math.sqrt(1.0 - rho * rho) * eps[m]
    noise = np.exp(noise_sigma * z - noise_sigma**2 / 2)
    rates = trough * (1.0 + (peak_to_trough - 1.0) * _day_shape(shape, x)) * noise
    rates = np.minimum(rates, MAX_RATE_RPS)
    trace = replay(rates.tolist(), seed=seed, name=f"day-{shape}")
    return replace(
        trace,
        duration_s=duration_s,
        description=f"noisy {shape} day: Poisson, mean {mean_rps:g} req/s over a {period_s / 3600:g} h day, "
        f"peak/trough {peak_to_trough:g}, log-normal per-minute noise σ {noise_sigma:g} (AR(1) ρ {rho:g}), "
        f"{duration_s / 3600:g} h, seed {seed}",
        blocks_from=_piecewise_poisson(rates, 60.0, duration_s, seed),
    )


def bursty_minutes(
    mean_rps: float,
    *,
    bursts_per_hour: float = 4.0,
    burst_factor: float = 2.0,
    burst_minutes: float = 3.0,
    noise_sigma: float = 0.1,
    duration_s: float = 3600.0,
    seed: int = 0,
) -> Trace:
    """Poisson traffic at ``mean_rps`` with bursts: at Poisson times (``bursts_per_hour``) the rate rises to
    ``burst_factor`` times the base for an exponentially distributed number of minutes (mean
    ``burst_minutes``, at least one), plus the log-normal per-minute noise of :func:`noisy_day` (ρ 0.5).

    Raises:
        ValueError: on a non-finite or out-of-range argument (the message names it).
    """
    _check("mean_rps", mean_rps, high=MAX_RATE_RPS)
    _check("bursts_per_hour", bursts_per_hour, strict=False, high=60.0)
    _check("burst_factor", burst_factor, low=1.0, strict=False, high=100.0)
    _check("burst_minutes", burst_minutes, high=60.0)
    _check("noise_sigma", noise_sigma, strict=False, high=2.0)
    _check("duration_s", duration_s, high=MAX_REPLAY_MINUTES * 60.0)
    minutes = math.ceil(duration_s / 60.0)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 17]))
    level = np.ones(minutes)
    starts = np.flatnonzero(rng.random(minutes) < bursts_per_hour / 60.0)
    for s in starts:
        length = max(1, round(rng.exponential(burst_minutes)))
        level[s : s + length] = burst_factor
    noise = np.exp(noise_sigma * rng.standard_normal(minutes) - noise_sigma**2 / 2)
    rates = np.minimum(mean_rps * level * noise, MAX_RATE_RPS)
    return Trace(
        name="bursty-minutes",
        description=f"bursty: Poisson at {mean_rps:g} req/s, {bursts_per_hour:g} bursts/h of {burst_factor:g}x for "
        f"~{burst_minutes:g} min, per-minute noise σ {noise_sigma:g}, {duration_s / 3600:g} h, seed {seed}",
        duration_s=duration_s,
        mean_rps=float(rates.mean()),
        rate_at=lambda t: rates[np.clip((np.asarray(t, dtype=np.float64) // 60).astype(np.int64), 0, minutes - 1)],
        blocks_from=_piecewise_poisson(rates, 60.0, duration_s, seed),
    )
