"""A real node's cgroup root (``cgroupRoot`` of its kubelet, ``/batchfill-<a>-<i>``) in every mounted cgroup
hierarchy: made before the kubelet starts (cgroup v1 with the cgroupfs driver wants the path in each hierarchy,
else ``cgroup [...] has some missing paths``), emptied and removed on shutdown.

The hierarchies are the ``cgroup``/``cgroup2`` mount points of ``/proc/self/mountinfo`` (:func:`hierarchies`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


def unescape_mount_path(field: str) -> str:
    """A mountinfo path with its octal escapes (``\\040`` for a space, ...) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """``(mount point, filesystem type)`` of each line of a ``/proc/<pid>/mountinfo`` text (proc(5))."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        out.append((unescape_mount_path(fields[4]), right.split()[0]))
    return out


def hierarchies(mountinfo: str | None = None) -> list[Path]:
    """Mount points of the mounted cgroup hierarchies (v1 ``cgroup`` and v2 ``cgroup2``)."""
    text = MOUNTINFO.read_text() if mountinfo is None else mountinfo
    return [Path(mp) for mp, fstype in parse_mountinfo(text) if fstype in ("cgroup", "cgroup2")]


def _rel(cgroup: str) -> str:
    return cgroup.strip("/")


def create(cgroup: str) -> list[Path]:
    """Make ``cgroup`` (``/name``) in every hierarchy, with cpuset.cpus/mems copied from the parent; the dirs."""
    made = []
    for h in hierarchies():
        d = h / _rel(cgroup)
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            src = d.parent / f
            if src.is_file() and (d / f).is_file() and not (d / f).read_text().strip():
                (d / f).write_text(src.read_text())
        made.append(d)
    return made


def existing_dirs(cgroup: str) -> list[Path]:
    """Every directory of ``cgroup`` and below it, in every hierarchy, deepest first."""
    found: list[Path] = []
    for h in hierarchies():
        top = h / _rel(cgroup)
        if top.is_dir():
            found += [Path(root) for root, _dirs, _files in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def pids_in(dirs: Iterable[Path]) -> set[int]:
    """The PIDs of the processes in the given cgroup directories."""
    pids: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
    return pids


def kill_all_in(cgroup: str) -> set[int]:
    """SIGKILL every process in ``cgroup`` or below (containers a stopped containerd left); the PIDs signalled."""
    pids = pids_in(existing_dirs(cgroup))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def remove(cgroup: str) -> list[Path]:
    """``rmdir`` ``cgroup`` and everything below it in every hierarchy, deepest first; the ones that remain."""
    left = []
    for d in existing_dirs(cgroup):
        try:
            d.rmdir()
        except OSError:
            left.append(d)
    return left
