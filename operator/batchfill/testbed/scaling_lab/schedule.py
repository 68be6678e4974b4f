"""The scaling lab's load schedule: a piecewise-linear offered rate over named phases, and its seeded Poisson
arrivals (pure; times are seconds since the load started)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from batchfill.testbed.loadgen import varying_poisson_arrivals


@dataclass(frozen=True)
class RampShape:
    """The load schedule in units of ``u·C`` (one replica's worth: target utilization × capacity at SLA).

    ``warm_s`` at ``base``, a linear ramp over ``up_s`` to ``peak``, ``hold_s`` at ``peak``, a linear ramp over
    ``down_s`` to ``low``, ``low_s`` at ``low``.
    """

    base: float = 0.5
    peak: float = 2.4
    low: float = 0.4
    warm_s: float = 20.0
    up_s: float = 80.0
    hold_s: float = 40.0
    down_s: float = 15.0
    low_s: float = 60.0


@dataclass(frozen=True)
class Phase:
    """One segment of the schedule: the rate goes linearly from ``rate_from`` to ``rate_to`` (requests/s)."""

    name: str
    start_s: float
    end_s: float
    rate_from: float
    rate_to: float

    def rate_at(self, t: float) -> float:
        span = self.end_s - self.start_s
        x = 0.0 if span <= 0 else min(1.0, max(0.0, (t - self.start_s) / span))
        return self.rate_from + (self.rate_to - self.rate_from) * x


@dataclass(frozen=True)
class LoadSchedule:
    """A piecewise-linear offered rate over consecutive phases (requests/s; one sample per request)."""

    phases: tuple[Phase, ...]

    @classmethod
    def from_ramp(cls, shape: RampShape, unit_rps: float) -> LoadSchedule:
        """The schedule of ``shape`` with one unit = ``unit_rps`` requests/s (normally ``u·C``)."""
        segments = [
            ("warm", shape.warm_s, shape.base, shape.base),
            ("ramp-up", shape.up_s, shape.base, shape.peak),
            ("hold", shape.hold_s, shape.peak, shape.peak),
            ("ramp-down", shape.down_s, shape.peak, shape.low),
            ("low", shape.low_s, shape.low, shape.low),
        ]
        phases, t = [], 0.0
        for name, span, a, b in segments:
            if span > 0:
                phases.append(Phase(name, t, t + span, a * unit_rps, b * unit_rps))
                t += span
        return cls(tuple(phases))

    @property
    def duration_s(self) -> float:
        return self.phases[-1].end_s if self.phases else 0.0

    @property
    def peak_rps(self) -> float:
        return max((max(p.rate_from, p.rate_to) for p in self.phases), default=0.0)

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)

    def phase_at(self, t: float) -> Phase | None:
        for p in self.phases:
            if p.start_s <= t < p.end_s:
                return p
        return None

    def rate_at(self, t: float) -> float:
        p = self.phase_at(t)
        return 0.0 if p is None else p.rate_at(t)

    def arrivals(self, seed: int) -> npt.NDArray[np.float64]:
        """The Poisson arrival times of the whole schedule (seeded)."""
        peak = self.peak_rps
        if peak <= 0:
            return np.zeros(0)
        return varying_poisson_arrivals(self.rate_at, self.duration_s, rate_max_rps=peak, seed=seed)

    def integral(
        self, f: Callable[[float], float], t0: float = 0.0, t1: float | None = None, dt: float = 0.05
    ) -> float:
        """∫ f(rate(t)) dt over [t0, t1] (midpoint rule on a ``dt`` grid)."""
        end = self.duration_s if t1 is None else t1
        n = max(1, math.ceil((end - t0) / dt))
        h = (end - t0) / n
        return sum(f(self.rate_at(t0 + (i + 0.5) * h)) for i in range(n)) * h
