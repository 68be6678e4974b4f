"""The planner as it was before the compiled batcher, loaded from this repository's git history: the baseline
that benchmarks/plan_speed.py runs side by side with today's.

:func:`load` reads ``policy/plan.py`` and ``sim/batcher.py`` of :data:`BASELINE_COMMIT` with ``git show`` and
executes them as two modules of their own (the old plan imports the old batcher; everything else it imports,
the API models and the latency profile, is today's package, unchanged since). Nothing is copied into the tree,
and the operator never imports this. Needs a git checkout that has the commit (a clone, not a source tarball).
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

#: The last commit whose planner ran the batcher's event loop in Python.
BASELINE_COMMIT = "099221c"
ROOT = Path(__file__).resolve().parents[1]
PLAN, BATCHER = "operator/batchfill/policy/plan.py", "operator/batchfill/sim/batcher.py"


class BaselineUnavailableError(RuntimeError):
    """The baseline commit cannot be read (no git, or a checkout without that history)."""


def _source(path: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE_COMMIT}:{path}"], capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BaselineUnavailableError(f"git show {BASELINE_COMMIT}:{path}: {e}") from None
    if done.returncode != 0:
        raise BaselineUnavailableError(f"git show {BASELINE_COMMIT}:{path}: {done.stderr.strip()}")
    return done.stdout


def _module(name: str, source: str, path: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"{BASELINE_COMMIT}:{path}"
    sys.modules[name] = module  # dataclasses resolve their annotations through sys.modules
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def load() -> types.ModuleType:
    """The old ``batchfill.policy.plan`` module (its ``plan_batching`` is the baseline). Raises
    :class:`BaselineUnavailableError`."""
    if "plan_baseline_plan" in sys.modules:
        return sys.modules["plan_baseline_plan"]
    _module("plan_baseline_batcher", _source(BATCHER), BATCHER)
    plan = _source(PLAN).replace("from batchfill.sim.batcher import", "from plan_baseline_batcher import")
    return _module("plan_baseline_plan", plan, PLAN)
