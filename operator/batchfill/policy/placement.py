"""The joint plan: which models share which GPU, and each model's batching, every p99 within its own budget.

Input: BatchedModel specs with their request rates, and the GPU memory. Steps:

1. each model's own plan (:func:`batchfill.policy.plan.plan_batching`): its batching configuration and its
   capacity at SLA ``C_m`` on one GPU. The model is planned at its *design rate* ``λ_m / u_m`` (``u_m`` is
   ``spec.scaling.targetUtilization``: the same headroom the single-model scaling keeps);
2. a model whose load fills GPUs gets ``n_m = floor(λ_m / (u_m C_m))`` dedicated GPUs, each carrying ``C_m``;
   the residual ``λ_m / u_m - n_m C_m`` (and every model with ``n_m = 0``, even at rate 0: it must be loaded
   somewhere) is packed onto shared GPUs;
3. packing (:func:`batchfill.policy.binpack.pack`) is first-fit decreasing by load (residual / ``C_m``): a model
   joins the first GPU whose memory holds it (Σ model memory + the server's overhead <= the GPU's memory) and
   whose models, with it, pass a short simulation of the shared GPU; every GPU is then confirmed by a longer one,
   and loses its most loaded model while some model misses its target. A model alone whose residual fails the
   check takes one more dedicated GPU instead (each then carries less than ``C_m``);
4. hysteresis: with a current placement, its shared GPUs are kept (re-checked at the new rates, models evicted only
   when their GPU fails) and only the models without a place are packed. Re-packs are made for rates
   :data:`REPACK_RATE_MARGIN` (10 %) higher. The one tried first empties whole current GPUs into the others
   (:func:`batchfill.policy.binpack.dissolve`: only their models move) and replaces the placement when it saves
   :data:`DISSOLVE_MIN_SAVING_GPUS` (one) GPU; failing that, a plan from scratch (then emptied the same way), whose
   GPUs take the ids of the current GPUs they share most models with, replaces it only when it saves
   ``max(1, ceil(0.1 x GPUs))`` GPUs (:data:`REPACK_MIN_SAVING_FRACTION`). Either is filled at the actual rates.
   So GPUs merge only when the merged GPU holds 10 % more load, and a merged GPU splits only when its own rates
   rose past what it holds: rate noise within that band moves nothing. A fresh plan (no current placement) is
   emptied the same way after first fit.

Each model's configuration on a shared GPU is its own plan's (work-conserving batching: every batch size preferred,
the minimum queue delay), so its batches grow with the time it waits for the GPU; the simulator decides whether
the neighbours fit (:mod:`batchfill.policy.packing` says why Nexus' duty-cycle rule does not).
Traffic to a model with dedicated and shared replicas must be split by the planned rates (weighted routing), not evenly.

Memory figure: the GPU memory a model holds when loaded (weights, workspace, activations at its largest batch),
MiB; the caller passes it per model (measured, or from the model card), :data:`DEFAULT_MODEL_MEMORY_MIB` otherwise;
each server also holds :data:`DEFAULT_SERVER_OVERHEAD_MIB` (CUDA context and Triton's CUDA memory pool).

Deterministic (fixed seeds, sorted orders). Work: M single-model plans (about 1 s each; cached by the fields they
depend on, so a fleet with few distinct profiles plans few, and ``solo_plans`` skips them), then first fit over G
shared GPUs: O(M·G) screens and, with :data:`batchfill.policy.binpack.ROOM_SHRINK`, O(M + G) quick simulations, plus one
confirming simulation per GPU and per eviction; each simulation is O(requests) (6,000 quick, 20,000 confirming).
Measured on this shared 2-core machine (one profile, Zipf popularity, no current placement): 50 models 2-3 s,
200 models 5-10 s idle, 18 s with the machine loaded (about 300 quick and 70 confirming simulations); a current
placement adds two more packings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from batchfill.api.errors import Problem, SpecError
from batchfill.api.spec import BatchedModelSpec
from batchfill.policy.binpack import Bin, dissolve, kept_bins, matched_ids, pack
from batchfill.policy.packing import Tenant, duty_cycle_fits
from batchfill.policy.plan import Candidate, PlanResult, plan_batching
from batchfill.policy.profile import LatencyProfile

#: GPU memory a model holds when no figure is given, MiB: a ResNet-50-class model in FP32 with its runtime's
#: workspace and activations at batch 32 (about 100 MiB of weights, the rest buffers). Pass the real figure.
DEFAULT_MODEL_MEMORY_MIB = 2048.0
#: GPU memory each Triton server holds besides its models, MiB: the CUDA context (about 300-500 MiB) and Triton's
#: default CUDA memory pool (--cuda-memory-pool-byte-size, 64 MiB).
DEFAULT_SERVER_OVERHEAD_MIB = 512.0
#: A plan from scratch replaces the current placement only when, planned for rates this much higher, it still saves
#: :data:`REPACK_MIN_SAVING_FRACTION` of the GPUs (at least one): the band between merging GPUs (rates fell) and
#: splitting them again (rates rose past what the merged GPU holds) is at least this wide.
REPACK_RATE_MARGIN = 0.1
REPACK_MIN_SAVING_FRACTION = 0.1
#: Emptying whole GPUs into the others (only their models move) replaces the current placement when, planned for rates
#: :data:`REPACK_RATE_MARGIN` higher, it saves at least this many GPUs.
DISSOLVE_MIN_SAVING_GPUS = 1


@dataclass(frozen=True)
class ModelDemand:
    """One model to place.

    Attributes:
        name: unique name (the BatchedModel's).
        spec: its spec, with a profile.
        rate_rps: its request rate λ, req/s (>= 0, finite).
        memory_mib: GPU memory it holds when loaded, MiB (module docstring).
    """

    name: str
    spec: BatchedModelSpec
    rate_rps: float
    memory_mib: float = DEFAULT_MODEL_MEMORY_MIB


@dataclass(frozen=True)
class SharedGpu:
    """One shared GPU (one Triton server hosting several models).

    Attributes:
        gpu_id: stable identity across re-plans (kept GPUs keep theirs).
        tenants: the models' names, in the server's order.
        rates_rps: each one's rate on this GPU, req/s (design rates: λ / u, less what dedicated GPUs carry).
        p99_ms: each one's simulated p99 here, ms.
        duty_cycle_ms: Nexus' duty cycle of the set, ms (inf when no model has load; informative only).
        memory_mib: Σ model memory + the server overhead, MiB.
    """

    gpu_id: int
    tenants: tuple[str, ...]
    rates_rps: tuple[float, ...]
    p99_ms: tuple[float, ...]
    duty_cycle_ms: float
    memory_mib: float


@dataclass(frozen=True)
class ModelPlacement:
    """Where one model runs and how it batches.

    Attributes:
        name: the model.
        rate_rps: λ, req/s.
        design_rate_rps: λ / u, req/s: what its GPUs are planned to carry.
        capacity_rps: its capacity at SLA alone on one GPU, C, req/s.
        target_ms: its p99 target (server budget less the safety margin), ms.
        config: its batching configuration (the same on every GPU it runs on).
        dedicated_gpus: GPUs that serve only it, each carrying at most C.
        shared_gpu: the ``gpu_id`` of the shared GPU holding its residual, or None.
        shared_rate_rps: the rate sent to the shared GPU, req/s.
        p99_ms: the worst simulated p99 over its GPUs, ms (a dedicated GPU's is its plan's at C).
        memory_mib: its memory figure, MiB.
    """

    name: str
    rate_rps: float
    design_rate_rps: float
    capacity_rps: float
    target_ms: float
    config: Candidate
    dedicated_gpus: int
    shared_gpu: int | None
    shared_rate_rps: float
    p99_ms: float
    memory_mib: float

    @property
    def headroom_ms(self) -> float:
        """target - simulated p99, ms."""
        return self.target_ms - self.p99_ms


@dataclass(frozen=True)
class Placement:
    """The joint plan.

    Attributes:
        models: per model, sorted by name.
        shared: the shared GPUs, by ``gpu_id``.
        gpu_memory_mib: memory of each GPU, MiB.
        one_model_per_gpu: GPUs with one model per GPU: Σ max(minReplicas, ceil(λ / (u C))) (no maxReplicas cap).
        fractional_bound: Σ λ / C, the fewest GPUs any placement could use (fractional, no headroom).
        moves: models on a shared GPU both before and now whose GPU changed (0 without a current placement).
        kept_current: the current placement's shared GPUs were kept (False without one, or when re-packed).
    """

    models: tuple[ModelPlacement, ...]
    shared: tuple[SharedGpu, ...]
    gpu_memory_mib: float
    one_model_per_gpu: int
    fractional_bound: float
    moves: int = 0
    kept_current: bool = False
    _by_name: dict[str, ModelPlacement] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({m.name: m for m in self.models})

    @property
    def dedicated_gpus(self) -> int:
        return sum(m.dedicated_gpus for m in self.models)

    @property
    def gpus(self) -> int:
        """Dedicated + shared GPUs."""
        return self.dedicated_gpus + len(self.shared)

    def model(self, name: str) -> ModelPlacement:
        """The placement of ``name``; KeyError when it is not placed."""
        return self._by_name[name]

    def assignment(self) -> dict[str, int]:
        """Model name -> ``gpu_id`` of its shared GPU, for the models that have one."""
        return {m.name: m.shared_gpu for m in self.models if m.shared_gpu is not None}


@dataclass
class _Model:
    """One model while planning."""

    demand: ModelDemand
    plan: PlanResult
    table: tuple[float, ...]
    design_rate: float
    dedicated: int
    residual: float

    @property
    def capacity(self) -> float:
        return self.plan.chosen.capacity_rps

    @property
    def needs_shared(self) -> bool:
        """It has a residual, or no dedicated GPU (every model is loaded somewhere, even at rate 0)."""
        return self.residual > 0 or self.dedicated == 0

    def scaled(self, factor: float) -> _Model:
        """The same model at ``factor`` x its design rate (split again into dedicated GPUs and a residual)."""
        return _split(self.demand, self.plan, self.table, self.design_rate * factor)

    def tenant(self) -> Tenant:
        return Tenant(
            name=self.demand.name,
            rate_rps=self.residual,
            config=replace(self.plan.chosen, executors=1).batcher,
            latency_ms=self.table,
            target_ms=self.plan.target_p99_ms,
            memory_mib=self.demand.memory_mib,
            capacity_rps=self.capacity,
        )


def _plan_key(spec: BatchedModelSpec) -> str:
    """What the chosen batching and capacity depend on: two specs equal here plan the same."""
    parts = (
        spec.profile,
        spec.sla,
        spec.batching,
        spec.scaling.targetUtilization,
        spec.scaling.maxTargetUtilization,
        spec.triton.gpusPerReplica,
        spec.model.stateful,
        spec.model.sequenceStrategy,
    )
    return repr(parts)


def _models(
    demands: Sequence[ModelDemand], seed: int, solo: Mapping[str, PlanResult] | None, usable_mib: float
) -> list[_Model]:
    """Each model's own plan and its split into dedicated GPUs and a residual.

    Raises:
        ValueError: duplicate names.
        SpecError: a bad rate, a memory figure that exceeds the GPU, a multi-GPU replica, or the model's own plan
            (every problem of every model, each path prefixed with the model's name).
    """
    cache: dict[str, PlanResult | SpecError] = {}
    out: list[_Model] = []
    problems: list[Problem] = []
    if len({d.name for d in demands}) < len(demands):
        raise ValueError(f"model names must be unique, got {sorted(d.name for d in demands)}")
    for d in demands:
        bad = _demand_problems(d, usable_mib)
        if bad:
            problems += bad
            continue
        plan: PlanResult | SpecError
        if solo is not None and d.name in solo:
            plan = solo[d.name]
        else:
            key = _plan_key(d.spec)
            if key not in cache:
                try:
                    cache[key] = plan_batching(d.spec, seed=seed)
                except SpecError as e:
                    cache[key] = e
            plan = cache[key]
        if isinstance(plan, SpecError):
            problems += [Problem(f"{d.name}: {q.path}", q.message) for q in plan.problems]
            continue
        assert d.spec.profile is not None  # plan_batching raised otherwise
        table = tuple(LatencyProfile.from_points(d.spec.profile).table(plan.chosen.batcher.batch_cap))
        out.append(_split(d, plan, table, d.rate_rps / d.spec.scaling.targetUtilization))
    if problems:
        raise SpecError(problems)
    return out


def _demand_problems(d: ModelDemand, usable_mib: float) -> list[Problem]:
    """What is wrong with a demand before planning: its rate, its memory figure, a replica of several GPUs."""
    out: list[Problem] = []
    if not (math.isfinite(d.rate_rps) and d.rate_rps >= 0):
        out.append(Problem(f"{d.name}: rate", f"={d.rate_rps!r} must be a finite number >= 0 (req/s)"))
    if not 0 < d.memory_mib <= usable_mib:
        out.append(
            Problem(
                f"{d.name}: memory",
                f"={d.memory_mib:g} MiB must be > 0 and fit the GPU's {usable_mib:g} MiB left beside the server",
            )
        )
    if d.spec.triton.gpusPerReplica > 1:
        out.append(
            Problem(
                f"{d.name}: spec.triton.gpusPerReplica",
                f"={d.spec.triton.gpusPerReplica}: models of several GPUs per replica are not packed yet",
            )
        )
    return out


def _split(demand: ModelDemand, plan: PlanResult, table: tuple[float, ...], design: float) -> _Model:
    """``floor(design / C)`` dedicated GPUs and the residual rate (req/s; 0 within rounding of a multiple of C)."""
    c = plan.chosen.capacity_rps
    n = math.floor(design / c + 1e-9)
    residual = max(0.0, design - n * c)
    return _Model(demand, plan, table, design, n, 0.0 if residual <= 1e-9 * c else residual)


def _packed(
    models: dict[str, _Model], groups: list[tuple[int, list[str]]], gpu_mib: float, overhead: float, seed: int
) -> list[Bin]:
    """Every model that needs a shared GPU packed, the GPUs of ``groups`` (``(gpu_id, model names)``) kept first.
    A model that fails alone takes one more dedicated GPU instead (``models`` is updated)."""
    kept = kept_bins(
        [(g, [models[n].tenant() for n in names if n in models and models[n].needs_shared]) for g, names in groups],
        gpu_mib,
        overhead,
    )
    placed = {t.name for b in kept for t in b.tenants}
    items = [m.tenant() for n, m in sorted(models.items()) if m.needs_shared and n not in placed]
    bins, alone = pack(items, kept, gpu_mib, overhead, seed)
    for t in alone:
        m = models[t.name]
        m.dedicated, m.residual = m.dedicated + 1, 0.0  # its whole rate on dedicated GPUs, each under C
    return bins


def _result(
    models: dict[str, _Model],
    gpus: list[Bin],
    gpu_memory: float,
    overhead: float,
    current: Placement | None,
    kept: bool,
) -> Placement:
    where: dict[str, tuple[int | None, float, float]] = {}
    shared: list[SharedGpu] = []
    for g in sorted(gpus, key=lambda g: g.gpu_id):
        p99 = g.p99_ms or tuple(0.0 for _ in g.tenants)
        for t, p in zip(g.tenants, p99, strict=True):
            where[t.name] = (g.gpu_id, t.rate_rps, p)
        shared.append(
            SharedGpu(
                gpu_id=g.gpu_id,
                tenants=tuple(t.name for t in g.tenants),
                rates_rps=tuple(t.rate_rps for t in g.tenants),
                p99_ms=p99,
                duty_cycle_ms=duty_cycle_fits(g.tenants)[1],
                memory_mib=g.memory_mib(overhead),
            )
        )
    placed: list[ModelPlacement] = []
    for name, m in sorted(models.items()):
        gpu_id, rate, shared_p99 = where.get(name, (None, 0.0, 0.0))
        worst = max(shared_p99, m.plan.chosen.p99_ms if m.dedicated else 0.0)
        placed.append(
            ModelPlacement(
                name=name,
                rate_rps=m.demand.rate_rps,
                design_rate_rps=m.design_rate,
                capacity_rps=m.capacity,
                target_ms=m.plan.target_p99_ms,
                config=m.plan.chosen,
                dedicated_gpus=m.dedicated,
                shared_gpu=gpu_id,
                shared_rate_rps=rate,
                p99_ms=worst,
                memory_mib=m.demand.memory_mib,
            )
        )
    one_per_gpu = sum(
        max(
            m.demand.spec.scaling.minReplicas,
            math.ceil(m.demand.rate_rps / (m.demand.spec.scaling.targetUtilization * m.capacity) - 1e-9),
        )
        for m in models.values()
    )
    bound = sum(m.demand.rate_rps / m.capacity for m in models.values())
    moves = 0
    if current is not None:
        before = current.assignment()
        after = {n: g for n, (g, _, _) in where.items() if g is not None}
        moves = sum(1 for n, g in after.items() if n in before and before[n] != g)
    return Placement(tuple(placed), tuple(shared), gpu_memory, one_per_gpu, bound, moves, kept)


def plan_placement(
    demands: Sequence[ModelDemand],
    gpu_memory_mib: float,
    *,
    current: Placement | None = None,
    seed: int = 0,
    solo_plans: Mapping[str, PlanResult] | None = None,
    server_overhead_mib: float = DEFAULT_SERVER_OVERHEAD_MIB,
    min_saving_fraction: float = REPACK_MIN_SAVING_FRACTION,
    dissolve_min_saving: int = DISSOLVE_MIN_SAVING_GPUS,
) -> Placement:
    """Place the models on the fewest GPUs that keep every model's simulated p99 within its target (module
    docstring).

    Args:
        demands: the models, their rates and memory figures (names unique).
        gpu_memory_mib: memory of one GPU, MiB.
        current: the placement in force; kept unless, for rates :data:`REPACK_RATE_MARGIN` higher, emptying whole
            GPUs saves at least ``dissolve_min_saving`` GPUs or a plan from scratch at least
            ``max(1, ceil(min_saving_fraction x its GPUs))``.
        seed: seed of every simulation (the plan is deterministic for a given seed).
        solo_plans: each model's own plan when already known (e.g. ``status.plan``), by name; planned otherwise.
        server_overhead_mib: GPU memory each Triton server holds besides its models, MiB.
        min_saving_fraction, dissolve_min_saving: see ``current``.

    Raises:
        ValueError: duplicate names, or a GPU memory that does not exceed the server overhead.
        SpecError: a bad rate or memory figure, a model of several GPUs per replica, a spec without a profile, a
            model that cannot meet its SLA even alone: every problem of every model, each prefixed with its name.
    """
    usable = gpu_memory_mib - server_overhead_mib
    if not usable > 0:
        raise ValueError(
            f"gpu_memory_mib={gpu_memory_mib:g} leaves no room beside the server's {server_overhead_mib:g} MiB"
        )
    base = {m.demand.name: m for m in _models(demands, seed, solo_plans, usable)}
    if current is None:
        fresh = {n: replace(m) for n, m in base.items()}
        fresh_bins = dissolve(_packed(fresh, [], gpu_memory_mib, server_overhead_mib, seed), gpu_memory_mib,
                              server_overhead_mib, seed)  # fmt: skip
        return _result(fresh, fresh_bins, gpu_memory_mib, server_overhead_mib, None, False)
    kept = {n: replace(m) for n, m in base.items()}
    groups = [(s.gpu_id, list(s.tenants)) for s in current.shared]
    kept_plan = _result(
        kept, _packed(kept, groups, gpu_memory_mib, server_overhead_mib, seed), gpu_memory_mib, server_overhead_mib,
        current, True,
    )  # fmt: skip
    # re-packs, planned for rates REPACK_RATE_MARGIN higher and adopted only if they still save enough: first
    # emptying whole kept GPUs into the others (few moves), then a plan from scratch
    need = kept_plan.gpus - max(1, math.ceil(min_saving_fraction * kept_plan.gpus))
    high = {n: m.scaled(1 + REPACK_RATE_MARGIN) for n, m in base.items()}
    high_bins = dissolve(_packed(high, groups, gpu_memory_mib, server_overhead_mib, seed), gpu_memory_mib,
                         server_overhead_mib, seed)  # fmt: skip
    if len(high_bins) + sum(m.dedicated for m in high.values()) <= kept_plan.gpus - dissolve_min_saving:
        names = [[t.name for t in b.tenants] for b in high_bins]
        ids = [b.gpu_id for b in high_bins]
    else:
        high = {n: m.scaled(1 + REPACK_RATE_MARGIN) for n, m in base.items()}
        high_bins = dissolve(_packed(high, [], gpu_memory_mib, server_overhead_mib, seed), gpu_memory_mib,
                             server_overhead_mib, seed)  # fmt: skip
        if len(high_bins) + sum(m.dedicated for m in high.values()) > need:
            return kept_plan
        names = [[t.name for t in b.tenants] for b in high_bins]
        ids = matched_ids(names, {s.gpu_id: set(s.tenants) for s in current.shared})
    moved = {n: replace(m) for n, m in base.items()}
    bins = _packed(moved, list(zip(ids, names, strict=True)), gpu_memory_mib, server_overhead_mib, seed)
    return _result(moved, bins, gpu_memory_mib, server_overhead_mib, current, False)
