"""Private views of a few machine-wide paths for a real node's kubelet and containerd, in mount namespaces of
their own, so that nothing they write lands in (or collides in) the machine's shared places.

Each runs in a new mount namespace (made in the child before ``exec``) in which node-owned files and directories
are bind-mounted over fixed paths:

* the kubelet: ``/var/lib/kubelet/device-plugins`` (the kubelet 1.36 device manager's socket directory is that
  constant, whatever ``--root-dir`` says) -> ``<root dir>/device-plugins``, so device plugins of two nodes never
  meet; ``/var/log/containers`` (its log links, also a constant) -> the node's own directory; and the kernel
  sysctls below.
* containerd: ``/var/lib/cni`` (libcni's result cache) and ``/run/containerd/s`` (the shims' sockets) -> the
  node's own directories.

The kernel sysctls: with ``protectKernelDefaults: true`` the kubelet refuses to start unless a few of them
already have the values it wants (``Failed to start ContainerManager ... invalid kernel flag:
vm/overcommit_memory, expected value: 1, actual value: 0``); with ``false`` it writes them machine-wide (none of
them is per network namespace) and leaves them changed. Neither is acceptable on a shared machine, so in the
kubelet's mount namespace a file holding the wanted value is bind-mounted over each of those ``/proc/sys``
entries (:data:`KUBELET_SYSCTLS`, the values of ``setupKernelTunables`` in the kubelet's
pkg/kubelet/cm/container_manager_linux.go). The machine's values never change.

Mounts must still travel between the kubelet (volumes under its root directory), containerd and runc: the node's
directory is made a shared bind mount first (:func:`share_node_dir`), and a new mount namespace's copy of a
shared mount is its peer, so mounts below it propagate both ways. Everything else in those namespaces is a private
copy (this machine mounts everything private), so the bind mounts above are seen by nobody else. The mount points
(the fixed paths) are made as empty directories when missing and stay.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from pathlib import Path

#: sysctl -> the value the kubelet requires (kernel.keys.root_maxbytes is 25 bytes per key).
KUBELET_SYSCTLS = {
    "vm.overcommit_memory": "1",
    "vm.panic_on_oom": "0",
    "kernel.panic": "10",
    "kernel.panic_on_oops": "1",
    "kernel.keys.root_maxkeys": "1000000",
    "kernel.keys.root_maxbytes": "25000000",
}
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_SLAVE, _MS_SHARED = 4096, 16384, 1 << 19, 1 << 20


class MountError(OSError):
    """A mount(2) or unshare(2) call failed."""


def _mount(src: str | None, target: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(None if src is None else src.encode(), target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"mount({src}, {target}, {flags:#x}): {os.strerror(err)}")


def write_values(directory: Path, values: Mapping[str, str] = KUBELET_SYSCTLS) -> dict[str, Path]:
    """One file per sysctl in ``directory`` holding its value; sysctl -> file."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, value in values.items():
        f = directory / name
        f.write_text(value + "\n")
        files[name] = f
    return files


def share_node_dir(node_dir: Path) -> None:
    """Make ``node_dir`` a shared bind mount of itself (root mount namespace; removed by unmounting it)."""
    _mount(str(node_dir), str(node_dir), _MS_BIND)
    _mount(None, str(node_dir), _MS_SHARED)


def bind_points(binds: Mapping[str, Path]) -> list[tuple[str, str]]:
    """``target -> source`` as (source, target) pairs; missing source directories and target directories are
    made (sysctl targets under /proc/sys always exist)."""
    pairs = []
    for target, src in binds.items():
        t, s = Path(target), Path(src)
        if not str(t).startswith("/proc/"):
            t.mkdir(parents=True, exist_ok=True)
            s.mkdir(parents=True, exist_ok=True)
        pairs.append((str(s), str(t)))
    return pairs


def sysctl_binds(files: Mapping[str, Path]) -> dict[str, Path]:
    """``/proc/sys/<name as a path>`` -> file, for the files of :func:`write_values`."""
    return {"/proc/sys/" + name.replace(".", "/"): f for name, f in files.items()}


def preexec_mount_ns(pairs: list[tuple[str, str]]) -> Callable[[], None]:
    """A ``Process.start(preexec=...)`` step: a new mount namespace, ``/proc`` made a slave (nothing mounted on it
    propagates back), then each (source, target) of ``pairs`` (:func:`bind_points`) bind-mounted."""

    def enter() -> None:  # pragma: no cover - runs in the child between fork and exec
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNS) != 0:
            raise MountError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        _mount(None, "/proc", _MS_REC | _MS_SLAVE)
        for src, target in pairs:
            if os.path.exists(target):
                _mount(src, target, _MS_BIND)

    return enter
