"""A GPUPool's joint plan in the operator: its size, which pods serve which model, and each model's status (pure).

One pool tick (:class:`batchfill.controller.pool_loop.PoolModelsLoop`) gathers the pool's members with their
observed request rates, then:

1. :func:`decide_pool_plan` places them with :func:`batchfill.policy.placement.plan_placement` on the pool's GPU
   (``gpuMemoryMiB``), the placement in force passed as ``current`` so small rate changes keep every model where
   it is (the plan's hysteresis). It plans again when the members or their specs change, when a member's rate
   rose past what the placement was planned for (:func:`rates_rose`: a kept placement is re-checked at once, not
   up to a minute after its GPU stopped holding the load), or :data:`REPLAN_S` after the last plan; a rate that is
   not known (no Ready copy, Prometheus down) is the last known one, else 0: never a reason to move a model. An
   Auto model on replicas of its own is planned :data:`RETURN_MARGIN` above its rate (:func:`held_members`): it
   graduates when its load fills a GPU and comes back only once it is clearly below one.
2. :func:`pod_slots` turns the placement into slots: one per shared GPU, plus one per dedicated GPU of a model whose
   spec says Shared (it stays on the pool whatever its load; an Auto model that fills a GPU leaves for replicas
   of its own). The pool's pods are the slots, within ``[minPods, maxPods]``.
3. :func:`assign_slots` maps slots to the Ready pods, keeping every slot on the pod it had while that pod is there,
   so a pod added or lost moves only the models of the slots it takes or gives up.

A member left out of the joint plan (no profile yet, a spec the plan refuses) is served on the first slot's pod
and its status says why (``NotPlaced``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from batchfill.api.errors import Problem, SpecError
from batchfill.api.pool import GPUPoolSpec
from batchfill.api.spec import BatchedModelSpec, PlacementMode
from batchfill.policy.placement import (
    DEFAULT_MODEL_MEMORY_MIB,
    DEFAULT_SERVER_OVERHEAD_MIB,
    ModelDemand,
    Placement,
    plan_placement,
)
from batchfill.policy.plan import PlanResult

#: Seconds between two joint plans of an unchanged pool (a plan simulates every shared GPU: ~0.1-1 s per GPU).
REPLAN_S = 60.0
#: A member's rate that rose above its planned rate by this fraction plus :data:`REPLAN_RISE_FLOOR_RPS` triggers a
#: plan at once. Falls wait for REPLAN_S: a placement planned for more load still holds less (a saving deferred,
#: no SLA at risk). 10 %: the plan's own band (batchfill.policy.placement.REPACK_RATE_MARGIN), so a steady rate's
#: noise re-checks now and then but seldom moves anything.
REPLAN_RISE_FRACTION = 0.1
#: The floor keeps a model near 0 req/s (planned at 0, now at 0.05) from planning every tick, req/s.
REPLAN_RISE_FLOOR_RPS = 0.1
#: An Auto model on replicas of its own is planned for its rate times (1 + this) while it is there, so it comes back
#: to the pool only once its load is about 9 % below what one GPU serves (1 / 1.1), not as soon as it dips under:
#: each move starts or stops pods, and a rate hovering at one GPU would move it back and forth. The plan's band
#: (batchfill.policy.placement.REPACK_RATE_MARGIN).
RETURN_MARGIN = 0.1
#: A slot: ("gpu", shared gpu_id) or ("own", model name, k) for the k-th dedicated GPU of a Shared-mode model.
Slot = tuple[Any, ...]


@dataclass(frozen=True)
class Member:
    """A BatchedModel the pool serves.

    Attributes:
        name: the BatchedModel's name.
        spec: its spec (with the measured profile in place of spec.profile when the plan uses one).
        mode: its spec.placement.mode (Shared or Auto).
        memory_mib: spec.placement.memoryMiB, or the default, MiB.
        rate_rps: its observed request rate, req/s; None when not known this tick.
        solo: its own plan (the one status.plan states), or None when it has none the joint plan can use.
    """

    name: str
    spec: BatchedModelSpec
    mode: PlacementMode
    memory_mib: float = DEFAULT_MODEL_MEMORY_MIB
    rate_rps: float | None = None
    solo: PlanResult | None = None


@dataclass(frozen=True)
class PoolPlanMemory:
    """What one pool's ticks keep: the placement in force, what it was planned for (members' keys) and when
    (epoch s), the notes on the members that plan left out, the last known rate of each member (req/s), and the
    pod each slot is on."""

    placement: Placement | None = None
    key: tuple[tuple[str, str], ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict)
    at: float = -math.inf
    rates: Mapping[str, float] = field(default_factory=dict)
    slots: Mapping[Slot, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolPlan:
    """One tick's plan: the placement (None: nobody to place), the slots, the pods to run, each member's pods,
    notes on members left out (``name: why``), and the memory for the next tick."""

    placement: Placement | None
    slots: tuple[Slot, ...]
    pods: int
    where: Mapping[str, frozenset[str]]
    notes: Mapping[str, str]
    memory: PoolPlanMemory


def _key(m: Member) -> tuple[str, str]:
    spec = json.dumps(m.spec.model_dump(mode="json"), sort_keys=True)
    return m.name, hashlib.sha256(f"{spec}|{m.mode}|{m.memory_mib}".encode()).hexdigest()[:16]


def _rates(members: Sequence[Member], last: Mapping[str, float]) -> dict[str, float]:
    """Each member's rate: observed when finite and >= 0, else the last known one, else 0 (req/s)."""
    out = {}
    for m in members:
        r = m.rate_rps
        out[m.name] = r if r is not None and math.isfinite(r) and r >= 0 else last.get(m.name, 0.0)
    return out


def rates_rose(placement: Placement | None, rates: Mapping[str, float]) -> bool:
    """Whether some placed model's rate (req/s, by name) exceeds the rate ``placement`` planned it at by more than
    :data:`REPLAN_RISE_FRACTION` + :data:`REPLAN_RISE_FLOOR_RPS`. False without a placement."""
    if placement is None:
        return False
    return any(
        rates.get(m.name, 0.0) > m.rate_rps * (1 + REPLAN_RISE_FRACTION) + REPLAN_RISE_FLOOR_RPS
        for m in placement.models
    )


def graduated(placement: Placement | None, members: Sequence[Member]) -> set[str]:
    """The Auto members that ``placement`` gives dedicated GPUs: they leave the pool for replicas of their own,
    which carry all of their load."""
    if placement is None:
        return set()
    auto = {m.name for m in members if m.mode is PlacementMode.AUTO}
    return {p.name for p in placement.models if p.name in auto and p.dedicated_gpus > 0}


def held_members(members: Sequence[Member], current: Placement | None) -> list[Member]:
    """The members as the joint plan is given them: an Auto model that the placement in force serves on dedicated
    GPUs (its own replicas) with its ``targetUtilization`` divided by ``1 +`` :data:`RETURN_MARGIN`, so its design
    rate λ / u is that much higher while its rate stays what was observed; the others unchanged."""
    away = graduated(current, members)
    out = []
    for m in members:
        if m.name in away:
            scaling = m.spec.scaling.model_copy(
                update={"targetUtilization": m.spec.scaling.targetUtilization / (1 + RETURN_MARGIN)}
            )
            m = replace(m, spec=m.spec.model_copy(update={"scaling": scaling}))
        out.append(m)
    return out


#: The joint plan's names for a demand's figures (batchfill.policy.placement.ModelDemand), as a member's status
#: names them: the field a user sets, or what the operator measured.
_DEMAND_FIELDS = {"memory": "spec.placement.memoryMiB", "rate": "the observed request rate"}


def _member_note(problem: Problem) -> str:
    """A problem the joint plan found with one member, its path from the member's spec ("bm-a: memory" ->
    "spec.placement.memoryMiB=... MiB must ...")."""
    rest = problem.path.split(":", 1)[1].strip() if ":" in problem.path else problem.path
    return str(Problem(_DEMAND_FIELDS.get(rest, rest), problem.message))


def _place(
    spec: GPUPoolSpec, members: Sequence[Member], rates: Mapping[str, float], current: Placement | None
) -> tuple[Placement | None, dict[str, str]]:
    """The joint plan of the members that have a profiled plan; the others' notes."""
    notes = {m.name: "no profile yet: served on the pool's first pod until one is measured"
             for m in members if m.solo is None or m.spec.profile is None}  # fmt: skip
    placed = [m for m in members if m.name not in notes]
    while placed:
        demands = [ModelDemand(m.name, m.spec, rates[m.name], m.memory_mib) for m in placed]
        solo = {m.name: m.solo for m in placed if m.solo is not None}
        try:
            return plan_placement(demands, float(spec.gpuMemoryMiB), current=current, solo_plans=solo), notes
        except SpecError as err:
            # leave out the models named by the problems (each path starts with the model's name) and plan the rest
            bad = {p.path.split(":", 1)[0] for p in err.problems}
            for m in placed:
                if m.name in bad:
                    notes[m.name] = "; ".join(_member_note(p) for p in err.problems if p.path.startswith(f"{m.name}:"))
            if not bad & {m.name for m in placed}:
                notes.update({m.name: str(err) for m in placed})
                return None, notes
            placed = [m for m in placed if m.name not in bad]
        except ValueError:  # the pool's GPU memory leaves nothing beside the server (names are unique)
            why = (f"the GPUPool's spec.gpuMemoryMiB={spec.gpuMemoryMiB} leaves no room beside the Triton server's "
                   f"{DEFAULT_SERVER_OVERHEAD_MIB:g} MiB")  # fmt: skip
            notes.update({m.name: why for m in placed})
            return None, notes
    return None, notes


def pod_slots(placement: Placement | None, members: Sequence[Member]) -> tuple[Slot, ...]:
    """The pool's slots: its shared GPUs by gpu_id, then each Shared-mode model's dedicated GPUs (by name).

    An Auto model that fills a GPU leaves for replicas of its own, which carry all of its load (its scaling loop
    sizes them): the shared GPU the plan gave its residual is no slot unless another model stays on it, or the pool
    would hold a GPU that serves nothing."""
    if placement is None:
        return (("gpu", 0),) if members else ()
    modes = {m.name: m.mode for m in members}
    leaving = graduated(placement, members)
    shared: list[Slot] = [("gpu", g.gpu_id) for g in placement.shared if set(g.tenants) - leaving]
    own: list[Slot] = [
        ("own", p.name, k)
        for p in placement.models
        if modes.get(p.name) is PlacementMode.SHARED
        for k in range(p.dedicated_gpus)
    ]
    slots = shared + own
    return tuple(slots) if slots or not set(modes) - leaving else (("gpu", 0),)


def assign_slots(slots: Sequence[Slot], pods: Sequence[str], previous: Mapping[Slot, str]) -> dict[Slot, str]:
    """Each slot's pod: the one it had while that pod is still listed and holds no earlier slot, free slots to free
    pods by name, and, with fewer pods than slots, the rest onto the pods in turn (sharing until the pool has
    grown: a pod added then takes a slot from a shared pod, not none)."""
    listed = sorted(set(pods))
    if not listed:
        return {}
    out: dict[Slot, str] = {}
    taken: set[str] = set()
    for s in slots:
        pod = previous.get(s)
        if pod in listed and pod not in taken:
            out[s] = pod
            taken.add(pod)
    free = [p for p in listed if p not in taken]
    rest = [s for s in slots if s not in out]
    for i, s in enumerate(rest):
        out[s] = free[i] if i < len(free) else listed[(i - len(free)) % len(listed)]
    return out


def _where(
    placement: Placement | None, members: Sequence[Member], on: Mapping[Slot, str], notes: Mapping[str, str]
) -> dict[str, frozenset[str]]:
    """Each member's pods (a member that leaves for replicas of its own: none)."""
    first = on.get(("gpu", 0)) or (on[min(on)] if on else None)
    away = graduated(placement, members)
    out: dict[str, frozenset[str]] = {}
    for m in members:
        if m.name in notes or placement is None:
            out[m.name] = frozenset([first]) if first else frozenset()
            continue
        if m.name in away:
            out[m.name] = frozenset()
            continue
        p = placement.model(m.name)
        pods = {on[("own", m.name, k)] for k in range(p.dedicated_gpus) if ("own", m.name, k) in on}
        if p.shared_gpu is not None and ("gpu", p.shared_gpu) in on:
            pods.add(on[("gpu", p.shared_gpu)])
        out[m.name] = frozenset(pods)
    return out


def decide_pool_plan(
    spec: GPUPoolSpec, members: Sequence[Member], pods: Sequence[str], memory: PoolPlanMemory, now: float
) -> PoolPlan:
    """The pool's plan this tick (module docstring).

    Args:
        spec: the GPUPool's spec.
        members: the models it serves (names unique).
        pods: the names of the pool's pods that may serve now (Ready, their index read).
        memory: the previous tick's :attr:`PoolPlan.memory` (``PoolPlanMemory()`` at first).
        now: seconds since the epoch.

    Returns:
        The plan; ``pods`` within ``[spec.minPods, spec.maxPods]``, ``spec.minPods`` with no member.
    """
    rates = _rates(members, memory.rates)
    key = tuple(sorted(_key(m) for m in members))
    if not members:
        placement, notes = None, {}
    elif memory.key == key and now - memory.at < REPLAN_S and not rates_rose(memory.placement, rates):
        # the plan in force, with the reasons it gave for the members it left out: a kept plan restates them, or a
        # member's status would alternate between its reason and another each tick
        placement, notes = memory.placement, dict(memory.notes)
    else:
        placement, notes = _place(spec, held_members(members, memory.placement), rates, memory.placement)
    slots = pod_slots(placement, members)
    on = assign_slots(slots, pods, memory.slots)
    wanted = min(spec.maxPods, max(spec.minPods, len(slots)))
    replanned = placement is not memory.placement or memory.key != key
    kept = PoolPlanMemory(
        placement=placement,
        key=key,
        notes=notes,
        at=now if replanned or not members else memory.at,
        rates=rates,
        slots={**{s: p for s, p in memory.slots.items() if s in slots}, **on},
    )
    return PoolPlan(placement, slots, wanted, _where(placement, members, on, notes), notes, kept)
