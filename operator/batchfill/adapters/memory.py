"""The operator process's heap on glibc: fewer malloc arenas, and freed memory handed back after each pass.

The operator runs a dozen threads (kopf's handler executor, the two loops, the children's informers, the
statistics and Prometheus pools, the /metrics server). glibc gives each thread that allocates its own malloc
arena, up to 8 per core, and a pass's freed objects stay in those arenas: resident memory then follows the
number of threads times the largest pass, not what is live. Two arenas and a ``malloc_trim`` after each pass
keep it to what is live (the same setting as ``MALLOC_ARENA_MAX=2``, common for threaded Python services). On a
libc without these calls (musl) nothing happens.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

#: mallopt's parameter number for the arena limit (glibc malloc.h: M_ARENA_MAX).
M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)  # the process's own symbols, libc's among them
    except OSError:
        return None


def limit_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (before the threads start); an explicit ``MALLOC_ARENA_MAX`` is left as set.
    Returns whether the cap was applied."""
    libc = _libc()
    if "MALLOC_ARENA_MAX" in os.environ or libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, int(arenas)))


def release_free_memory() -> None:
    """Return the heap's free pages to the operating system (glibc ``malloc_trim``; a no-op elsewhere)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
