"""Removing a real node and everything it made, and the inventory of what is left (:func:`leftovers`).

:func:`teardown` works from the state file alone (another process, after a crash): it stops the device plugin, the
kubelet, then containerd, then SIGKILLs whatever still runs in the node's network namespace or its cgroups
(container shims, containers), then stops the API forwarder; it unmounts everything under the node's directory
(detached: a busy mount goes as soon as it is free), deletes the network (root route, veth, the namespace with its
CNI bridge and the pods' interfaces), removes the cgroups, and puts back any watched sysctl that changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from pathlib import Path

from batchfill.testbed.node import cgroups
from batchfill.testbed.node.netns import delete_node_network, ip, netns_inode, netns_path
from batchfill.testbed.node.record import RealNode, RealNodes, read_sysctls, sysctl_path
from batchfill.testbed.process import stop_all

STOP_GRACE_S = 15.0
KILL_WAIT_S = 10.0
_MNT_DETACH = 2  # linux/fs.h


def mounts_under(base: Path, mountinfo: str | None = None) -> list[str]:
    """Mount points at or below ``base`` (``/proc/self/mountinfo``), deepest first."""
    text = cgroups.MOUNTINFO.read_text() if mountinfo is None else mountinfo
    root = str(base).rstrip("/")
    found = [mp for mp, _ in cgroups.parse_mountinfo(text) if mp == root or mp.startswith(root + "/")]
    return sorted(found, key=lambda m: m.count("/"), reverse=True)


def unmount_all(base: Path) -> list[str]:
    """Detach every mount under ``base`` (several passes: stacked mounts); the mount points still mounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(5):
        left = mounts_under(base)
        if not left:
            return []
        for mp in left:
            libc.umount2(mp.encode(), _MNT_DETACH)
    return mounts_under(base)


def pids_in_netns(inode: int) -> set[int]:
    """PIDs of the processes whose network namespace has ``inode`` (0: none)."""
    if not inode:
        return set()
    want, pids = f"net:[{inode}]", set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(d / "ns" / "net") == want:
                    pids.add(int(d.name))
    return pids


def _node_inode(node: RealNode) -> int:
    now = netns_inode(node.plan.netns)
    return now if now is not None else 0


def _kill_leftover_processes(node: RealNode) -> set[int]:
    """SIGKILL what runs in the node's namespace or cgroups (shims, containers); wait until they are gone."""
    deadline, seen = time.monotonic() + KILL_WAIT_S, set()
    while time.monotonic() < deadline:
        pids = pids_in_netns(_node_inode(node)) | cgroups.pids_in(cgroups.existing_dirs(node.plan.cgroup_root))
        pids.discard(os.getpid())
        live = {p for p in pids if _running(p)}
        if not live:
            break
        seen |= live
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        time.sleep(0.2)
    return seen


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def teardown(node: RealNode) -> list[str]:
    """Stop and remove real node ``node`` (module docstring). Returns what could not be removed."""
    problems = []
    for name in ("gpu-plugin", "kubelet", "containerd"):
        p = node.processes.get(name)
        if p is not None and stop_all([p], STOP_GRACE_S, kill_wait_s=KILL_WAIT_S):
            problems.append(f"{p.name} (pid {p.pid}) survived SIGKILL")
    _kill_leftover_processes(node)
    proxy = node.processes.get("apiproxy")
    if proxy is not None and stop_all([proxy], 5.0, kill_wait_s=KILL_WAIT_S):
        problems.append(f"{proxy.name} (pid {proxy.pid}) survived SIGKILL")
    problems += [f"still mounted: {m}" for m in unmount_all(node.dir)]
    delete_node_network(node.plan)
    problems += [f"cgroup not removed: {d}" for d in cgroups.remove(node.plan.cgroup_root)]
    return problems


def restore_sysctls(recorded: dict[str, str]) -> list[str]:
    """Write back each recorded sysctl whose value differs now; the names restored."""
    restored = []
    now = read_sysctls(tuple(recorded))
    for name, value in recorded.items():
        if name in now and now[name] != value:
            with contextlib.suppress(OSError):
                sysctl_path(name).write_text(value + "\n")
                restored.append(name)
    return restored


def teardown_all(real: RealNodes) -> list[str]:
    """:func:`teardown` of every node (the last first), then :func:`restore_sysctls`; the problems."""
    problems = []
    for node in reversed(real.nodes):
        problems += teardown(node)
    problems += [f"restored sysctl {n} (a node had changed it)" for n in restore_sysctls(real.sysctls)]
    return problems


def _route_exists(cidr: str) -> bool:
    return bool(ip("-4", "route", "show", cidr, check=False).strip())


def leftovers(real: RealNodes, *, mountinfo: str | None = None) -> list[str]:
    """What the real nodes of ``real`` left behind, one line each (empty: nothing): their processes, processes
    in their namespaces or cgroups, mounts under their directories, cgroup directories, the host veths, the
    network namespaces, the root routes to their pods, and watched sysctls whose value differs from ``up``'s."""
    out: list[str] = []
    for node in real.nodes:
        plan = node.plan
        out += [f"process {p.name} (pid {p.pid}) still runs" for p in node.processes.values() if p.alive()]
        stray = pids_in_netns(_node_inode(node)) | cgroups.pids_in(cgroups.existing_dirs(plan.cgroup_root))
        out += [f"pid {pid} runs in {plan.name}'s namespace or cgroups" for pid in sorted(stray) if _running(pid)]
        out += [f"mount {m}" for m in mounts_under(node.dir, mountinfo)]
        out += [f"cgroup {d}" for d in cgroups.existing_dirs(plan.cgroup_root)]
        if Path("/sys/class/net", plan.veth_host).exists():
            out.append(f"link {plan.veth_host}")
        if netns_path(plan.netns).exists():
            out.append(f"netns {plan.netns}")
        if _route_exists(plan.pod_cidr):
            out.append(f"route {plan.pod_cidr}")
    out += sysctl_changes(real.sysctls, read_sysctls(tuple(real.sysctls)))
    return out


def sysctl_changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """``"sysctl <name> <before> -> <now>"`` for each name whose value changed."""
    return [f"sysctl {n} {v} -> {now[n]}" for n, v in sorted(before.items()) if n in now and now[n] != v]
