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


#: CPU weight of a node's cgroup root, as cgroup v1 ``cpu.shares`` (a nice-0 task weighs 1024). The node's pods
#: share this machine's cores with the control plane, Prometheus, the operator and the test itself, which run as
#: tasks of the root cgroup, each weighing as much as a group of the default 1024: with the default, every pod of
#: the node together got one task's worth of CPU while the host was busy, and a pool pod's Triton stalled for
#: 600 ms (all its models at once) while the operator restarted and another pod started. A real node does not
#: share its CPU with the control plane; 8 tasks' worth keeps the pods served without starving the host.
NODE_CPU_SHARES = 8 * 1024


def cpu_weight_v2(shares: int) -> int:
    """cgroup v2 ``cpu.weight`` (1..10000) for a v1 ``cpu.shares`` (2..262144): the linear map of one range onto
    the other that runc and the kubelet use (https://github.com/kubernetes/enhancements/tree/master/keps/sig-node/
    2254-cgroup-v2)."""
    shares = min(max(shares, 2), 262144)
    return 1 + ((shares - 2) * 9999) // 262142


def create(cgroup: str, cpu_shares: int = NODE_CPU_SHARES) -> list[Path]:
    """Make ``cgroup`` (``/name``) in every hierarchy, with cpuset.cpus/mems copied from the parent and the CPU
    weight ``cpu_shares`` (v1 ``cpu.shares``, or its v2 ``cpu.weight``); the dirs."""
    made = []
    for h in hierarchies():
        d = h / _rel(cgroup)
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            src = d.parent / f
            if src.is_file() and (d / f).is_file() and not (d / f).read_text().strip():
                (d / f).write_text(src.read_text())
        if (d / "cpu.shares").is_file():
            (d / "cpu.shares").write_text(str(cpu_shares))
        elif (d / "cpu.weight").is_file():
            (d / "cpu.weight").write_text(str(cpu_weight_v2(cpu_shares)))
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
