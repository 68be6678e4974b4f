"""Distinct, realistic BatchedModel specs for the planning benchmarks (seeded: the same seed gives the same specs).

Each spec draws a profile shape (GPU-like sub-linear ``l(b) = a + c b^alpha`` with alpha in [0.35, 1], or CPU-like
linear, or a knee where the accelerator saturates), 3-12 measured batch sizes up to 8-256, multiplicative
measurement noise of 0-8 % (which the profile's running maximum then makes monotone), an SLA between 1.3x and
25x of ``l(1)`` beyond the network overhead, and, for a fraction of the specs, a ``maxBatchSize`` limit, user
preferred sizes or queue delay, a safety margin, several GPUs per replica, a stateful Direct model or batching
off. Nothing here was tuned to the planner: the ranges are what Triton users declare.
"""

from __future__ import annotations

import math
import random
from typing import Any

SIZE_LADDERS = (
    (1, 2, 4, 8),
    (1, 4, 8),
    (1, 2, 4, 8, 16),
    (1, 2, 4, 8, 16, 32),
    (1, 8, 16, 32, 64),
    (1, 2, 4, 8, 16, 32, 64, 128),
    (1, 2, 4, 8, 12, 16, 24, 32, 48, 64),
    (1, 16, 32, 64, 128, 256),
    (1, 3, 5, 10, 20, 40),
    (2, 4, 6, 8, 10, 12),
)


def _latencies(rng: random.Random, sizes: tuple[int, ...]) -> list[float]:
    base = rng.uniform(0.3, 40.0)  # l(1), ms
    shape = rng.choice(("sublinear", "linear", "knee"))
    if shape == "sublinear":
        alpha = rng.uniform(0.35, 1.0)
        fixed = rng.uniform(0.2, 0.8)
        raw = [base * (fixed + (1 - fixed) * b**alpha) for b in sizes]
    elif shape == "linear":
        per = rng.uniform(0.6, 1.1)
        raw = [base * (1 - per + per * b) for b in sizes]
    else:
        knee = rng.choice((4, 8, 16, 32))
        flat = rng.uniform(0.05, 0.3)
        raw = [base * (1 + flat * (min(b, knee) - 1) + max(0, b - knee) * rng.uniform(0.7, 1.0)) for b in sizes]
    noise = rng.choice((0.0, 0.02, 0.05, 0.08))
    return [round(x * math.exp(rng.gauss(0.0, noise)), 3) for x in raw]


def spec_document(rng: random.Random, index: int) -> dict[str, Any]:
    """One BatchedModel document (``load_model`` input) drawn from ``rng``."""
    sizes = rng.choice(SIZE_LADDERS)
    lats = _latencies(rng, sizes)
    l1 = lats[0]
    network = round(rng.choice((0.0, 1.0, 2.0, 5.0, 10.0, 20.0)) * rng.uniform(0.5, 1.5), 2)
    sla = round(network + l1 * rng.uniform(1.3, 25.0), 2)
    spec: dict[str, Any] = {
        "model": {"name": f"bench-{index:05d}", "backend": "python"},
        "sla": {"latencyP99Ms": sla, "networkOverheadMs": network},
        "profile": [{"batchSize": b, "latencyMs": lat} for b, lat in zip(sizes, lats, strict=True)],
        "scaling": {"targetUtilization": rng.choice((0.5, 0.7, 0.8, 0.9))},
    }
    batching: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.04:
        batching["maxBatchSize"] = 0
    elif roll < 0.2:
        batching["maxBatchSize"] = rng.randint(1, sizes[-1] + 8)
    elif roll < 0.27:
        batching["preferredBatchSizes"] = sorted(rng.sample(range(1, max(2, sizes[-1] // 2) + 1), 1))
    elif roll < 0.34:
        batching["maxQueueDelayMicroseconds"] = rng.choice((100, 500, 1000, 5000))
    if rng.random() < 0.15:
        batching["safetyMarginPercent"] = rng.choice((5, 10, 20))
    if batching:
        spec["batching"] = batching
    if rng.random() < 0.15:
        spec["triton"] = {"gpusPerReplica": rng.choice((2, 4))}
    if rng.random() < 0.05:
        spec["model"]["stateful"] = True
        spec["model"]["sequenceStrategy"] = "Direct"
    return {"apiVersion": "batchfill.io/v1alpha1", "kind": "BatchedModel", "spec": spec}


def spec_documents(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` documents from ``random.Random(seed)``."""
    rng = random.Random(seed)
    return [spec_document(rng, i) for i in range(count)]
