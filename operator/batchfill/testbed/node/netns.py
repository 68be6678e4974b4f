"""A real node's network namespace, its veth link to the root namespace and the route to its pods (iproute2),
and entering a namespace from Python (``setns(2)`` through ctypes: Python 3.11 has no ``os.setns``).

Nothing here changes a sysctl of the root namespace: the root namespace reaches the node's pods through the
route ``<pod CIDR> via <node IP>`` and gets their replies on the veth's own connected network, so it never
forwards packets (``net.ipv4.ip_forward`` stays as it is); forwarding between the node's CNI bridge and its veth
is the node namespace's own ``ip_forward``, which the CNI bridge plugin turns on (``isGateway``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from batchfill.testbed.node.plan import NodePlan

NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000  # linux/sched.h


class NetnsError(RuntimeError):
    """An ``ip`` command failed or a namespace could not be entered."""


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip <args>``; its stdout. Raises :class:`NetnsError` with stderr when ``check`` and it fails."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def setns(path: Path | str) -> None:
    """Move the calling thread into the network namespace of ``path`` (``/run/netns/<name>``, ``/proc/<pid>/ns/net``).

    Raises :class:`NetnsError` with the errno's text.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(str(path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def preexec_enter(name: str) -> Callable[[], None]:
    """A ``Process.start(preexec=...)`` that puts the child into network namespace ``name`` before ``exec``."""
    path = str(netns_path(name))

    def enter() -> None:  # pragma: no cover - runs in the child between fork and exec
        setns(path)

    return enter


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """The calling thread inside network namespace ``name`` for the ``with`` block, then back where it was
    (sockets made inside stay in that namespace)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(netns_path(name))
        try:
            yield
        finally:
            if ctypes.CDLL(None, use_errno=True).setns(own, _CLONE_NEWNET) != 0:
                raise NetnsError(
                    f"could not return to the original network namespace: {os.strerror(ctypes.get_errno())}"
                )
    finally:
        os.close(own)


def netns_names() -> list[str]:
    """The named network namespaces (``ip netns list``, i.e. ``/run/netns``)."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except OSError:
        return []


def netns_inode(name: str) -> int | None:
    """The inode of namespace ``name`` (what ``/proc/<pid>/ns/net`` links to as ``net:[<inode>]``), None if gone."""
    try:
        return os.stat(netns_path(name)).st_ino
    except OSError:
        return None


def machine_networks() -> list[str]:
    """Destinations of every IPv4 route of every table and every IPv4 interface network of the root namespace."""
    nets = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default" and route.get("type", "unicast") in ("unicast", "local", "broadcast"):
            nets.append(dst if "/" in dst else f"{dst}/32")
    for link in json.loads(ip("-j", "-4", "addr", "show") or "[]"):
        for a in link.get("addr_info", []):
            nets.append(f"{a['local']}/{a['prefixlen']}")
    # Loopback's own routes (127.0.0.0/8 in table local) never overlap 10/8 and are kept for completeness.
    return nets


def create_node_network(plan: NodePlan) -> None:
    """The node's namespace (loopback up), its veth pair with both addresses, and the root route to its pods.

    Raises :class:`NetnsError` when a step fails (what was made stays for :func:`delete_node_network`).
    """
    ip("netns", "add", plan.netns)
    ip("-n", plan.netns, "link", "set", "lo", "up")
    ip("link", "add", plan.veth_host, "type", "veth", "peer", "name", plan.veth_node, "netns", plan.netns)
    ip("addr", "add", f"{plan.host_ip}/30", "dev", plan.veth_host)
    ip("link", "set", plan.veth_host, "up")
    ip("-n", plan.netns, "addr", "add", f"{plan.node_ip}/30", "dev", plan.veth_node)
    ip("-n", plan.netns, "link", "set", plan.veth_node, "up")
    ip("route", "add", plan.pod_cidr, "via", plan.node_ip, "dev", plan.veth_host)


def delete_node_network(plan: NodePlan) -> None:
    """Remove the root route, the veth pair and the node's namespace, whichever still exist (idempotent).

    Deleting the namespace destroys every interface in it (the node end of the veth, with it the host end, and
    the pods' veth ends) once no process and no mount holds it any more; the CNI bridge is deleted first.
    """
    ip("route", "del", plan.pod_cidr, "via", plan.node_ip, check=False)
    ip("link", "del", plan.veth_host, check=False)
    if netns_path(plan.netns).exists():
        # Explicitly too: a process still in the namespace would keep it, and its bridge, alive unnamed.
        ip("-n", plan.netns, "link", "del", plan.bridge, check=False)
        ip("netns", "del", plan.netns, check=False)
