"""What teams run today: the Triton batching configurations batchfill's plan is measured against.

Each baseline is a batching configuration behind a common autoscaler. The configurations, with the batcher
semantics the simulator gives them (:mod:`batchfill.sim.batcher`):

* ``batching-off``: Triton without ``dynamic_batching`` (``max_batch_size`` as declared). The default scheduler
  runs every request alone, in arrival order, on the next free instance: batch size 1 per execution
  (``BatcherConfig(max_batch_size=0)``: a batch cap of 1 and no delay).
* ``triton-default``: ``dynamic_batching {}`` with Triton's defaults: no preferred sizes and no queue delay
  (``max_queue_delay_microseconds`` 0), so when an instance frees the batcher takes whatever is queued, up to the
  model's ``max_batch_size`` (``spec.batching.maxBatchSize``, else the largest profiled size). This is the
  behaviour since server PR#3789 (https://github.com/triton-inference-server/server/pull/3789), which made the
  batcher keep growing the pending batch while every instance is busy; before it, an unset delay combined
  nothing that queued during an execution (docs/field-cases.md#queue-delay-units).
* ``seed-rule``: the textbook ``D = S - l(B) - N`` with ``preferred_batch_size: [B]`` for the largest profiled
  ``B`` within the budget (``status.plan.seedRule``): a batch starts when ``B`` requests are pending or the oldest
  has waited ``D``. The simulator lets that pending batch grow while the instance is busy; the component test
  ``tests/component/test_plan_meets_sla.py`` measures the real Triton 2.51 with a sparse preferred list well
  above the simulated p99, so this baseline is simulated optimistically and batchfill's saving against it is
  a lower bound.

The autoscalers behind them (names ``<configuration>/<autoscaler>``, e.g. ``batching-off/hpa-gpu@best``):
``hpa-gpu`` (the HPA on GPU utilization at the common 80 %), ``hpa-gpu@<percent>``, ``hpa-gpu@best`` (the target
that is cheapest for that configuration while it keeps the SLO, found by simulation: :func:`best_hpa_target`) and
``static-peak`` (``ceil(peak / C)`` replicas with the configuration's own capacity at SLA ``C``).

Capacities at SLA come from the planner (:func:`batchfill.policy.plan.plan_batching`) on the spec with the
configuration forced through ``spec.batching``, so every configuration is measured by the same search as the plan.

Pure: deterministic for the same spec and seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from batchfill.api.errors import SpecError
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.status import PlanStatus
from batchfill.compare.errors import CompareError
from batchfill.policy.plan import plan_batching
from batchfill.policy.profile import LatencyProfile
from batchfill.sim.batcher import BatcherConfig
from batchfill.sim.fleet import FleetRun


class Batching(StrEnum):
    """A baseline batching configuration (the prefix of a baseline policy name)."""

    OFF = "batching-off"
    TRITON_DEFAULT = "triton-default"
    SEED_RULE = "seed-rule"


#: Autoscalers a baseline configuration can run behind (``hpa-gpu@<percent>`` too).
BASELINE_SCALERS = ("hpa-gpu", "hpa-gpu@best", "static-peak")
#: Every baseline: each configuration behind each autoscaler (``--policies baselines`` in `batchfill simulate`).
BASELINE_POLICIES = tuple(f"{b.value}/{s}" for b in Batching for s in BASELINE_SCALERS)
#: The SLO attainment the best HPA target must keep (the cost benchmark's 99.9 %).
SLO_TARGET = 0.999
#: HPA GPU-utilization targets :func:`best_hpa_target` chooses from, fractions.
HPA_TARGET_GRID = tuple(p / 100 for p in range(30, 100, 5))


@dataclass(frozen=True)
class PolicyName:
    """A policy name split into the batching configuration (None: batchfill's plan) and the autoscaler."""

    batching: Batching | None
    scaler: str


def parse_policy(name: str) -> PolicyName:
    """``"batching-off/hpa-gpu@best"`` -> (OFF, ``"hpa-gpu@best"``); a name without ``/`` runs the plan.

    Raises:
        CompareError: an unknown configuration, or an autoscaler a baseline cannot run behind.
    """
    prefix, slash, scaler = name.partition("/")
    if not slash:
        return PolicyName(None, name)
    try:
        batching = Batching(prefix)
    except ValueError:
        raise CompareError(
            f"policy {name!r}: unknown batching configuration {prefix!r}; choose from {', '.join(Batching)}"
        ) from None
    if scaler not in BASELINE_SCALERS and not scaler.startswith("hpa-gpu@"):
        raise CompareError(
            f"policy {name!r}: a baseline runs behind {', '.join(BASELINE_SCALERS)} or hpa-gpu@<percent>, "
            f"not {scaler!r}"
        )
    return PolicyName(batching, scaler)


@dataclass(frozen=True)
class Configuration:
    """One baseline batching configuration of a model.

    Attributes:
        batching: which one.
        batcher: the simulator's settings for it (executors = GPUs per replica).
        latency_ms: execution latency table ``[0, l(1), ..., l(cap)]``, ms.
        capacity_rps: capacity at SLA of one replica with it, req/s (the planner's search).
        summary: the Triton settings in words, for tables.
    """

    batching: Batching
    batcher: BatcherConfig
    latency_ms: tuple[float, ...]
    capacity_rps: float
    summary: str


def _forced(spec: BatchedModelSpec, **batching: object) -> BatchedModelSpec:
    """``spec`` with ``spec.batching`` fields replaced (the other fields, e.g. the safety margin, kept)."""
    return spec.model_copy(update={"batching": spec.batching.model_copy(update=batching)})


def _planned_capacity(spec: BatchedModelSpec, batching: Batching, seed: int) -> float:
    try:
        return plan_batching(spec, seed=seed).chosen.capacity_rps
    except SpecError as e:
        raise CompareError(f"{batching.value}: {'; '.join(str(p) for p in e.problems)}") from None


def configuration(batching: Batching, spec: BatchedModelSpec, plan: PlanStatus, *, seed: int = 0) -> Configuration:
    """The baseline ``batching`` for ``spec`` (whose plan is ``plan``).

    Raises:
        CompareError: the spec has no profile; the model does not batch (``spec.batching.maxBatchSize`` 0) and a
            batching baseline is asked; no configuration of that kind keeps the SLA (the message says why).
    """
    if not spec.profile:
        raise CompareError("spec.profile is required to simulate a fleet (measure it with `batchfill profile`)")
    profile = LatencyProfile.from_points(spec.profile)
    executors = max(1, spec.triton.gpusPerReplica)
    declared = spec.batching.maxBatchSize
    if batching is Batching.OFF:
        capacity = _planned_capacity(
            _forced(spec, maxBatchSize=0, preferredBatchSizes=None, maxQueueDelayMicroseconds=None), batching, seed
        )
        return Configuration(
            batching,
            BatcherConfig(0, executors=executors),
            tuple(profile.table(1)),
            capacity,
            "no dynamic_batching (batch 1 per execution)",
        )
    if declared == 0:
        raise CompareError(f"{batching.value}: spec.batching.maxBatchSize=0 (the model does not batch)")
    if batching is Batching.TRITON_DEFAULT:
        b = min(declared, profile.largest) if declared is not None else profile.largest
        # the planner refuses a 0 delay (its meaning depends on the Triton release); with [B] preferred, 1 µs
        # dispatches what is queued 1 µs later than Triton's 0, which leaves the capacity unchanged at 4 digits
        capacity = _planned_capacity(
            _forced(spec, maxBatchSize=b, preferredBatchSizes=[b], maxQueueDelayMicroseconds=1), batching, seed
        )
        return Configuration(
            batching,
            BatcherConfig(b, (), 0, executors),
            tuple(profile.table(b)),
            capacity,
            f"dynamic_batching {{}} (max_batch_size {b}, no preferred sizes, no delay)",
        )
    seed_rule = plan.seedRule
    if seed_rule is None or seed_rule.maxBatchSize < 1:
        raise CompareError(
            f"{batching.value}: no profiled batch size fits the server budget {plan.serverBudgetMs:g} ms"
        )
    b, delay = seed_rule.maxBatchSize, seed_rule.maxQueueDelayMicroseconds
    return Configuration(
        batching,
        BatcherConfig(b, (b,), delay, executors),
        tuple(profile.table(b)),
        seed_rule.capacityPerReplicaRps,
        f"D = S - l(B) - N (max_batch_size {b}, preferred [{b}], delay {delay:,} µs)",
    )


def best_hpa_target(
    run_at: Callable[[float], FleetRun],
    *,
    min_attainment: float = SLO_TARGET,
    grid: tuple[float, ...] = HPA_TARGET_GRID,
) -> tuple[float, FleetRun]:
    """The HPA target on ``grid`` that is cheapest while its run keeps ``min_attainment``, and that run.

    A higher target leaves fewer replicas for the same load, so attainment falls as the target rises; the search
    bisects the grid for the highest target that keeps ``min_attainment`` (about log2(len(grid)) runs) and returns
    the cheapest of the runs that kept it. When none does, the lowest target (the most replicas) and its run.

    Args:
        run_at: simulates the configuration behind the HPA at a target (fraction) and returns the run.
        min_attainment: fraction of requests within the SLA a run must keep.
        grid: targets, fractions, increasing.
    """
    runs: dict[float, FleetRun] = {}

    def probe(i: int) -> FleetRun:
        if grid[i] not in runs:
            runs[grid[i]] = run_at(grid[i])
        return runs[grid[i]]

    lo, hi = 0, len(grid) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if probe(mid).slo_attainment >= min_attainment:
            lo = mid + 1
        else:
            hi = mid - 1
    kept = [(t, r) for t, r in runs.items() if r.slo_attainment >= min_attainment]
    if not kept:
        return grid[0], probe(0)
    return min(kept, key=lambda tr: (tr[1].gpu_seconds, -tr[0]))
