"""Run one BatchedModel against a trace under several autoscalers and compare GPU-hours at SLA.

Policies (names are API of ``batchfill simulate --policies``):

* ``batchfill``: the operator's policy (``policy.scaling.decide``).
* ``hpa-gpu``: Kubernetes HPA on GPU utilization (DCGM duty cycle), target ``hpa_gpu_target`` (default 80 %, the
  setting GPU autoscaling guides commonly show); ``hpa-gpu@<percent>`` sets another target (``hpa-gpu@90``), so
  the benchmark can also compare against the best-tuned target.
* ``keda-rps``: KEDA/HPA on requests per second per replica, target ``u · C`` (the plan's capacity at the spec's
  target utilization: the best a user could choose, found with this project's planner).
* ``keda-queue``: KEDA/HPA on Triton's average queue time, target the mean queue time the simulator predicts
  for one replica at ``u · C`` (again the best-informed choice).
* ``static-peak``: ``ceil(peak / C)`` replicas all the time, ``peak`` the highest per-minute arrival rate of the
  trace: the fewest static replicas whose capacity at SLA covers the peak minute (no headroom: stricter than
  common practice, so savings against it are not overstated).
* ``hpa-gpu@best``: the HPA on GPU utilization at the target that is cheapest while it keeps 99.9 % of requests
  within the SLA on this trace (:func:`batchfill.compare.baselines.best_hpa_target`; several runs).
* ``<configuration>/<autoscaler>`` (``batching-off/hpa-gpu``, ``seed-rule/static-peak``, ...): what teams run
  today, a Triton batching configuration other than the plan behind ``hpa-gpu``, ``hpa-gpu@<percent>``,
  ``hpa-gpu@best`` or ``static-peak`` (:mod:`batchfill.compare.baselines`); ``baselines`` names them all.

Lower bounds (not simulated): ``∫ ceil(λ_m / C) dt`` (whole replicas, the bound the done-when ratios use) and
``∫ λ_m / C dt`` (fractional GPUs), with ``λ_m`` the arrival rate of each minute.

Pure: deterministic for the same spec, trace and options.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import numpy.typing as npt

from batchfill.api.spec import BatchedModelSpec
from batchfill.api.status import PlanStatus
from batchfill.compare.autoscalers import (
    BatchfillAutoscaler,
    HorizontalPodAutoscaler,
    StaticAutoscaler,
    gpu_utilization_metric,
    queue_time_metric,
    request_rate_metric,
)
from batchfill.compare.baselines import (
    BASELINE_POLICIES,
    Batching,
    Configuration,
    best_hpa_target,
    configuration,
    parse_policy,
)
from batchfill.compare.errors import CompareError as CompareError  # the comparison's error, re-exported
from batchfill.policy.plan import plan_batching, replicas_for
from batchfill.policy.profile import LatencyProfile
from batchfill.sim.batcher import BatcherConfig, poisson_unit_arrivals, simulate_batcher
from batchfill.sim.fleet import (
    Autoscaler,
    FleetConfig,
    FleetRun,
    lower_bound_gpu_seconds,
    minute_rates,
    simulate_fleet,
)
from batchfill.sim.routing import BALANCING, ROUND_ROBIN
from batchfill.sim.traces import Trace

POLICIES = ("batchfill", "hpa-gpu", "keda-rps", "keda-queue", "static-peak")
#: A policy name that stands for every baseline (:data:`batchfill.compare.baselines.BASELINE_POLICIES`).
BASELINES_ALIAS = "baselines"
#: Requests simulated to find the baselines' best-informed targets at u·C.
_TARGET_REQUESTS = 100_000


@dataclass(frozen=True)
class Options:
    """Fleet and baseline settings shared by every policy of one comparison.

    Attributes:
        startup_s: replica start-up (scheduling + model load), seconds.
        tick_s: autoscaler period (operator's reconcile interval, HPA's sync period), seconds.
        scrape_s: Prometheus scrape interval, seconds.
        window_s: signal window (the operator's BATCHFILL_SIGNAL_WINDOW_SECONDS; KEDA queries' ``[1m]``), seconds.
        hpa_gpu_target: HPA GPU-utilization target, fraction in (0, 1].
        seed: seed of the planner's draws (and of the random load balancing).
        balancing: how the Service spreads requests, ``round-robin`` or ``random`` (:mod:`batchfill.sim.routing`).
    """

    startup_s: float = 60.0
    tick_s: float = 15.0
    scrape_s: float = 15.0
    window_s: float = 60.0
    hpa_gpu_target: float = 0.8
    seed: int = 0
    balancing: str = ROUND_ROBIN


@dataclass(frozen=True)
class Setup:
    """The plan and the numbers every policy shares.

    Attributes:
        spec: the BatchedModel spec.
        plan: its ``status.plan``.
        batcher: the planned batcher settings of one replica.
        latency_ms: execution latency table ``[0, l(1), ..., l(B)]``, ms.
        capacity_rps: capacity at SLA per replica C, req/s.
        per_replica_target_rps: ``u · C``, req/s.
        queue_ms_at_target: simulated mean queue time per request for one replica at ``u · C``, ms.
        gpu_busy_at_target: simulated GPU busy fraction of one replica at ``u · C``.
        fill_at_target: ``status.plan.batchFillAtTarget``.
    """

    spec: BatchedModelSpec
    plan: PlanStatus
    batcher: BatcherConfig
    latency_ms: tuple[float, ...]
    capacity_rps: float
    per_replica_target_rps: float
    queue_ms_at_target: float
    gpu_busy_at_target: float
    fill_at_target: float | None

    @property
    def gpus_per_replica(self) -> int:
        """Units of spec.triton.gpuResource each replica holds (whole GPUs, or MIG slices: GPU-hours count these
        units); a CPU-only spec (0) counts one accelerator per replica."""
        return max(1, self.spec.triton.gpusPerReplica)


def one_replica_at(
    batcher: BatcherConfig, table: Sequence[float], rate_rps: float, *, seed: int, requests: int = _TARGET_REQUESTS
) -> tuple[float, float]:
    """(GPU busy fraction, mean queue time per request in ms) of one replica under Poisson load at ``rate_rps``."""
    arrivals = (poisson_unit_arrivals(requests, seed) * (1000.0 / rate_rps)).tolist()
    run = simulate_batcher(arrivals, batcher, table)
    exec_ms = np.asarray(table)[run.batch_sizes]
    busy = float(exec_ms.sum()) / (run.dispatch_ms[-1] + exec_ms[-1]) / batcher.executors
    queue = float(run.latencies_ms.mean() - np.dot(exec_ms, run.batch_sizes) / run.batch_sizes.sum())
    return busy, queue


def prepare(spec: BatchedModelSpec, *, seed: int = 0) -> Setup:
    """Plan ``spec`` and simulate one replica at ``u · C`` for the baselines' targets.

    Raises:
        CompareError: when the spec has no profile or the plan has no capacity at SLA.
        SpecError: (``InfeasibleSLAError``) when not even batch size 1 fits the budget; names the field.
    """
    if not spec.profile:
        raise CompareError("spec.profile is required to simulate a fleet (measure it with `batchfill profile`)")
    result = plan_batching(spec, seed=seed)
    plan = result.to_status()
    capacity = result.chosen.capacity_rps
    if not (math.isfinite(capacity) and capacity > 0):
        raise CompareError(
            f"the plan has no capacity at SLA (status.plan.capacityPerReplicaRps={plan.capacityPerReplicaRps}); "
            "the SLA is infeasible for this profile"
        )
    batcher = result.chosen.batcher
    table = tuple(LatencyProfile.from_points(spec.profile).table(batcher.batch_cap))
    u = spec.scaling.targetUtilization
    rate = u * capacity
    busy, queue = one_replica_at(batcher, table, rate, seed=seed + 7)
    return Setup(
        spec=spec,
        plan=plan,
        batcher=batcher,
        latency_ms=table,
        capacity_rps=capacity,
        per_replica_target_rps=rate,
        queue_ms_at_target=max(queue, 1e-3),
        gpu_busy_at_target=min(1.0, busy),
        fill_at_target=result.batch_fill_at_target,
    )


def arrivals_per_minute(trace: Trace) -> npt.NDArray[np.int64]:
    """Arrivals in each minute of ``trace`` (one pass over its blocks)."""
    minutes = np.zeros(max(1, math.ceil(trace.duration_s / 60.0)), dtype=np.int64)
    for block in trace.blocks(60.0):
        if len(block):
            minutes += np.bincount((block // 60.0).astype(np.int64), minlength=len(minutes))[: len(minutes)]
    return minutes


def static_peak_replicas(minutes: npt.NDArray[np.int64], duration_s: float, capacity_rps: float) -> int:
    """``ceil(peak minute rate / C)``, at least 1."""
    peak = float(minute_rates(minutes, duration_s).max()) if len(minutes) else 0.0
    return max(1, math.ceil(peak / capacity_rps - 1e-9))


def make_autoscaler(name: str, setup: Setup, options: Options, static_replicas: int) -> Autoscaler:
    """The autoscaler called ``name`` (see :data:`POLICIES`; a baseline's ``<configuration>/`` prefix is only
    the autoscaler's name here: its batcher is the fleet's).

    Raises:
        CompareError: for an unknown name, and for ``hpa-gpu@best``, which is several runs (:func:`compare`).
    """
    s = setup.spec.scaling
    kind = parse_policy(name).scaler
    if kind == "batchfill":
        return BatchfillAutoscaler(setup.plan, s)
    if kind == "hpa-gpu" or kind.startswith("hpa-gpu@"):
        target = options.hpa_gpu_target if kind == "hpa-gpu" else hpa_gpu_target_of(kind)
        return HorizontalPodAutoscaler(name, gpu_utilization_metric(target), s.minReplicas, s.maxReplicas)
    if kind == "keda-rps":
        return HorizontalPodAutoscaler(
            name, request_rate_metric(setup.per_replica_target_rps), s.minReplicas, s.maxReplicas
        )
    if kind == "keda-queue":
        return HorizontalPodAutoscaler(name, queue_time_metric(setup.queue_ms_at_target), s.minReplicas, s.maxReplicas)
    if kind == "static-peak":
        return StaticAutoscaler(static_replicas, name)
    raise CompareError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


@dataclass(frozen=True)
class Comparison:
    """Every policy's run on one trace, with the lower bounds.

    Attributes:
        setup: plan and targets.
        trace_description: the trace.
        duration_s: its length, seconds.
        runs: one :class:`FleetRun` per policy, in the order asked (``policy`` is the name asked).
        lower_bound_gpu_seconds: whole-replica bound ``∫ ceil(λ_m/C) dt`` with the plan's C, GPU·s.
        fractional_bound_gpu_seconds: ``∫ λ_m/C dt``, GPU·s.
        static_replicas: the static-peak count of the plan.
        peak_rps: highest per-minute arrival rate, req/s.
        mean_rps: mean arrival rate, req/s.
        options: the fleet settings.
        baselines: the baseline configurations the runs used, in the order first asked.
        best_targets: for each ``...hpa-gpu@best`` policy, the target it chose (fraction).
    """

    setup: Setup
    trace_description: str
    duration_s: float
    runs: tuple[FleetRun, ...]
    lower_bound_gpu_seconds: float
    fractional_bound_gpu_seconds: float
    static_replicas: int
    peak_rps: float
    mean_rps: float
    options: Options = field(default_factory=Options)
    baselines: tuple[Configuration, ...] = ()
    best_targets: dict[str, float] = field(default_factory=dict)

    def run(self, policy: str) -> FleetRun | None:
        return next((r for r in self.runs if r.policy == policy), None)

    def baseline(self, batching: Batching) -> Configuration | None:
        return next((b for b in self.baselines if b.batching is batching), None)


def hpa_gpu_target_of(name: str) -> float:
    """``hpa-gpu@85`` -> 0.85.

    Raises:
        CompareError: a suffix that is not a percentage in (0, 100].
    """
    try:
        pct = float(name.partition("@")[2])
    except ValueError:
        pct = math.nan
    if not 0 < pct <= 100:
        raise CompareError(f"policy {name!r}: the target after '@' must be a percentage in (0, 100] or 'best'")
    return pct / 100.0


def expand_policies(policies: Sequence[str]) -> list[str]:
    """``policies`` with :data:`BASELINES_ALIAS` replaced by every baseline policy (first occurrences kept)."""
    out: list[str] = []
    for p in policies:
        for name in BASELINE_POLICIES if p == BASELINES_ALIAS else (p,):
            if name not in out:
                out.append(name)
    return out


def check_policies(policies: Sequence[str]) -> None:
    """Raises CompareError naming the first unknown policy and the choices."""
    if not policies:
        raise CompareError(f"no policy given; choose from {', '.join(POLICIES)}")
    for p in expand_policies(policies):
        kind = parse_policy(p).scaler
        if kind.startswith("hpa-gpu@") and kind != "hpa-gpu@best":
            hpa_gpu_target_of(p)
        elif kind not in POLICIES and kind != "hpa-gpu@best":
            raise CompareError(f"unknown policy {p!r}; choose from {', '.join(POLICIES)}")


def _check_options(opts: Options) -> None:
    if not 0 < opts.hpa_gpu_target <= 1:
        raise CompareError(f"hpa_gpu_target={opts.hpa_gpu_target} must be in (0, 1]")
    if opts.balancing not in BALANCING:
        raise CompareError(f"balancing={opts.balancing!r}: choose from {', '.join(BALANCING)}")


def compare(
    spec: BatchedModelSpec,
    trace: Trace,
    policies: Sequence[str] = POLICIES,
    options: Options | None = None,
    *,
    setup: Setup | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> Comparison:
    """Simulate ``trace`` under each policy (sequentially, deterministic).

    Args:
        spec: the BatchedModel spec (profile required).
        trace: the arrivals.
        policies: names from :data:`POLICIES`, ``hpa-gpu@<percent>``, ``hpa-gpu@best``, baselines
            (``<configuration>/<autoscaler>``) or :data:`BASELINES_ALIAS`.
        options: fleet settings.
        setup: a prepared setup (from :func:`prepare`) to reuse.
        progress: called with (policy, simulated seconds) while a policy runs.

    Raises:
        CompareError: unknown policy, no profile, infeasible plan, a baseline the model cannot run.

    Long because each policy's fleet (its batching configuration, capacity, first count) is assembled here,
    and an ``@best`` policy is a search over runs that share the cache of runs by target.
    """
    opts = options or Options()
    _check_options(opts)
    check_policies(policies)
    names = expand_policies(policies)
    st = setup or prepare(spec, seed=opts.seed)
    minutes = arrivals_per_minute(trace)
    rates = minute_rates(minutes, trace.duration_s)
    s = spec.scaling
    plan_conf = (st.batcher, st.latency_ms, st.capacity_rps)
    confs: dict[Batching, Configuration] = {}
    hpa_runs: dict[tuple[Batching | None, float], FleetRun] = {}
    best_targets: dict[str, float] = {}

    def fleet(batching: Batching | None, name: str, auto: Autoscaler, static: bool) -> FleetRun:
        batcher, table, capacity = plan_conf
        if batching is not None:
            conf = confs[batching]
            batcher, table, capacity = conf.batcher, conf.latency_ms, conf.capacity_rps
        peak = static_peak_replicas(minutes, trace.duration_s, capacity)
        first = replicas_for(float(rates[0]), capacity, s.targetUtilization, max(1, s.minReplicas), s.maxReplicas)
        config = FleetConfig(
            batcher=batcher,
            latency_ms=table,
            budget_ms=st.plan.serverBudgetMs,
            gpus_per_replica=st.gpus_per_replica,
            initial_replicas=peak if static else first,
            startup_s=opts.startup_s,
            tick_s=opts.tick_s,
            scrape_s=opts.scrape_s,
            window_s=opts.window_s,
            warmup_s=opts.window_s,  # the fleet starts Ready at the first minute's need, with no signal history
            balancing=opts.balancing,
            balancing_seed=opts.seed,
        )
        report = None if progress is None else (lambda t: progress(name, t))
        return simulate_fleet(trace, config, auto, progress=report)

    def hpa_at(batching: Batching | None, name: str, target: float) -> FleetRun:
        if (batching, target) not in hpa_runs:
            auto = HorizontalPodAutoscaler(name, gpu_utilization_metric(target), s.minReplicas, s.maxReplicas)
            hpa_runs[(batching, target)] = fleet(batching, name, auto, static=False)
        return replace(hpa_runs[(batching, target)], policy=name)

    runs = []
    for name in names:
        parsed = parse_policy(name)
        if parsed.batching is not None and parsed.batching not in confs:
            confs[parsed.batching] = configuration(parsed.batching, spec, st.plan, seed=opts.seed)
        if parsed.scaler == "hpa-gpu@best":
            target, run = best_hpa_target(partial(hpa_at, parsed.batching, name))
            best_targets[name] = target
            runs.append(replace(run, policy=name))
            continue
        if parsed.scaler == "hpa-gpu" or parsed.scaler.startswith("hpa-gpu@"):
            target = opts.hpa_gpu_target if parsed.scaler == "hpa-gpu" else hpa_gpu_target_of(parsed.scaler)
            runs.append(hpa_at(parsed.batching, name, target))
            continue
        capacity = confs[parsed.batching].capacity_rps if parsed.batching is not None else st.capacity_rps
        auto = make_autoscaler(name, st, opts, static_peak_replicas(minutes, trace.duration_s, capacity))
        runs.append(fleet(parsed.batching, name, auto, static=parsed.scaler == "static-peak"))
    gpus = st.gpus_per_replica
    return Comparison(
        setup=st,
        trace_description=trace.description,
        duration_s=trace.duration_s,
        runs=tuple(runs),
        lower_bound_gpu_seconds=lower_bound_gpu_seconds(minutes, st.capacity_rps, gpus, duration_s=trace.duration_s),
        fractional_bound_gpu_seconds=lower_bound_gpu_seconds(
            minutes, st.capacity_rps, gpus, duration_s=trace.duration_s, whole_replicas=False
        ),
        static_replicas=static_peak_replicas(minutes, trace.duration_s, st.capacity_rps),
        peak_rps=float(rates.max()),
        mean_rps=float(minutes.sum()) / trace.duration_s,
        options=opts,
        baselines=tuple(confs.values()),
        best_targets=best_targets,
    )
