"""Which models can share one GPU: the shared-GPU simulator is the judge; Nexus' duty cycle is reported.

Notation (per model ``k`` on the GPU): request rate ``r_k`` (req/s), latency target ``T_k`` (ms), execution latency
``l_k(b)`` (ms), largest batch ``B_k``, capacity at SLA alone ``C_k`` (req/s), load ``r_k / C_k``.

A set of models fits one GPU when :func:`check_gpu` simulates them (:class:`batchfill.sim.shared.SharedReplica`,
one batch at a time in dispatch order) under independent Poisson arrivals at their rates and every model's p99
stays within its own ``T_k``. :func:`quick_check` decides whether a model may join a GPU: Σ load <= 1, then a short
simulation against 97 % of each target; a finished GPU is confirmed by a longer one.

Nexus' "squishy" bin packing (Shen et al., SOSP'19, https://dl.acm.org/doi/10.1145/3341301.3359658, section 6.1)
serves the models of a GPU round robin once per *duty cycle* ``d``: model ``k`` runs one batch of
``b_k = ceil(r_k d)`` per cycle, so a request waits at most one cycle and then its batch:

* alone, model ``k`` can take any cycle up to ``d_k = max_{1<=b<=B_k} min(b / r_k, T_k - l_k(b))``;
* together: ``d = min_k d_k``, ``b_k = ceil(r_k d)``, feasible when ``Σ_k l_k(b_k) <= d`` (``d + l_k(b_k) <= T_k``
  holds by the choice of ``d_k``).

:func:`duty_cycle_fits` computes it and the plan reports ``d`` per GPU, but it does not decide. Measured on 50
models with the seed example's profile (examples/seed-example.yaml; Zipf popularity, 2,000 req/s in all, design
rates λ / 0.85), first fit screened by this rule used 33 GPUs, and the confirming simulation rejected 15 of the 25
multi-model GPUs it admitted (re-checks after evictions included); screened by :func:`quick_check` it used 25, none
rejected. The rule assumes a scheduler
that runs one batch per model per cycle at average rates; Triton's batchers race for the GPU, a model's batch grows
with its wait, and Poisson bursts, not averages, set the p99.

Deterministic (fixed seeds). Work: :func:`duty_cycle_fits` O(Σ B_k); :func:`check_gpu` O(requests) with one Python
step per batch, stopped as soon as some model's p99 is certain to miss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from batchfill.sim.batcher import BatcherConfig
from batchfill.sim.shared import SharedModel, SharedReplica, poisson_arrivals

#: Requests simulated per GPU check (all models together), the fewest per model with load, and the most in all:
#: the confirming check of a finished GPU, and the quick one that decides whether a model may join a GPU.
CHECK_REQUESTS = 20_000
MIN_MODEL_REQUESTS = 500
QUICK_REQUESTS = 6_000
QUICK_MIN_MODEL_REQUESTS = 300
MAX_CHECK_REQUESTS = 120_000
#: The quick check asks for this fraction of each target, so that a GPU it admits rarely fails the confirming check.
QUICK_TARGET_SCALE = 0.97
#: Leading fraction of the simulated time ignored (the server starts empty, which would flatter the p99).
WARMUP_FRACTION = 0.05
#: Pieces the simulated time is advanced in, so that a clear miss stops the run early.
CHECK_STEPS = 8
P99 = 0.99


@dataclass(frozen=True)
class Tenant:
    """One model's share of a shared GPU.

    Attributes:
        name: the model (BatchedModel name), unique on a GPU.
        rate_rps: requests/s it sends to this GPU.
        config: its dynamic-batcher settings on this GPU (executors = instances on this GPU).
        latency_ms: ``[0, l(1), ..., l(B)]``, execution alone on the GPU, ms.
        target_ms: its p99 target (server budget less the safety margin), ms.
        memory_mib: GPU memory it holds when loaded, MiB.
        capacity_rps: its capacity at SLA alone on one GPU, req/s (> 0): ``rate_rps / capacity_rps`` is its load.
    """

    name: str
    rate_rps: float
    config: BatcherConfig
    latency_ms: tuple[float, ...]
    target_ms: float
    memory_mib: float
    capacity_rps: float

    @property
    def load(self) -> float:
        """Fraction of a GPU it would use alone: rate / capacity at SLA."""
        return self.rate_rps / self.capacity_rps


def duty_cycle_ms(t: Tenant) -> float:
    """The longest duty cycle ``d_k`` (ms) the model tolerates alone (module docstring); inf without load, and
    ``<= 0`` when not even a batch of one fits its target."""
    if t.rate_rps <= 0:
        return math.inf
    per_ms = t.rate_rps / 1000.0
    return max(min(b / per_ms, t.target_ms - t.latency_ms[b]) for b in range(1, t.config.batch_cap + 1))


def duty_cycle_fits(tenants: Sequence[Tenant]) -> tuple[bool, float]:
    """Nexus' rule for the models of one GPU: (feasible, the duty cycle d in ms)."""
    d = min((duty_cycle_ms(t) for t in tenants), default=math.inf)
    if d <= 0:
        return False, d
    if math.isinf(d):
        return True, d
    work = 0.0
    for t in tenants:
        b = math.ceil(t.rate_rps / 1000.0 * d - 1e-9)
        if b >= 1:
            work += t.latency_ms[min(b, t.config.batch_cap)]
    return work <= d, d


@dataclass(frozen=True)
class GpuCheck:
    """The simulated verdict on one GPU's models.

    Attributes:
        p99_ms: per tenant, in order, simulated p99 of queue + GPU wait + execution, ms (0 without requests; inf
            when the run stopped because that model was certain to miss its target).
        ok: every tenant's p99 is within its target.
        requests: requests simulated.
    """

    p99_ms: tuple[float, ...]
    ok: bool
    requests: int


def check_duration_s(rates_rps: Sequence[float], requests: int, min_model_requests: int) -> float:
    """Simulated time of a check, s: ``requests`` in all, at least ``min_model_requests`` for the least loaded
    model with load, and never more than :data:`MAX_CHECK_REQUESTS` in all (0 without load)."""
    total = sum(rates_rps)
    if total <= 0:
        return 0.0
    least = min(r for r in rates_rps if r > 0)
    return min(max(requests / total, min_model_requests / least), MAX_CHECK_REQUESTS / total)


def check_gpu(
    tenants: Sequence[Tenant],
    seed: int,
    *,
    requests: int = CHECK_REQUESTS,
    min_model_requests: int = MIN_MODEL_REQUESTS,
    target_scale: float = 1.0,
) -> GpuCheck:
    """Simulate the tenants on one GPU (:class:`batchfill.sim.shared.SharedReplica`) under independent Poisson
    arrivals at their rates and compare each p99 with ``target_scale`` x its target.

    Long because the early stop (a model whose misses already exceed 1 % of its requests) is interleaved with the
    interval-by-interval run.
    """
    rates = [t.rate_rps for t in tenants]
    duration = check_duration_s(rates, requests, min_model_requests)
    if duration <= 0:
        return GpuCheck(tuple(0.0 for _ in tenants), True, 0)
    arrivals = poisson_arrivals(rates, duration, seed)
    horizon = duration * 1000.0
    warm = horizon * WARMUP_FRACTION
    counted = [int(len(a) - np.searchsorted(a, warm)) for a in arrivals]
    allowed = [math.floor(n * (1 - P99)) for n in counted]
    targets = [t.target_ms * target_scale for t in tenants]
    server = SharedReplica([SharedModel(t.config, t.latency_ms, t.target_ms) for t in tenants])
    lat: list[list[npt.NDArray[np.float64]]] = [[] for _ in tenants]
    served = [0] * len(tenants)  # requests dispatched so far, per model (index into its arrivals)
    misses = [0] * len(tenants)
    edges = np.linspace(0.0, horizon, CHECK_STEPS + 1)
    cut = [np.searchsorted(a, edges) for a in arrivals]
    for step in range(CHECK_STEPS):
        until = math.inf if step == CHECK_STEPS - 1 else float(edges[step + 1])
        iv = server.advance([a[c[step] : c[step + 1]] for a, c in zip(arrivals, cut, strict=True)], until)
        for i, m in enumerate(iv.models):
            idx = np.arange(served[i], served[i] + m.completed)
            after = m.latencies_ms[arrivals[i][idx] >= warm]
            served[i] += m.completed
            misses[i] += int(np.count_nonzero(after > targets[i]))
            lat[i].append(after)
        if any(x > cap for x, cap in zip(misses, allowed, strict=True)):
            p99 = tuple(math.inf if x > cap else 0.0 for x, cap in zip(misses, allowed, strict=True))
            return GpuCheck(p99, False, sum(served))
    p99s = []
    for parts in lat:
        joined = np.concatenate(parts) if parts else np.empty(0)
        p99s.append(float(np.quantile(joined, P99, method="higher")) if len(joined) else 0.0)
    ok = all(p <= t for p, t in zip(p99s, targets, strict=True))
    return GpuCheck(tuple(p99s), ok, sum(served))


def quick_check(tenants: Sequence[Tenant], seed: int) -> bool:
    """Whether a model may join a GPU: the tenants, load within one GPU (Σ rate / capacity <= 1), pass a short
    :func:`check_gpu` (:data:`QUICK_REQUESTS`) against :data:`QUICK_TARGET_SCALE` x their targets."""
    if sum(t.load for t in tenants) > 1.0:
        return False
    return check_gpu(
        tenants,
        seed,
        requests=QUICK_REQUESTS,
        min_model_requests=QUICK_MIN_MODEL_REQUESTS,
        target_scale=QUICK_TARGET_SCALE,
    ).ok
