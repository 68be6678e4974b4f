"""A fleet of models on shared GPUs over time, its placement re-planned every period as the rates move.

The loop of ``benchmarks/fleet_shared.py`` and of ``batchfill simulate --fleet``. Time is cut into periods; in
each period ``k``:

* the joint plan (:func:`batchfill.policy.placement.plan_placement`) is made on ``planned_rps[k]`` (what the
  operator measured, e.g. the previous period's rates), keeping the placement in force unless re-packing pays
  (its hysteresis); one model per GPU runs ``max(1, ceil(λ / (u C)))`` replicas per model on the same rates;
* both are served the period's true rates ``true_rps[k]``, split as planned (or with the dedicated GPUs following
  the true rate, ``follow_dedicated``: :func:`split_rate`) (a model's dedicated GPUs each take
  ``C / design rate`` of its traffic, its shared GPU the residual's share): every shared GPU is simulated
  (:func:`batchfill.sim.shared.simulate_shared`), and one replica of each dedicated set and of each model's one
  model per GPU set (:func:`batchfill.sim.batcher.simulate_batcher`; the replicas of a set are alike), for
  ``sample_s`` seconds after a :data:`WARMUP_S` warm-up, under fresh Poisson arrivals.

With ``replan_after_s`` (what the operator does: controller/pool_plan.py plans its pool again as soon as a member's
rate rises 10 % above the rate its placement was planned at, and every 60 s anyway), period ``k`` is served in two
parts: for its first ``replan_after_s`` seconds (the rate window, the loop's tick and a move) by the placement in
force, planned in the period before; then by a placement planned on ``planned_rps[k]``, the rates the operator
observes in the period (with the placement in force as the current one, so its hysteresis applies). Both parts
have the dedicated GPUs following the true rate. GPUs and requests count each part for its share of the period.

Counted: GPUs held per period (GPU-hours = GPUs x period), the fractional bound Σ_m λ_m(t) / C_m, moves, and per
model the requests and those within the model's server budget (SLO attainment). Sampling a window per period
bounds the work and starts each window empty; the warm-up discards that transient.

Pure: no I/O; the planning clock is passed in (``clock``), arrivals come from a seeded generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from batchfill.api.spec import BatchedModelSpec
from batchfill.policy.placement import ModelDemand, ModelPlacement, Placement, plan_placement
from batchfill.policy.plan import PlanResult
from batchfill.policy.profile import LatencyProfile
from batchfill.sim.batcher import simulate_batcher
from batchfill.sim.shared import SharedModel, simulate_shared

FloatArray = npt.NDArray[np.float64]
#: Seconds simulated before each period's sample is counted (the window starts empty).
WARMUP_S = 10.0
SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class FleetModels:
    """The models of a fleet, in a fixed order (the columns of the rate arrays).

    Attributes:
        names: unique model names.
        specs: each one's spec, with a profile, by name.
        plans: each one's own plan (:func:`batchfill.policy.plan.plan_batching`), by name.
        memory_mib: GPU memory each holds when loaded, MiB, by name.
    """

    names: tuple[str, ...]
    specs: Mapping[str, BatchedModelSpec]
    plans: Mapping[str, PlanResult]
    memory_mib: Mapping[str, float]


@dataclass
class FleetRun:
    """What :func:`replan_fleet` counted, one entry per period.

    Attributes:
        period_h: length of a period, hours.
        shared_gpus: GPUs of the shared placement (dedicated + shared; with a re-plan within the period, the mean over
            the period).
        dedicated_gpus: the dedicated ones among them.
        single_gpus: GPUs of one model per GPU.
        bound: the fractional bound Σ λ / C at the true rates, GPUs.
        moves: models moved between shared GPUs by that period's re-plan.
        plan_s: planning time by ``clock``, s (0 without one).
        fill: mean Σ design rate / C over the shared GPUs (0 without shared GPUs).
        busy: each simulated shared GPU's busy fraction (Σ l(b) of its batches over the time simulated), every
            period's in turn.
        attainment_shared, attainment_single: per model ``[requests, within budget]`` over the whole run (the part of a
            period served after a re-plan weighs its share of the period: not whole numbers then).
        placements: the placement in force each period.
    """

    period_h: float
    shared_gpus: list[float] = field(default_factory=list)
    dedicated_gpus: list[float] = field(default_factory=list)
    single_gpus: list[int] = field(default_factory=list)
    bound: list[float] = field(default_factory=list)
    moves: list[int] = field(default_factory=list)
    plan_s: list[float] = field(default_factory=list)
    fill: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    attainment_shared: dict[str, list[float]] = field(default_factory=dict)
    attainment_single: dict[str, list[float]] = field(default_factory=dict)
    placements: list[Placement] = field(default_factory=list)

    def gpu_hours(self) -> tuple[float, float, float]:
        """(shared placement, one model per GPU, fractional bound), GPU-hours."""
        return (
            sum(self.shared_gpus) * self.period_h,
            sum(self.single_gpus) * self.period_h,
            sum(self.bound) * self.period_h,
        )


def attainment(counts: Mapping[str, Sequence[float]]) -> tuple[float, float, str]:
    """(all requests in SLO, the worst model's fraction in SLO, its name) from per model ``[requests, within]``;
    a model without requests counts as 1.0. Raises ValueError for an empty mapping."""
    if not counts:
        raise ValueError("no models")
    total = sum(c for c, _ in counts.values())
    ok = sum(o for _, o in counts.values())

    def frac(name: str) -> float:
        c, o = counts[name]
        return o / c if c else 1.0

    worst = min(counts, key=frac)
    return (ok / total if total else 1.0), frac(worst), worst


def diurnal_rates(
    mean_rps: Sequence[float],
    periods: int,
    period_s: float,
    *,
    peak_to_trough: float,
    noise_sigma: float,
    rng: np.random.Generator,
) -> FloatArray:
    """Per period and model, a diurnal mean rate: ``mean · (1 + a sin(2π t / day + φ_m)) · ε``, req/s.

    ``a = (r - 1) / (r + 1)`` for peak/trough ``r``; ``t`` is the period's midpoint; each model's phase ``φ_m`` is
    drawn uniform in [0, 2π) (first, from ``rng``), then log-normal noise ``ε`` of mean 1 and log-σ
    ``noise_sigma`` per period and model. Shape ``[periods, len(mean_rps)]``.

    Raises:
        ValueError: ``peak_to_trough`` < 1, a negative ``noise_sigma``, ``periods`` < 1 or ``period_s`` <= 0.
    """
    if not (peak_to_trough >= 1 and noise_sigma >= 0 and periods >= 1 and period_s > 0):
        raise ValueError(
            f"peak_to_trough={peak_to_trough} must be >= 1, noise_sigma={noise_sigma} >= 0, periods={periods} >= 1 "
            f"and period_s={period_s} > 0"
        )
    mean = np.asarray(mean_rps, dtype=np.float64)
    amplitude = (peak_to_trough - 1) / (peak_to_trough + 1)
    phase = rng.uniform(0, 2 * math.pi, size=len(mean))
    t = (np.arange(periods) + 0.5) * period_s / SECONDS_PER_DAY * 2 * math.pi
    shape = 1 + amplitude * np.sin(t[:, None] + phase[None, :])
    noise = rng.lognormal(-(noise_sigma**2) / 2, noise_sigma, size=(periods, len(mean)))
    out: FloatArray = mean[None, :] * shape * noise
    return out


def _arrivals(rate_rps: float, seconds: float, rng: np.random.Generator) -> FloatArray:
    n = rng.poisson(rate_rps * seconds)
    return np.sort(rng.uniform(0.0, seconds * 1000.0, size=n))


def _counted(arr: FloatArray, lat: FloatArray, budget_ms: float) -> tuple[int, int]:
    keep = arr >= WARMUP_S * 1000.0
    return int(keep.sum()), int(np.count_nonzero(lat[keep] <= budget_ms))


def _one_replica(
    fleet: FleetModels, name: str, rate_rps: float, span_s: float, rng: np.random.Generator
) -> tuple[int, int]:
    """[requests, within budget] of one replica of ``name`` alone on a GPU at ``rate_rps``."""
    plan = fleet.plans[name]
    table = LatencyProfile.from_points(fleet.specs[name].profile or []).table(plan.chosen.batcher.batch_cap)
    arr = _arrivals(rate_rps, span_s, rng)
    run = simulate_batcher(arr.tolist(), plan.chosen.batcher, table)
    return _counted(arr, run.latencies_ms, plan.server_budget_ms)


def split_rate(m: ModelPlacement, true_rps: float, utilization: float, follow: bool) -> tuple[float, int, float]:
    """(rate sent to its shared GPU, dedicated GPUs, rate sent to each of them), req/s, for one model of a placement
    serving ``true_rps``.

    Planned (``follow`` False): its planned dedicated GPUs, the traffic split by the planned rates (each dedicated GPU
    ``C / design rate`` of it, the shared GPU ``shared rate / design rate``). Following the rate (``follow`` True),
    a model with dedicated GPUs is scaled as the operator's scaling does every 15 s (policy/scaling.py; the
    proportional count ``n* = ceil(rest / (u C))`` is the target, a scale-out needs evidence): its shared GPU takes the
    planned share but at most the rate it was checked at, the rest goes to its dedicated GPUs, which scale out to
    ``n*`` when each would carry more than ``C`` and in to ``n*`` when it is below the planned count. A model only on a
    shared GPU is served as planned (a whole GPU for its excess is what the re-plan decides).
    """
    c = m.capacity_rps
    share = m.shared_rate_rps / m.design_rate_rps if m.design_rate_rps > 0 else 1.0
    if not m.dedicated_gpus:
        return true_rps, 0, 0.0
    if not follow:
        each = true_rps * c / m.design_rate_rps
        return (true_rps * share if m.shared_gpu is not None else 0.0), m.dedicated_gpus, each
    to_shared = min(true_rps * share, m.shared_rate_rps) if m.shared_gpu is not None else 0.0
    rest = true_rps - to_shared
    n = followed_replicas(m.dedicated_gpus, rest, utilization, c)
    return to_shared, n, rest / n


def followed_replicas(planned: int, rate_rps: float, utilization: float, capacity_rps: float) -> int:
    """Replicas (>= 1) after the operator's scaling follows ``rate_rps`` from ``planned`` replicas: the proportional
    count ``n* = ceil(rate / (u C))`` when one of ``planned`` replicas would carry more than ``C`` (saturated, the
    evidence a scale-out needs) or when ``n*`` is below ``planned`` (scale-in); ``planned`` otherwise."""
    target = max(1, math.ceil(rate_rps / (utilization * capacity_rps) - 1e-9))
    saturated = math.ceil(rate_rps / capacity_rps - 1e-9) > planned
    return target if saturated else min(planned, target)


def serve_shared(
    fleet: FleetModels,
    p: Placement,
    true_rps: Mapping[str, float],
    sample_s: float,
    rng: np.random.Generator,
    follow: bool = False,
) -> tuple[int, dict[str, list[int]], list[float]]:
    """Dedicated GPUs used, per model [requests, within budget], and each shared GPU's busy fraction (Σ l(b) over
    the time simulated), of one period: the placement ``p`` serving the true rates, split by :func:`split_rate`."""
    out = {n: [0, 0] for n in fleet.names}
    busy: list[float] = []
    span = sample_s + WARMUP_S
    split = {
        m.name: split_rate(m, true_rps[m.name], fleet.specs[m.name].scaling.targetUtilization, follow) for m in p.models
    }
    for s in p.shared:
        models, arrivals = [], []
        for name in s.tenants:
            m = p.model(name)
            table = LatencyProfile.from_points(fleet.specs[name].profile or []).table(m.config.batcher.batch_cap)
            models.append(SharedModel(m.config.batcher, tuple(table), fleet.plans[name].server_budget_ms))
            arrivals.append(_arrivals(split[name][0], span, rng))
        run = simulate_shared(arrivals, models)
        busy.append(run.gpu_busy_fraction)
        for name, arr, lat, sm in zip(s.tenants, arrivals, run.latencies_ms, models, strict=True):
            n, ok = _counted(arr, lat, sm.budget_ms)
            out[name][0] += n
            out[name][1] += ok
    dedicated = 0
    for m in p.models:
        _, gpus, each = split[m.name]
        if gpus:
            dedicated += gpus
            n, ok = _one_replica(fleet, m.name, each, span, rng)
            out[m.name][0] += n * gpus
            out[m.name][1] += ok * gpus
    return dedicated, out, busy


def serve_one_per_gpu(
    fleet: FleetModels,
    planned_rps: Mapping[str, float],
    true_rps: Mapping[str, float],
    sample_s: float,
    rng: np.random.Generator,
    follow: bool = False,
) -> tuple[int, dict[str, list[int]]]:
    """GPUs of one model per GPU sized on the planned rates (then following the true ones when ``follow``:
    :func:`followed_replicas`), and per model [requests, within budget] at the true."""
    gpus = 0
    out: dict[str, list[int]] = {}
    for name in fleet.names:
        c = fleet.plans[name].chosen.capacity_rps
        u = fleet.specs[name].scaling.targetUtilization
        n = max(1, math.ceil(planned_rps[name] / (u * c) - 1e-9))
        if follow:
            n = followed_replicas(n, true_rps[name], u, c)
        gpus += n
        k, ok = _one_replica(fleet, name, true_rps[name] / n, sample_s + WARMUP_S, rng)
        out[name] = [k * n, ok * n]
    return gpus, out


def _fill(p: Placement) -> float:
    loads = [sum(r / p.model(n).capacity_rps for n, r in zip(g.tenants, g.rates_rps, strict=True)) for g in p.shared]
    return float(np.mean(loads)) if loads else 0.0


def _serve_parts(
    run: FleetRun,
    fleet: FleetModels,
    parts: Sequence[tuple[Placement, float, float]],
    true: Mapping[str, float],
    rng: np.random.Generator,
    follow: bool,
    period_s: float | None,
) -> None:
    """Serve one period's ``parts`` (placement, seconds sampled, weight of its counts) and add to ``run`` its
    shared placement's GPUs (with ``period_s``: each part's GPUs for its share of the period) and requests."""
    gpus_s = dedicated_s = 0.0
    for placement, span_s, weight in parts:
        dedicated, served, busy = serve_shared(fleet, placement, true, span_s, rng, follow)
        run.busy += busy
        share = span_s * weight / period_s if period_s is not None else 1.0
        gpus_s += (len(placement.shared) + dedicated) * share
        dedicated_s += dedicated * share
        for n, (c, ok) in served.items():
            run.attainment_shared[n][0] += c * weight
            run.attainment_shared[n][1] += ok * weight
    run.shared_gpus.append(gpus_s)
    run.dedicated_gpus.append(dedicated_s)


def replan_fleet(
    fleet: FleetModels,
    true_rps: FloatArray,
    planned_rps: FloatArray,
    *,
    period_s: float,
    sample_s: float,
    gpu_memory_mib: float,
    seed: int,
    clock: Callable[[], float] | None = None,
    on_period: Callable[[int, FleetRun], None] | None = None,
    follow_dedicated: bool = False,
    replan_after_s: float | None = None,
) -> FleetRun:
    """Re-plan and serve the fleet period by period (module docstring).

    Args:
        fleet: the models; the columns of the rate arrays follow ``fleet.names``.
        true_rps: ``[period, model]`` mean rate each period is served at, req/s.
        planned_rps: ``[period, model]`` rate each period is planned on, req/s (same shape).
        period_s: length of a period, s (GPU-hours count GPUs x period).
        sample_s: simulated seconds per period after the warm-up.
        gpu_memory_mib: memory of one GPU, MiB.
        seed: seed of the plans; the arrivals use ``seed + 1``.
        clock: seconds from a monotonic clock, to time each plan (e.g. ``time.perf_counter``); None: 0.
        on_period: called after each period with its index and the run so far (progress).
        follow_dedicated: dedicated GPUs (of both placements) follow each period's true rate, as the operator's
            scaling does every 15 s; the shared GPUs keep the plan (:func:`split_rate`). False: both as planned.
        replan_after_s: serve each period's first seconds with the placement in force, then re-plan on
            ``planned_rps`` of the period (module docstring); the dedicated GPUs follow the rate. None: one plan per
            period, made at its start.

    Raises:
        ValueError: rate arrays of different shapes or not ``len(fleet.names)`` columns, a non-positive period or
            sample; as :func:`plan_placement` (also SpecError).
    """
    if true_rps.shape != planned_rps.shape or true_rps.ndim != 2 or true_rps.shape[1] != len(fleet.names):
        raise ValueError(
            f"true_rps {true_rps.shape} and planned_rps {planned_rps.shape} must both be [period, "
            f"{len(fleet.names)} models]"
        )
    if not (period_s > 0 and sample_s > 0):
        raise ValueError(f"period_s={period_s} and sample_s={sample_s} must be > 0")
    if replan_after_s is not None and not 0 < replan_after_s < period_s:
        raise ValueError(f"replan_after_s={replan_after_s} must be within the period (0, {period_s})")
    rng = np.random.default_rng(seed + 1)
    run = FleetRun(period_s / 3600.0)
    run.attainment_shared = {n: [0.0, 0.0] for n in fleet.names}
    run.attainment_single = {n: [0.0, 0.0] for n in fleet.names}
    current: Placement | None = None
    for k in range(true_rps.shape[0]):
        seen = dict(zip(fleet.names, planned_rps[k].tolist(), strict=True))
        true = dict(zip(fleet.names, true_rps[k].tolist(), strict=True))
        demands = [ModelDemand(n, fleet.specs[n], seen[n], fleet.memory_mib[n]) for n in fleet.names]
        parts: list[tuple[Placement, float, float]] = []  # (placement, seconds sampled, weight of its counts)
        if replan_after_s is not None and current is not None:
            parts.append((current, replan_after_s, 1.0))
        t0 = clock() if clock else 0.0
        current = plan_placement(demands, gpu_memory_mib, current=current, seed=seed, solo_plans=fleet.plans)
        run.plan_s.append(clock() - t0 if clock else 0.0)
        rest_s = period_s - (parts[0][1] if parts else 0.0)
        parts.append((current, sample_s, rest_s / sample_s if replan_after_s is not None else 1.0))
        run.placements.append(current)
        run.moves.append(current.moves)
        run.fill.append(_fill(current))
        follow = follow_dedicated or replan_after_s is not None
        _serve_parts(run, fleet, parts, true, rng, follow, period_s if replan_after_s is not None else None)
        gpus, per = serve_one_per_gpu(fleet, seen, true, sample_s, rng, follow)
        run.single_gpus.append(gpus)
        for n, (c, ok) in per.items():
            run.attainment_single[n][0] += c
            run.attainment_single[n][1] += ok
        run.bound.append(sum(true[n] / fleet.plans[n].chosen.capacity_rps for n in fleet.names))
        if on_period is not None:
            on_period(k, run)
    return run
