"""First-fit decreasing of models onto shared GPUs, each GPU judged by simulation (:mod:`batchfill.policy.packing`).

:func:`pack` places every model (a :class:`~batchfill.policy.packing.Tenant`) on the first GPU whose memory holds it
and whose models, with it, pass :func:`~batchfill.policy.packing.quick_check`, in decreasing order of load (ties by
name), opening GPUs as needed. Then it confirms every GPU with :func:`~batchfill.policy.packing.check_gpu`; while
some model misses its target, the most loaded model (ties by name) leaves and is packed again, never back onto a GPU
it left. A model alone that fails is returned, for the caller to serve otherwise.

A GPU that refuses a model of load x is not offered models *of the same kind* (profile, target and batching
configuration) of load ``>=`` :data:`ROOM_SHRINK` x x again (its ``room`` for that kind: an upper bound on the load
of that kind it can still take, lowered by each model that joins): first fit then simulates each GPU a few times
instead of once per smaller model. Measured on 200 models (the seed example's profile, Zipf popularity): 4,000
quick checks without it, 300 with it, for 1 % more GPUs. Per kind, because whether a model fits depends on its
latencies against its neighbours' batches, not on its load alone: a GPU too busy for a model with a 35 ms budget
may still take one with 180 ms.

Deterministic: fixed orders, and each GPU's simulations are seeded with ``seed + gpu_id``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from batchfill.policy.packing import Tenant, check_gpu, quick_check

#: See the module docstring.
ROOM_SHRINK = 0.85


@dataclass
class Bin:
    """One shared GPU while packing.

    Attributes:
        gpu_id: its identity (kept across re-plans).
        tenants: its models, in the server's order (the order they joined).
        left: models that were evicted from it; they never join it again.
        p99_ms: each tenant's p99 from the confirming check; None until confirmed (or after a change).
        room: upper bound on the load it can still take (Σ load <= 1).
        kind_room: per kind of model (:func:`kind`), a lower bound learnt from refusals.
    """

    gpu_id: int
    tenants: list[Tenant]
    left: set[str] = field(default_factory=set)
    p99_ms: tuple[float, ...] | None = None
    room: float = 1.0
    kind_room: dict[tuple[object, ...], float] = field(default_factory=dict)

    def memory_mib(self, overhead_mib: float) -> float:
        """Σ tenant memory + the server's overhead, MiB."""
        return overhead_mib + sum(t.memory_mib for t in self.tenants)


def kind(t: Tenant) -> tuple[object, ...]:
    """What a model's fit depends on besides its load: its latency table, target and batching configuration."""
    return (t.latency_ms, t.target_ms, t.config)


def first_fit(
    items: Sequence[Tenant], bins: list[Bin], gpu_memory_mib: float, overhead_mib: float, seed: int
) -> list[Bin]:
    """``items`` added to ``bins`` (mutated, returned) first-fit decreasing by load; new GPUs get the next ids."""
    next_id = max((b.gpu_id for b in bins), default=-1) + 1
    for t in sorted(items, key=lambda t: (-t.load, t.name)):
        for b in bins:
            k = kind(t)
            room = min(b.room, b.kind_room.get(k, 1.0))
            if t.load >= room or t.name in b.left or b.memory_mib(overhead_mib) + t.memory_mib > gpu_memory_mib:
                continue
            if quick_check([*b.tenants, t], seed + b.gpu_id):
                b.tenants.append(t)
                b.p99_ms = None
                b.room -= t.load
                b.kind_room = {key: r - t.load for key, r in b.kind_room.items()}
                break
            b.kind_room[k] = min(room, t.load * ROOM_SHRINK)
        else:
            bins.append(Bin(next_id, [t], room=1.0 - t.load))
            next_id += 1
    return bins


def pack(
    items: Sequence[Tenant], bins: list[Bin], gpu_memory_mib: float, overhead_mib: float, seed: int
) -> tuple[list[Bin], list[Tenant]]:
    """Pack ``items`` into ``bins`` (which may hold models already) and new GPUs, then confirm every GPU (module
    docstring). Returns the GPUs that hold models, all confirmed, and the models that failed alone."""
    bins = first_fit(items, bins, gpu_memory_mib, overhead_mib, seed)
    alone: list[Tenant] = []
    while True:
        evicted: list[Tenant] = []
        for b in bins:
            while b.tenants and b.p99_ms is None:
                check = check_gpu(b.tenants, seed + b.gpu_id)
                if check.ok:
                    b.p99_ms = check.p99_ms
                elif len(b.tenants) == 1:
                    alone.append(b.tenants.pop())
                else:
                    worst = max(b.tenants, key=lambda t: (t.load, t.name))
                    b.tenants.remove(worst)
                    b.left.add(worst.name)
                    evicted.append(worst)
                    # its room grows again; what was refused next to the evicted model may fit now
                    b.room = 1.0 - sum(t.load for t in b.tenants)
                    b.kind_room = {}
        bins = [b for b in bins if b.tenants]
        if not evicted:
            return bins, alone
        bins = first_fit(evicted, bins, gpu_memory_mib, overhead_mib, seed)


def dissolve(bins: list[Bin], gpu_memory_mib: float, overhead_mib: float, seed: int) -> list[Bin]:
    """Empty whole GPUs into the others, least loaded first: a GPU goes when each of its models joins another GPU
    (first fit by decreasing load, memory and :func:`~batchfill.policy.packing.quick_check`) and every GPU that
    took one passes the confirming check; otherwise nothing changes. Only the models of an emptied GPU move, so a
    re-plan that saves GPUs this way moves few models. ``bins`` must be confirmed; returns the GPUs left (confirmed).
    O(G x K) quick checks for G GPUs of at most K models."""
    for victim in sorted(bins, key=lambda b: (sum(t.load for t in b.tenants), b.gpu_id)):
        others = [b for b in bins if b is not victim]
        if not others:
            break
        trial = {b.gpu_id: list(b.tenants) for b in others}
        placed = True
        for t in sorted(victim.tenants, key=lambda t: (-t.load, t.name)):
            for b in others:
                tenants = trial[b.gpu_id]
                if t.name in b.left or sum(x.load for x in tenants) + t.load > 1.0:
                    continue
                if overhead_mib + sum(x.memory_mib for x in tenants) + t.memory_mib > gpu_memory_mib:
                    continue
                if quick_check([*tenants, t], seed + b.gpu_id):
                    tenants.append(t)
                    break
            else:
                placed = False
                break
        if not placed:
            continue
        changed = [b for b in others if len(trial[b.gpu_id]) != len(b.tenants)]
        checks = {b.gpu_id: check_gpu(trial[b.gpu_id], seed + b.gpu_id) for b in changed}
        if all(c.ok for c in checks.values()):
            for b in changed:
                b.tenants, b.p99_ms = trial[b.gpu_id], checks[b.gpu_id].p99_ms
                b.room = 1.0 - sum(t.load for t in b.tenants)
                b.kind_room = {}
            bins = others
    return bins


def kept_bins(groups: Sequence[tuple[int, Sequence[Tenant]]], gpu_memory_mib: float, overhead_mib: float) -> list[Bin]:
    """GPUs that keep their models (``(gpu_id, tenants)``, to be confirmed by :func:`pack`); one over memory loses
    its largest models (ties by name) until it fits; empty ones are dropped."""
    out: list[Bin] = []
    for gpu_id, tenants in groups:
        b = Bin(gpu_id, list(tenants))
        while b.memory_mib(overhead_mib) > gpu_memory_mib:
            b.tenants.remove(max(b.tenants, key=lambda t: (t.memory_mib, t.name)))
        b.room = 1.0 - sum(t.load for t in b.tenants)
        if b.tenants:
            out.append(b)
    return out


def matched_ids(groups: Sequence[Sequence[str]], before: Mapping[int, set[str]]) -> list[int]:
    """A ``gpu_id`` for each group of model names: the id of the earlier GPU it shares most models with (greedy,
    largest overlap first, ties by lower id then earlier group), so that a re-plan counts as moves only the models
    that really change GPU; groups without overlap get new ids above every earlier one."""
    pairs = sorted(
        (
            (-len(before[g] & set(names)), g, i)
            for i, names in enumerate(groups)
            for g in sorted(before)
            if before[g] & set(names)
        )
    )
    ids: dict[int, int] = {}
    taken: set[int] = set()
    for _, g, i in pairs:
        if i not in ids and g not in taken:
            ids[i] = g
            taken.add(g)
    fresh = max([*before, -1]) + 1
    out: list[int] = []
    for i in range(len(groups)):
        if i in ids:
            out.append(ids[i])
        else:
            out.append(fresh)
            fresh += 1
    return out
