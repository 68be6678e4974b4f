"""The comparison's one error type (shared by :mod:`batchfill.compare.run` and :mod:`batchfill.compare.baselines`)."""

from __future__ import annotations


class CompareError(ValueError):
    """A comparison that cannot run; the message names the field and the numbers."""
