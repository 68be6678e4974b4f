"""How the fleet replay splits a model's true rate between its shared and dedicated GPUs
(batchfill.compare.shared_fleet.split_rate, followed_replicas): as planned, and following the rate as the operator's
scaling does."""

from __future__ import annotations

from functools import cache

import pytest

from batchfill.api.validate import load_model
from batchfill.compare.shared_fleet import followed_replicas, split_rate
from batchfill.policy.placement import ModelPlacement
from batchfill.policy.plan import Candidate, plan_batching

from .fleet_docs import named

C = 100.0  # capacity at SLA, req/s
U = 0.85


@cache
def candidate() -> Candidate:
    return plan_batching(load_model(named("m")).spec).chosen


def placed(rate: float, dedicated: int, shared_rate: float | None) -> ModelPlacement:
    """A model planned at ``rate`` (design rate ``rate / U``) with ``dedicated`` GPUs and a shared GPU carrying
    ``shared_rate`` (None: no shared GPU)."""
    return ModelPlacement(
        name="m", rate_rps=rate, design_rate_rps=rate / U, capacity_rps=C, target_ms=90.0, config=candidate(),
        dedicated_gpus=dedicated, shared_gpu=None if shared_rate is None else 0,
        shared_rate_rps=shared_rate or 0.0, p99_ms=50.0, memory_mib=1024.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("planned", "rate_c", "expected"),
    [
        (2, 1.5, 2),  # within the planned replicas' capacity: held
        (2, 1.9, 2),  # above u C each but not saturated: no evidence, held
        (2, 2.1, 3),  # a replica would carry more than C: out to ceil(2.1 / 0.85) = 3
        (1, 2.5, 3),  # out to the proportional count at once: ceil(2.5 / 0.85) = 3
        (3, 0.5, 1),  # in to the proportional count
        (2, 0.0, 1),  # never below one
    ],
)
def test_followed_replicas_scale_out_on_saturation_and_in_to_the_proportional_count(
    planned: int, rate_c: float, expected: int
) -> None:
    assert followed_replicas(planned, rate_c * C, U, C) == expected


def test_split_as_planned_keeps_the_planned_shares() -> None:
    # planned at 170 req/s: design 200 = one dedicated GPU at C = 100 + a residual of 100 on the shared GPU
    m = placed(170.0, 1, 100.0)
    shared, n, each = split_rate(m, 204.0, U, follow=False)  # 20 % more than planned
    assert n == 1
    assert shared == pytest.approx(102.0)  # half of the true rate, above the 100 it was checked at
    assert each == pytest.approx(102.0)


def test_following_caps_the_shared_gpu_at_its_checked_rate_and_scales_the_dedicated_ones() -> None:
    m = placed(170.0, 1, 100.0)
    shared, n, each = split_rate(m, 204.0, U, follow=True)
    assert shared == pytest.approx(100.0)  # at most the rate its GPU was checked at
    assert n == 2  # 104 on one replica exceeds C: out to ceil(104 / 85) = 2
    assert shared + n * each == pytest.approx(204.0), "every request served"
    low_shared, low_n, low_each = split_rate(m, 120.0, U, follow=True)
    assert low_shared == pytest.approx(60.0)
    assert (low_n, low_each) == (1, pytest.approx(60.0))


def test_a_model_only_on_a_shared_gpu_is_served_there_in_both_modes() -> None:
    m = placed(40.0, 0, 40.0 / U)
    for follow in (False, True):
        assert split_rate(m, 60.0, U, follow=follow) == (60.0, 0, 0.0)
    dedicated_only = placed(170.0, 2, None)
    assert split_rate(dedicated_only, 170.0, U, follow=False) == (0.0, 2, pytest.approx(85.0))
    assert split_rate(dedicated_only, 260.0, U, follow=True) == (0.0, 4, pytest.approx(65.0))
