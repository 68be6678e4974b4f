"""The batching plan: Triton's dynamic-batching settings derived from the SLA and the batch-latency profile.

Notation: SLA ``S`` (p99, ms), network overhead ``N``, server budget ``T = S - N``, execution
latency ``l(b)``. The plan

1. computes the textbook *seed rule* ``D = S - l(B) - N`` for the largest profiled ``B`` that fits (the number
   every user knows; with S = 100, N = 10, l(8) = 50 it is 40 ms);
2. enumerates candidates (max batch size ``B``, preferred sizes, queue delay ``D``; instance count follows the
   GPUs of a replica), always with ``l(B) + D <= T`` so a lone request never misses the SLA. Without overrides
   the preferred sizes are *every* size 1..B and ``D`` is the minimum (100 µs): a batch starts as soon as the
   instance is free and grows while it is busy (work-conserving batching). Measured on the real Triton 2.51,
   a sparse preferred list (say ``[B]``) lets the batcher sleep until the queue reaches the next preferred
   size, so requests that arrive while a batch executes miss the next batch and wait a whole extra execution
   (core ``dynamic_batch_scheduler.cc``: the enqueue path wakes the batcher only at ``next_preferred``). With
   every size preferred each arrival wakes it, which is the behaviour the simulator models and the component
   test checks against the real server; a waiting delay also never raised the simulated capacity;
3. finds each candidate's *capacity at SLA*: the largest Poisson arrival rate per replica whose simulated
   p99 of queue + execution stays within ``T``, by bisection on the Triton batcher model in
   :mod:`batchfill.sim.batcher` (common random numbers, fixed seed: deterministic);
4. chooses the candidate with the highest capacity (ties: lower p99, then smaller ``D`` and ``B``) and confirms
   its capacity on a second, longer arrival sequence, lowering it until that run also meets ``T``.

Why not the seed rule alone: a replica has one queue, so under load a request waits for the batch already
executing and then for its own: about ``max(D, l(B)) + l(B)``; Nexus (SOSP'19) requires ``2 l(B) <= T`` for a
saturated queue. The seed rule's large ``D`` is safe only at low load, and it is in the candidate set, so the
chosen plan's capacity is never below the seed rule's when the user sets no overrides. (Its simulated capacity
flatters it: the simulator lets its pending batch grow while the instance is busy, which Triton does not do
reliably for a sparse preferred list.)

Sources: Symphony (arXiv 2308.07470), Nexus (SOSP'19), Clockwork (OSDI'20), Triton's dynamic batcher docs.

Long because the planner's steps (candidates, the seed rule, evaluation by simulation, the choice) share
the candidate and evaluator types defined here; the batcher it simulates is in batchfill.sim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from batchfill.api.errors import InfeasibleSLAError, Problem, SpecError
from batchfill.api.reasons import ConditionType, PlanWarningReason, SpecReason
from batchfill.api.spec import BatchedModelSpec, BatchingSpec, ScalingSpec, SequenceStrategy
from batchfill.api.status import PlanStatus, SeedRule
from batchfill.policy.profile import LatencyProfile
from batchfill.sim.batcher import BatcherConfig, poisson_unit_arrivals, simulate_batcher

#: Requests simulated per capacity probe during the search, and in the confirming run.
SEARCH_REQUESTS = 12_000
CONFIRM_REQUESTS = 40_000
#: Leading fraction of requests ignored (the replica starts empty, which would flatter the p99).
WARMUP_FRACTION = 0.05
#: The queue delay is never below this (µs): a 0 is omitted from config.pbtxt and its meaning depends on the
#: Triton version (docs/field-cases.md#queue-delay-units).
MIN_QUEUE_DELAY_US = 100
#: Queue delays tried with user-given preferred sizes, as fractions of the largest that fits (T - l(B)).
DELAY_FRACTIONS = (1.0, 0.5, 0.25, 0.05)
#: Smallest execution latency planned from, ms: 1 ns, the resolution of Triton's statistics. Below it the
#: full-batch throughput bound overflows to infinity (5e-324 ms) or the simulation loses all precision.
MIN_LATENCY_MS = 1e-6
#: Relative width at which the capacity bisection stops.
CAPACITY_TOLERANCE = 0.01
#: Step by which a capacity that fails the confirming run is lowered.
CONFIRM_STEP = 0.97
P99 = 0.99


@dataclass(frozen=True)
class Candidate:
    """One configuration and what it achieves.

    Attributes:
        max_batch_size: B (0: batching off).
        preferred_batch_sizes: Triton preferred_batch_size (empty when batching is off).
        max_queue_delay_us: D in µs (0 only when batching is off).
        executors: batches that run in parallel in one replica (GPUs per replica, at least 1).
        capacity_rps: capacity at SLA per replica, requests/s (0 until evaluated).
        p99_ms: simulated p99 of queue + execution at that capacity, ms.
        pruned: not simulated, because even full batches could not beat a capacity already found.
    """

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    executors: int
    capacity_rps: float = 0.0
    p99_ms: float = 0.0
    pruned: bool = False

    @property
    def batcher(self) -> BatcherConfig:
        """The simulator settings of this candidate."""
        return BatcherConfig(
            max_batch_size=self.max_batch_size,
            preferred_batch_sizes=self.preferred_batch_sizes,
            max_queue_delay_us=self.max_queue_delay_us,
            executors=self.executors,
        )

    @property
    def key(self) -> tuple[int, tuple[int, ...], int]:
        return (self.max_batch_size, self.preferred_batch_sizes, self.max_queue_delay_us)


@dataclass(frozen=True)
class PlanWarning:
    """Something the plan cannot fix but the user should know; becomes a status condition."""

    condition: ConditionType
    reason: PlanWarningReason
    path: str
    message: str


@dataclass(frozen=True)
class PlanResult:
    """The chosen plan, the seed rule's numbers and every candidate evaluated.

    Attributes:
        chosen: the candidate with the highest capacity at SLA (confirmed).
        seed_rule: the seed rule's candidate (None when no profiled size fits the budget).
        candidates: every candidate, in evaluation order; pruned ones have capacity 0.
        server_budget_ms: T = S - N.
        target_p99_ms: T less the safety margin: what capacities are computed against.
        min_client_timeout_ms: max(max(D, l(B)) + l(B), p99 at capacity) + N.
        instance_count: Triton instance_group count (per GPU when the replica has GPUs).
        minimum_slot_utilization: for the sequence batcher's Direct strategy, else None.
        warnings: conditions to report (e.g. variable-shape inputs).
        batch_fill_at_target: mean batch size / max_batch_size the simulator predicts at
            ``spec.scaling.targetUtilization`` x capacity (None without batching): the fill of a saturated replica.
        batch_fill_at_max_target: the same at ``spec.scaling.maxTargetUtilization`` x capacity (None without
            batching, or when that is not above targetUtilization): the fill at the highest target the headroom
            may be raised to (policy/headroom.py).
    """

    chosen: Candidate
    seed_rule: Candidate | None
    candidates: tuple[Candidate, ...]
    server_budget_ms: float
    target_p99_ms: float
    min_client_timeout_ms: float
    instance_count: int
    minimum_slot_utilization: float | None
    warnings: tuple[PlanWarning, ...]
    rule: str
    batch_fill_at_target: float | None = None
    batch_fill_at_max_target: float | None = None

    def to_status(self) -> PlanStatus:
        """The ``status.plan`` object (rounded: capacities to 4 significant digits, p99 down to 0.01 ms)."""
        c = self.chosen
        seed = None
        if self.seed_rule is not None:
            seed = SeedRule(
                maxBatchSize=self.seed_rule.max_batch_size,
                maxQueueDelayMicroseconds=self.seed_rule.max_queue_delay_us,
                capacityPerReplicaRps=significant(self.seed_rule.capacity_rps),
            )
        return PlanStatus(
            maxBatchSize=c.max_batch_size,
            preferredBatchSizes=list(c.preferred_batch_sizes),
            maxQueueDelayMicroseconds=c.max_queue_delay_us,
            instanceCount=self.instance_count,
            minimumSlotUtilization=self.minimum_slot_utilization,
            serverBudgetMs=round(self.server_budget_ms, 3),
            capacityPerReplicaRps=significant(c.capacity_rps),
            # floor, so a p99 that meets the budget never rounds above it
            predictedP99Ms=math.floor(c.p99_ms * 100) / 100,
            minClientTimeoutMs=round(self.min_client_timeout_ms, 2),
            rule=self.rule,
            seedRule=seed,
            batchFillAtTarget=_rounded_fill(self.batch_fill_at_target),
            batchFillAtMaxTarget=_rounded_fill(self.batch_fill_at_max_target),
        )


def _rounded_fill(fill: float | None) -> float | None:
    return None if fill is None else round(fill, 3)


def significant(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (a tiny capacity must not round to 0)."""
    return float(f"{x:.{digits}g}")


def replicas_for(
    rate_rps: float, capacity_rps: float, target_utilization: float, min_replicas: int, max_replicas: int
) -> int:
    """Load-proportional replica count ``ceil(λ / (u · C))`` bounded to [min, max] (README.md#autoscaling).

    Args:
        rate_rps: arrival rate λ, requests/s (NaN, Inf or negative: treated as unknown -> min_replicas).
        capacity_rps: capacity at SLA per replica C, requests/s (> 0).
        target_utilization: u in (0, 1].
    """
    if not math.isfinite(rate_rps) or rate_rps <= 0 or capacity_rps <= 0 or not 0 < target_utilization <= 1:
        return min_replicas
    needed = math.ceil(rate_rps / (target_utilization * capacity_rps) - 1e-9)
    return max(min_replicas, min(max_replicas, needed))


class _Evaluator:
    """Capacity-at-SLA search for candidates sharing one profile, target and arrival draws."""

    def __init__(self, profile: LatencyProfile, target_ms: float, seed: int) -> None:
        self.profile = profile
        self.target_ms = target_ms
        self.search = poisson_unit_arrivals(SEARCH_REQUESTS, seed)
        self.confirm = poisson_unit_arrivals(CONFIRM_REQUESTS, seed + 1)
        self._tables: dict[int, npt.NDArray[np.float64]] = {}

    def table(self, cap: int) -> npt.NDArray[np.float64]:
        if cap not in self._tables:
            self._tables[cap] = np.asarray(self.profile.table(cap), dtype=np.float64)
        return self._tables[cap]

    def p99(self, cand: Candidate, rate_rps: float, unit: npt.NDArray[np.float64]) -> float:
        """Simulated p99 (ms) at ``rate_rps``; inf when the run is certain to miss the target."""
        n = len(unit)
        warm = int(n * WARMUP_FRACTION)
        allowed = math.floor((n - warm) * (1 - P99))
        arrivals = unit * (1000.0 / rate_rps)
        run = simulate_batcher(
            arrivals,
            cand.batcher,
            self.table(cand.batcher.batch_cap),
            budget_ms=self.target_ms,
            max_violations=allowed,
        )
        if not run.completed:
            return math.inf
        # np.quantile(..., method="higher") without its generic machinery: the order statistic at index
        # ceil((m - 1) q), numpy's own for "higher" (numpy/lib/function_base.py), found by an in-place partition
        kept = run.latencies_ms[warm:]
        rank = math.ceil((len(kept) - 1) * P99)
        kept.partition(rank)
        return float(kept[rank])

    def mean_fill(self, cand: Candidate, rate_rps: float) -> float | None:
        """Mean batch size / max_batch_size at ``rate_rps`` on the confirming draws (None without batching)."""
        if cand.max_batch_size < 1 or not math.isfinite(1000.0 / rate_rps if rate_rps > 0 else math.inf):
            return None  # no rate, or one so small (targetUtilization=5e-324) that the gaps overflow
        warm = int(len(self.confirm) * WARMUP_FRACTION)
        arrivals = self.confirm * (1000.0 / rate_rps)
        run = simulate_batcher(arrivals, cand.batcher, self.table(cand.batcher.batch_cap))
        first = int(np.searchsorted(run.dispatch_ms, arrivals[warm]))
        sizes = run.batch_sizes[first:] if first < len(run.batch_sizes) else run.batch_sizes
        return float(np.mean(sizes)) / cand.max_batch_size if len(sizes) else None

    def upper_bound_rps(self, cand: Candidate) -> float:
        """Throughput with every batch full: no Poisson load at SLA can reach it."""
        cap = cand.batcher.batch_cap
        return cand.executors * cap / self.profile.latency_ms(cap) * 1000.0

    def capacity(self, cand: Candidate) -> Candidate:
        """Bisection for the largest rate with p99 <= target on the search draws."""
        lo, hi = 0.0, self.upper_bound_rps(cand)
        p99_lo = 0.0
        floor = hi * 1e-6
        while hi - lo > CAPACITY_TOLERANCE * hi and hi > floor:
            # halve while nothing feasible was found (capacity far below the full-batch bound), then bisect
            mid = (lo + hi) / 2 if lo > 0 else hi / 2
            p = self.p99(cand, mid, self.search)
            if p <= self.target_ms:
                lo, p99_lo = mid, p
            else:
                hi = mid
        return replace(cand, capacity_rps=lo, p99_ms=p99_lo)

    def confirmed(self, cand: Candidate) -> Candidate:
        """Lower the capacity until the longer, independent confirming run also meets the target."""
        rate = cand.capacity_rps
        for _ in range(60):
            if rate <= 0:
                break
            p = self.p99(cand, rate, self.confirm)
            if p <= self.target_ms:
                return replace(cand, capacity_rps=rate, p99_ms=p)
            rate *= CONFIRM_STEP
        return replace(cand, capacity_rps=0.0, p99_ms=0.0)


def _batch_sizes(profile: LatencyProfile, cap: int, target_ms: float, min_b: int) -> list[int]:
    """Max-batch-size candidates: profiled sizes, powers of two, and the sizes where l(B) crosses fractions
    of the budget (the Nexus point 2 l(B) <= T among them), all within [min_b, cap] and with l(B) < T."""
    fits = profile.largest_within(target_ms - MIN_QUEUE_DELAY_US / 1000.0, cap)
    sizes = {b for b in profile.batch_sizes if b <= fits}
    p = 1
    while p <= fits:
        sizes.add(p)
        p *= 2
    sizes.add(fits)
    for frac in (0.5, 0.4, 0.3):
        sizes.add(profile.largest_within(target_ms * frac, fits))
    return sorted(b for b in sizes if b >= max(1, min_b))


def _variable_shape_warnings(spec: BatchedModelSpec) -> list[PlanWarning]:
    out: list[PlanWarning] = []
    for i, t in enumerate(spec.model.inputs):
        sample_dims = t.dims[1:] if t.includesBatchDim else t.dims
        if -1 in sample_dims and not t.allowRaggedBatch:
            out.append(
                PlanWarning(
                    condition=ConditionType.BATCHING_EFFECTIVE,
                    reason=PlanWarningReason.VARIABLE_SHAPE_INPUT,
                    path=f"spec.model.inputs[{i}].dims",
                    message=(
                        f"spec.model.inputs[{i}].dims={t.dims} has a variable-size axis: Triton batches only "
                        "requests of equal shape, so batches may stay small; low batch fill is then not a "
                        "reason to scale or to raise the queue delay"
                    ),
                )
            )
    return out


def _check_profile(spec: BatchedModelSpec) -> None:
    """Raises SpecError when the spec has no profile, or a latency below what Triton's statistics resolve."""
    if not spec.profile:
        raise SpecError(
            [
                Problem(
                    "spec.profile",
                    "is required to plan: give each batch size's execution latency "
                    "(measure it with `batchfill profile` against a Triton serving the model)",
                )
            ]
        )
    too_fast = [
        Problem(f"spec.profile[{i}].latencyMs", f"={q.latencyMs:g} ms is below {MIN_LATENCY_MS:g} ms (1 ns), "
                "the resolution of Triton's statistics")
        for i, q in enumerate(spec.profile)
        if q.latencyMs < MIN_LATENCY_MS
    ]  # fmt: skip
    if too_fast:
        raise SpecError(too_fast)


def _batch_cap(b: BatchingSpec, profile: LatencyProfile) -> tuple[int, list[PlanWarning]]:
    """The largest batch size to plan (``spec.batching.maxBatchSize``, never beyond the profile) and the warning
    when the user's limit exceeds the profile."""
    warnings: list[PlanWarning] = []
    cap = profile.largest if b.maxBatchSize is None else min(b.maxBatchSize, profile.largest)
    if b.maxBatchSize is not None and b.maxBatchSize > profile.largest:
        warnings.append(
            PlanWarning(
                condition=ConditionType.PLANNED,
                reason=PlanWarningReason.MAX_BATCH_SIZE_CAPPED,
                path="spec.batching.maxBatchSize",
                message=(
                    f"spec.batching.maxBatchSize={b.maxBatchSize} exceeds the largest profiled batch size "
                    f"{profile.largest}; the plan stays within the profile (it is never extrapolated)"
                ),
            )
        )
    return cap, warnings


def _candidates(
    b: BatchingSpec,
    profile: LatencyProfile,
    sizes: list[int],
    target: float,
    budget_of: str,
    preferred_override: tuple[int, ...] | None,
    direct: bool,
    executors: int,
) -> dict[tuple[int, tuple[int, ...], int], Candidate]:
    """Every configuration to simulate: for each batch size, the preferred sizes and the queue delays that fit
    ``target`` (ms). Raises SpecError when the user's queue delay leaves no size within the budget."""

    def make(batch: int, delay_us: int) -> Candidate:
        if direct:
            pref: tuple[int, ...] = ()
        elif preferred_override:
            pref = preferred_override
        elif b.maxQueueDelayMicroseconds is not None:
            pref = (batch,)  # the user wants batches held for the delay: Triton's default preferred size
        else:
            pref = tuple(range(1, batch + 1))  # work-conserving: point 2 of the module docstring
        return Candidate(batch, pref, delay_us, executors)

    candidates: dict[tuple[int, tuple[int, ...], int], Candidate] = {}
    for batch in sizes:
        room_us = math.floor((target - profile.latency_ms(batch)) * 1000)
        if b.maxQueueDelayMicroseconds is not None:
            delays = [b.maxQueueDelayMicroseconds] if b.maxQueueDelayMicroseconds <= room_us else []
        elif make(batch, MIN_QUEUE_DELAY_US).batcher.dispatch_threshold == 1:
            delays = [MIN_QUEUE_DELAY_US]  # every request dispatches at once: the delay never applies
        else:
            delays = sorted({max(MIN_QUEUE_DELAY_US, math.floor(room_us * f)) for f in DELAY_FRACTIONS})
        for d in delays:
            c = make(batch, d)
            candidates.setdefault(c.key, c)
    if not candidates:
        d = b.maxQueueDelayMicroseconds or 0
        smallest = sizes[0]
        raise SpecError(
            [
                Problem(
                    "spec.batching.maxQueueDelayMicroseconds",
                    f"={d} µs ({d / 1000:g} ms) plus execution l({smallest})={profile.latency_ms(smallest):g} ms "
                    f"exceeds the server budget {budget_of}",
                )
            ],
            reason=SpecReason.INVALID_BATCHING,
        )

    return candidates


def _evaluate(
    evaluator: _Evaluator,
    candidates: dict[tuple[int, tuple[int, ...], int], Candidate],
    seed_cand: Candidate | None,
) -> dict[tuple[int, tuple[int, ...], int], Candidate]:
    """Each candidate with its simulated capacity, or marked pruned when its full-batch throughput cannot beat the
    best capacity found before it."""
    # Evaluate the seed rule first (its number is reported anyway), then the rest by descending upper
    # bound, skipping any whose full-batch throughput cannot beat the best capacity found so far.
    evaluated: dict[tuple[int, tuple[int, ...], int], Candidate] = {}
    if seed_cand is not None:
        evaluated[seed_cand.key] = evaluator.capacity(seed_cand)
    best = max((c.capacity_rps for k, c in evaluated.items() if k in candidates), default=0.0)
    order = sorted(candidates.values(), key=lambda c: (-evaluator.upper_bound_rps(c), c.key))
    for c in order:
        if c.key in evaluated:
            continue
        if evaluator.upper_bound_rps(c) <= best:
            evaluated[c.key] = replace(c, pruned=True)
            continue
        evaluated[c.key] = done = evaluator.capacity(c)
        best = max(best, done.capacity_rps)

    return evaluated


def _budget_of(spec: BatchedModelSpec, budget: float, target: float) -> str:
    """The server budget ``T`` (ms) and the fields it comes from, for error messages."""
    sla, b = spec.sla, spec.batching
    text = (
        f"{budget:g} ms (spec.sla.latencyP99Ms={sla.latencyP99Ms:g} - "
        f"spec.sla.networkOverheadMs={sla.networkOverheadMs:g})"
    )
    if b.safetyMarginPercent:
        text += f", {target:g} ms after spec.batching.safetyMarginPercent={b.safetyMarginPercent:g}"
    return text


def _seed_rule(profile: LatencyProfile, cap: int, budget: float, direct: bool, executors: int) -> Candidate | None:
    """The textbook rule ``D = S - l(B) - N``: the largest profiled size that fits the budget (ms), with all
    remaining budget as queue delay; None when no profiled size fits."""
    seed_b = max((s for s in profile.batch_sizes if s <= cap and profile.latency_ms(s) < budget), default=0)
    if not seed_b:
        return None
    seed_delay = max(MIN_QUEUE_DELAY_US, math.floor((budget - profile.latency_ms(seed_b)) * 1000))
    return Candidate(seed_b, () if direct else (seed_b,), seed_delay, executors)


def _choose(
    evaluator: _Evaluator,
    candidates: dict[tuple[int, tuple[int, ...], int], Candidate],
    evaluated: dict[tuple[int, tuple[int, ...], int], Candidate],
    seed_cand: Candidate | None,
    budget_of: str,
) -> tuple[Candidate, Candidate | None, tuple[Candidate, ...]]:
    """The highest capacity (ties: lower p99, shorter delay, smaller batch), confirmed; the seed rule's result;
    every candidate in order. Raises InfeasibleSLAError when no configuration keeps the p99 in the budget."""
    pool = [evaluated[k] for k in candidates]
    top = max(pool, key=lambda c: (round(c.capacity_rps, 6), -c.p99_ms, -c.max_queue_delay_us, -c.max_batch_size))
    chosen = evaluator.confirmed(top)
    seed_done = None
    if seed_cand is not None:
        seed_done = evaluated[seed_cand.key] if seed_cand.key in evaluated else evaluator.capacity(seed_cand)
        seed_done = evaluator.confirmed(seed_done)
        if seed_done.key == chosen.key:
            seed_done = chosen
    if chosen.capacity_rps <= 0:
        raise InfeasibleSLAError(
            [
                Problem(
                    "spec.sla.latencyP99Ms",
                    f"no configuration keeps the simulated p99 within the server budget {budget_of}",
                )
            ]
        )
    ordered = tuple(evaluated[k] if k != chosen.key else chosen for k in candidates)
    return chosen, seed_done, ordered


def plan_batching(spec: BatchedModelSpec, *, seed: int = 0) -> PlanResult:
    """Derive the batching plan of a validated spec.

    Args:
        spec: a spec that passed :func:`batchfill.api.validate.check_spec`.
        seed: seed of the simulated Poisson arrivals (the plan is deterministic for a given seed).

    Returns:
        The plan; ``result.to_status()`` is what goes to ``status.plan``.

    Raises:
        SpecError: no profile, or an override that cannot keep the SLA (names the field and the numbers).
        InfeasibleSLAError: even batch size 1 does not fit the server budget.

    Long because it reads as the plan's steps in order; each step is a function of its own.
    """
    _check_profile(spec)
    assert spec.profile is not None  # _check_profile raised otherwise
    sla, b = spec.sla, spec.batching
    profile = LatencyProfile.from_points(spec.profile)
    budget = sla.server_budget_ms
    target = budget * (1 - b.safetyMarginPercent / 100)
    budget_of = _budget_of(spec, budget, target)
    budget_text = f"budget is {budget_of}"
    l1 = profile.latency_ms(1)
    batching_off = b.maxBatchSize == 0
    slack = 0.0 if batching_off else MIN_QUEUE_DELAY_US / 1000.0
    if l1 + slack > target:
        first = spec.profile[0]
        why = (
            "no batching configuration can meet the SLA"
            if l1 > target
            else f"the batcher's shortest queue delay ({slack:g} ms) does not fit beside it; serve without batching "
            "(spec.batching.maxBatchSize: 0) or widen the SLA"
        )
        raise InfeasibleSLAError(
            [
                Problem(
                    "spec.profile[0].latencyMs",
                    f"latency at batch {first.batchSize} is {l1:g} ms, {budget_text}; {why}",
                )
            ]
        )

    executors = max(1, spec.triton.gpusPerReplica)
    cap, warnings = _batch_cap(b, profile)
    direct = spec.model.stateful and spec.model.sequenceStrategy is SequenceStrategy.DIRECT
    evaluator = _Evaluator(profile, target, seed)

    if batching_off:
        only = Candidate(0, (), 0, executors)
        chosen = evaluator.confirmed(evaluator.capacity(only))
        if chosen.capacity_rps <= 0:
            raise InfeasibleSLAError(
                [Problem("spec.sla.latencyP99Ms", f"no request rate keeps the simulated p99 within the {budget_text}")]
            )
        return _result(spec, profile, chosen, None, (chosen,), budget, target, warnings, direct, seed, (None, None))

    preferred_override = tuple(sorted(b.preferredBatchSizes)) if b.preferredBatchSizes else None
    min_b = max(preferred_override) if preferred_override else 1
    sizes = _batch_sizes(profile, cap, target, min_b)
    if not sizes:
        raise SpecError(
            [
                Problem(
                    "spec.batching.preferredBatchSizes",
                    f"={list(preferred_override or ())}: the largest preferred size {min_b} needs "
                    f"l({min_b})={profile.latency_ms(min(min_b, profile.largest)):g} ms of execution, "
                    f"which leaves no queueing room in the server budget {budget_of}",
                )
            ],
            reason=SpecReason.INVALID_BATCHING,
        )

    candidates = _candidates(b, profile, sizes, target, budget_of, preferred_override, direct, executors)

    seed_cand = _seed_rule(profile, cap, budget, direct, executors)
    no_overrides = preferred_override is None and b.maxQueueDelayMicroseconds is None
    if (
        seed_cand is not None
        and no_overrides
        and seed_cand.max_queue_delay_us <= math.floor((target - profile.latency_ms(seed_cand.max_batch_size)) * 1000)
    ):
        candidates.setdefault(seed_cand.key, seed_cand)

    evaluated = _evaluate(evaluator, candidates, seed_cand)
    chosen, seed_done, ordered = _choose(evaluator, candidates, evaluated, seed_cand, budget_of)
    fills = _fills(evaluator, chosen, spec.scaling)
    return _result(spec, profile, chosen, seed_done, ordered, budget, target, warnings, direct, seed, fills)


@dataclass(frozen=True)
class ConfigCapacity:
    """What a fixed dynamic-batching configuration achieves with a spec's profile and SLA (:func:`config_capacity`).

    Attributes:
        candidate: the configuration with its confirmed capacity at SLA (requests/s per replica; 0 when no rate
            keeps the simulated p99 within the target) and the p99 at it (ms).
        server_budget_ms: T = latencyP99Ms - networkOverheadMs.
        batch_fill_at_target: mean batch size / max_batch_size at u·C (None without batching or capacity).
        batch_fill_at_max_target: the same at maxTargetUtilization·C (None also when that is not above u).
    """

    candidate: Candidate
    server_budget_ms: float
    batch_fill_at_target: float | None
    batch_fill_at_max_target: float | None = None


def config_capacity(
    spec: BatchedModelSpec, max_batch_size: int, preferred_batch_sizes: tuple[int, ...], max_queue_delay_us: int,
    *, seed: int = 0,
) -> ConfigCapacity:  # fmt: skip
    """Capacity at SLA of one given configuration (not a search over configurations): the config a person rolled
    the pods back to (``kubectl rollout undo``), evaluated as :func:`plan_batching` evaluates its candidates
    (bisection on the search draws, then the confirming run; the same seed, so the plan's own configuration gets
    the plan's own capacity).

    Args:
        spec: a validated spec with a profile (the plan's profile: spec.profile or the measured points).
        max_batch_size: Triton max_batch_size (0: batching off).
        preferred_batch_sizes: Triton preferred_batch_size (ignored when batching is off).
        max_queue_delay_us: Triton max_queue_delay_microseconds (ignored when batching is off).

    Raises:
        SpecError: the spec has no profile (:func:`plan_batching`'s check).
    """
    _check_profile(spec)
    assert spec.profile is not None  # _check_profile raised otherwise
    profile = LatencyProfile.from_points(spec.profile)
    budget = spec.sla.server_budget_ms
    target = budget * (1 - spec.batching.safetyMarginPercent / 100)
    executors = max(1, spec.triton.gpusPerReplica)
    if max_batch_size < 1:
        cand = Candidate(0, (), 0, executors)
    else:
        sizes = tuple(sorted({b for b in preferred_batch_sizes if 1 <= b <= max_batch_size}))
        cand = Candidate(max_batch_size, sizes, max(0, max_queue_delay_us), executors)
    evaluator = _Evaluator(profile, target, seed)
    chosen = evaluator.confirmed(evaluator.capacity(cand))
    return ConfigCapacity(chosen, budget, *_fills(evaluator, chosen, spec.scaling))


def _fills(evaluator: _Evaluator, chosen: Candidate, scaling: ScalingSpec) -> tuple[float | None, float | None]:
    """The simulated batch fill of ``chosen`` at targetUtilization and at maxTargetUtilization x its capacity
    (the second None unless above the first; both None without capacity or batching)."""
    if not chosen.capacity_rps > 0:
        return None, None
    u, u_max = scaling.targetUtilization, min(scaling.maxTargetUtilization, 1.0)
    at_target = evaluator.mean_fill(chosen, u * chosen.capacity_rps)
    at_max = evaluator.mean_fill(chosen, u_max * chosen.capacity_rps) if u_max > u and at_target is not None else None
    return at_target, at_max


def _result(
    spec: BatchedModelSpec,
    profile: LatencyProfile,
    chosen: Candidate,
    seed_rule: Candidate | None,
    candidates: tuple[Candidate, ...],
    budget: float,
    target: float,
    warnings: list[PlanWarning],
    direct: bool,
    seed: int,
    fills: tuple[float | None, float | None],
) -> PlanResult:
    l_b = profile.latency_ms(chosen.batcher.batch_cap)
    # A request may wait out the delay or the batch in flight, then run its own batch; near capacity the queue
    # can hold it longer, up to the predicted p99. A client timeout below this fails requests the server serves.
    in_flight = max(chosen.max_queue_delay_us / 1000.0, l_b) + l_b
    timeout = max(in_flight, chosen.p99_ms) + spec.sla.networkOverheadMs
    if chosen.max_batch_size > 0:
        warnings = warnings + _variable_shape_warnings(spec)
    rule = (
        f"highest simulated capacity with p99 <= {target:g} ms among {len(candidates)} candidates "
        f"(Triton dynamic-batcher model, Poisson arrivals, seed {seed})"
    )
    return PlanResult(
        chosen=chosen,
        seed_rule=seed_rule,
        candidates=candidates,
        server_budget_ms=budget,
        target_p99_ms=target,
        min_client_timeout_ms=timeout,
        instance_count=spec.batching.instancesPerGpu,
        minimum_slot_utilization=1.0 if direct else None,
        warnings=tuple(warnings),
        rule=rule,
        batch_fill_at_target=fills[0],
        batch_fill_at_max_target=fills[1],
    )


#: Rule text of a plan made before any profile is known.
FIRST_PLAN_RULE = (
    "first plan: no profile yet, so batches up to spec.batching.maxBatchSize with every size preferred and the "
    "minimum queue delay (work-conserving: no request waits for partners); capacity at SLA is unknown until "
    "the profile is measured from Triton's statistics, and replicas hold meanwhile"
)


def first_plan(spec: BatchedModelSpec) -> PlanResult:
    """The plan of a spec without a profile (``spec.profiling`` measures it on the running pods).

    Work-conserving batching with the minimum delay never makes a request wait for partners, so it keeps any
    SLA the model can meet at low load; the capacity is 0 (unknown), which makes the scaling policy hold.

    Raises:
        SpecError: ``spec.batching.maxBatchSize`` absent (the model's batch limit is not known without it).
    """
    b = spec.batching
    if b.maxBatchSize is None:
        raise SpecError(
            [
                Problem(
                    "spec.batching.maxBatchSize",
                    "is required while spec.profile is absent: the first plan, before the profile is measured, "
                    "needs the largest batch the model accepts (0 if it does not batch)",
                )
            ]
        )
    if spec.scaling.minReplicas < 1:
        raise SpecError(
            [
                Problem(
                    "spec.scaling.minReplicas",
                    "=0 needs spec.profile: without one the profile is measured on running pods, and a model at 0 "
                    "replicas is never measured (set minReplicas >= 1 or declare a profile)",
                )
            ]
        )
    batch = b.maxBatchSize
    preferred = tuple(sorted(b.preferredBatchSizes)) if b.preferredBatchSizes else tuple(range(1, batch + 1))
    delay = 0 if batch == 0 else (b.maxQueueDelayMicroseconds or MIN_QUEUE_DELAY_US)
    chosen = Candidate(batch, preferred if batch else (), delay, max(1, spec.triton.gpusPerReplica))
    budget = spec.sla.server_budget_ms
    direct = spec.model.stateful and spec.model.sequenceStrategy is SequenceStrategy.DIRECT
    return PlanResult(
        chosen=chosen,
        seed_rule=None,
        candidates=(chosen,),
        server_budget_ms=budget,
        target_p99_ms=budget * (1 - b.safetyMarginPercent / 100),
        min_client_timeout_ms=spec.sla.latencyP99Ms,
        instance_count=b.instancesPerGpu,
        minimum_slot_utilization=1.0 if direct else None,
        warnings=(),
        rule=FIRST_PLAN_RULE,
        batch_fill_at_target=None,
    )
