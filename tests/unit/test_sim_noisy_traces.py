"""Noisy generated traces (sim.traces.noisy_day, bursty_minutes): mean, noise level, shapes, seeds, errors.

Statistical checks use fixed seeds and tolerances of several standard deviations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchfill.sim import traces

DAY = {"duration_s": 4 * 3600.0, "period_s": 4 * 3600.0}


def per_minute(trace: traces.Trace) -> np.ndarray:
    a = trace.arrivals()
    return np.bincount((a // 60).astype(np.int64), minlength=math.ceil(trace.duration_s / 60))


@pytest.mark.parametrize("shape", traces.DAY_SHAPES)
def test_noisy_day_keeps_the_mean_rate(shape: str) -> None:
    t = traces.noisy_day(50.0, shape=shape, noise_sigma=0.2, seed=7, **DAY)
    measured = len(t.arrivals()) / t.duration_s
    # 240 minutes of AR(1) noise σ 0.2: the mean of the noise factor has sd ≈ 0.2·sqrt(3/240) ≈ 2.2 %; allow 9 %
    assert measured == pytest.approx(50.0, rel=0.09), (shape, measured)


def test_noise_sigma_sets_the_minute_to_minute_variability() -> None:
    calm = traces.noisy_day(200.0, shape="plateau", noise_sigma=0.0, seed=3, **DAY)
    noisy = traces.noisy_day(200.0, shape="plateau", noise_sigma=0.3, seed=3, **DAY)
    # the flat top of the plateau (9h-17h of the day): minutes 90-170 of the compressed 4 h day
    top_calm, top_noisy = per_minute(calm)[95:165], per_minute(noisy)[95:165]
    cv_calm, cv_noisy = top_calm.std() / top_calm.mean(), top_noisy.std() / top_noisy.mean()
    # without noise only Poisson counts of ~12,000 per minute vary (cv ≈ 0.9 %); σ 0.3 gives cv ≈ 30 %
    assert cv_calm < 0.03, cv_calm
    assert 0.2 < cv_noisy < 0.45, cv_noisy


def test_seeded_and_reproducible() -> None:
    a = traces.noisy_day(20.0, seed=5, **DAY).arrivals()
    b = traces.noisy_day(20.0, seed=5, **DAY).arrivals()
    c = traces.noisy_day(20.0, seed=6, **DAY).arrivals()
    assert np.array_equal(a, b)
    assert len(a) != len(c) or not np.array_equal(a, c)
    blocks = np.concatenate(list(traces.noisy_day(20.0, seed=5, **DAY).blocks(60.0)))
    assert np.array_equal(a, blocks), "block length must not change the draws"


def test_double_day_has_two_peaks_and_plateau_a_flat_top() -> None:
    x = (np.arange(1440) + 0.5) / 1440
    double = traces._day_shape("double", x)
    hours = x * 24
    assert double[(hours > 9) & (hours < 11)].max() == pytest.approx(0.8, abs=0.02)
    assert double[(hours > 19) & (hours < 21)].max() == pytest.approx(1.0, abs=0.02)
    assert double[(hours > 14) & (hours < 16)].max() < 0.3
    plateau = traces._day_shape("plateau", x)
    assert np.all(plateau[(hours >= 9) & (hours <= 17)] == 1.0)
    assert np.all(plateau[hours < 7] == 0.0)


def test_bursty_minutes_has_bursts_at_the_factor() -> None:
    t = traces.bursty_minutes(100.0, bursts_per_hour=6.0, burst_factor=3.0, noise_sigma=0.0, seed=1,
                              duration_s=3 * 3600.0)  # fmt: skip
    rates = per_minute(t) / 60.0
    high = rates > 200.0
    assert 0.05 < high.mean() < 0.6, high.mean()
    assert rates[high].mean() == pytest.approx(300.0, rel=0.05)
    assert rates[~high].mean() == pytest.approx(100.0, rel=0.05)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"shape": "weekly"}, "shape"),
        ({"noise_sigma": -0.1}, "noise_sigma"),
        ({"noise_correlation": 1.0}, "noise_correlation"),
        ({"peak_to_trough": 0.5}, "peak_to_trough"),
    ],
)
def test_noisy_day_rejects_bad_arguments(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        traces.noisy_day(10.0, **kwargs)  # type: ignore[arg-type]


def test_bursty_minutes_rejects_a_factor_below_one() -> None:
    with pytest.raises(ValueError, match="burst_factor"):
        traces.bursty_minutes(10.0, burst_factor=0.5)
