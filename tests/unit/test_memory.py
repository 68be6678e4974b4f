"""The operator's heap settings on glibc (adapters/memory.py), in a fresh interpreter each: mallopt is per process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHECK = "from batchfill.adapters import memory; print(memory.limit_arenas()); memory.release_free_memory()"


def _run(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_arenas_are_capped_unless_the_user_set_malloc_arena_max() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert _run(env) == "True"
    assert _run(env | {"MALLOC_ARENA_MAX": "8"}) == "False"  # the user's explicit setting wins
