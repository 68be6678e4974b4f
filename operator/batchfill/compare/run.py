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

Lower bounds (not simulated): ``∫ ceil(λ_m / C) dt`` (whole replicas, the bound the done-when ratios use) and
``∫ λ_m / C dt`` (fractional GPUs), with ``λ_m`` the arrival rate of each minute.

Pure: deterministic for the same spec, trace and options.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
from batchfill.sim.traces import Trace

POLICIES = ("batchfill", "hpa-gpu", "keda-rps", "keda-queue", "static-peak")
#: Requests simulated to find the baselines' best-informed targets at u·C.
_TARGET_REQUESTS = 100_000


class CompareError(ValueError):
    """A comparison that cannot run; the message names the field and the numbers."""


@dataclass(frozen=True)
class Options:
    """Fleet and baseline settings shared by every policy of one comparison.

    Attributes:
        startup_s: replica start-up (scheduling + model load), seconds.
        tick_s: autoscaler period (operator's reconcile interval, HPA's sync period), seconds.
        scrape_s: Prometheus scrape interval, seconds.
        window_s: signal window (the operator's BATCHFILL_SIGNAL_WINDOW_SECONDS; KEDA queries' ``[1m]``), seconds.
        hpa_gpu_target: HPA GPU-utilization target, fraction in (0, 1].
        seed: seed of the planner's draws.
    """

    startup_s: float = 60.0
    tick_s: float = 15.0
    scrape_s: float = 15.0
    window_s: float = 60.0
    hpa_gpu_target: float = 0.8
    seed: int = 0


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
        """GPUs each replica holds; a CPU-only spec (0) counts one accelerator per replica."""
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
    """The autoscaler called ``name`` (see :data:`POLICIES`).

    Raises:
        CompareError: for an unknown name.
    """
    s = setup.spec.scaling
    if name == "batchfill":
        return BatchfillAutoscaler(setup.plan, s)
    if name == "hpa-gpu" or name.startswith("hpa-gpu@"):
        target = options.hpa_gpu_target if name == "hpa-gpu" else hpa_gpu_target_of(name)
        return HorizontalPodAutoscaler(name, gpu_utilization_metric(target), s.minReplicas, s.maxReplicas)
    if name == "keda-rps":
        return HorizontalPodAutoscaler(
            name, request_rate_metric(setup.per_replica_target_rps), s.minReplicas, s.maxReplicas
        )
    if name == "keda-queue":
        return HorizontalPodAutoscaler(name, queue_time_metric(setup.queue_ms_at_target), s.minReplicas, s.maxReplicas)
    if name == "static-peak":
        return StaticAutoscaler(static_replicas, name)
    raise CompareError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


@dataclass(frozen=True)
class Comparison:
    """Every policy's run on one trace, with the lower bounds.

    Attributes:
        setup: plan and targets.
        trace_description: the trace.
        duration_s: its length, seconds.
        runs: one :class:`FleetRun` per policy, in the order asked.
        lower_bound_gpu_seconds: whole-replica bound ``∫ ceil(λ_m/C) dt``, GPU·s.
        fractional_bound_gpu_seconds: ``∫ λ_m/C dt``, GPU·s.
        static_replicas: the static-peak count.
        peak_rps: highest per-minute arrival rate, req/s.
        mean_rps: mean arrival rate, req/s.
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

    def run(self, policy: str) -> FleetRun | None:
        return next((r for r in self.runs if r.policy == policy), None)


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
        raise CompareError(f"policy {name!r}: the target after '@' must be a percentage in (0, 100]")
    return pct / 100.0


def check_policies(policies: Sequence[str]) -> None:
    """Raises CompareError naming the first unknown policy and the choices."""
    for p in policies:
        if p.startswith("hpa-gpu@"):
            hpa_gpu_target_of(p)
    unknown = [p for p in policies if p not in POLICIES and not p.startswith("hpa-gpu@")]
    if unknown:
        raise CompareError(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
    if not policies:
        raise CompareError(f"no policy given; choose from {', '.join(POLICIES)}")


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
        policies: names from :data:`POLICIES`.
        options: fleet settings.
        setup: a prepared setup (from :func:`prepare`) to reuse.
        progress: called with (policy, simulated seconds) while a policy runs.

    Raises:
        CompareError: unknown policy, no profile, infeasible plan.
    """
    opts = options or Options()
    if not 0 < opts.hpa_gpu_target <= 1:
        raise CompareError(f"hpa_gpu_target={opts.hpa_gpu_target} must be in (0, 1]")
    check_policies(policies)
    st = setup or prepare(spec, seed=opts.seed)
    minutes = arrivals_per_minute(trace)
    rates = minute_rates(minutes, trace.duration_s)
    static = static_peak_replicas(minutes, trace.duration_s, st.capacity_rps)
    s = spec.scaling
    initial = replicas_for(float(rates[0]), st.capacity_rps, s.targetUtilization, max(1, s.minReplicas), s.maxReplicas)
    runs = []
    for name in policies:
        auto = make_autoscaler(name, st, opts, static)
        config = FleetConfig(
            batcher=st.batcher,
            latency_ms=st.latency_ms,
            budget_ms=st.plan.serverBudgetMs,
            gpus_per_replica=st.gpus_per_replica,
            initial_replicas=static if name == "static-peak" else initial,
            startup_s=opts.startup_s,
            tick_s=opts.tick_s,
            scrape_s=opts.scrape_s,
            window_s=opts.window_s,
            warmup_s=opts.window_s,  # the fleet starts Ready at the first minute's need, with no signal history
        )
        report = None if progress is None else (lambda t, n=name: progress(n, t))
        runs.append(simulate_fleet(trace, config, auto, progress=report))
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
        static_replicas=static,
        peak_rps=float(rates.max()),
        mean_rps=float(minutes.sum()) / trace.duration_s,
        options=opts,
    )
