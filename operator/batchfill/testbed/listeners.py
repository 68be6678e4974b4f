"""The machine's listening TCP sockets, read from Linux ``/proc/net/tcp`` and ``/proc/net/tcp6``, and which of them
a process holds.

The dev cluster picks its pod address block where nothing listens (:mod:`.devcluster.pod_block`), and
:class:`~batchfill.testbed.triton_local.LocalTriton` checks that every listener on its addresses is its own
server's, not another one answering there.

Both tables give one socket a line; the fields used are ``local_address`` (hex ``ADDR:PORT``; ``ADDR`` is the
address as the kernel stores it, printed as 32-bit words in host byte order), ``st`` (``0A`` is ``TCP_LISTEN``)
and ``inode``, which ``/proc/<pid>/fd/<n>`` names as ``socket:[<inode>]`` (proc(5),
https://man7.org/linux/man-pages/man5/proc.5.html).
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TCP_LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN = 10


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: its local address (an IPv4-mapped IPv6 address is given as the IPv4 address,
    which is what a client connects to), port and socket inode."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    inode: int


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    words = [bytes.fromhex(hex_addr[i : i + 8]) for i in range(0, len(hex_addr), 8)]
    raw = b"".join(w[::-1] if sys.byteorder == "little" else w for w in words)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw)
    v6 = ipaddress.IPv6Address(raw)
    return v6.ipv4_mapped or v6


def parse_tcp_table(text: str) -> list[Listener]:
    """The LISTEN sockets of one ``/proc/net/tcp`` or ``/proc/net/tcp6`` table (header line first).

    Raises ValueError on a line that is not in the table's format.
    """
    out: list[Listener] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        hex_addr, hex_port = fields[1].split(":")
        out.append(Listener(_address(hex_addr), int(hex_port, 16), int(fields[9])))
    return out


def tcp_listeners(proc: Path = Path("/proc")) -> list[Listener]:
    """Every listening TCP socket of this machine's network namespace (IPv4 and IPv6); a missing table (no
    IPv6, no /proc) contributes none."""
    out: list[Listener] = []
    for table in ("tcp", "tcp6"):
        try:
            text = (proc / "net" / table).read_text()
        except OSError:
            continue
        out += parse_tcp_table(text)
    return out


def listeners_on(listeners: Iterable[Listener], host: str, port: int) -> list[Listener]:
    """Those of ``listeners`` bound to exactly ``host:port`` (the ones a connection to it reaches first)."""
    want = ipaddress.ip_address(host)
    return [lst for lst in listeners if lst.port == port and lst.address == want]


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """The inodes of the sockets process ``pid`` has open (empty when it is gone or its fds cannot be read)."""
    fd_dir = proc / str(pid) / "fd"
    out: set[int] = set()
    try:
        entries = list(fd_dir.iterdir())
    except OSError:
        return out
    for fd in entries:
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed since the listing
        if target.startswith("socket:[") and target.endswith("]"):
            out.add(int(target[len("socket:[") : -1]))
    return out


def listener_verdict(pid: int, host: str, ports: Iterable[tuple[str, int]]) -> tuple[bool, list[str]]:
    """Whether process ``pid`` alone listens on ``host`` at each of the named ``ports`` (``(name, port)``
    pairs): (every address has a listener and all are ``pid``'s, the ``"host:port (name)"`` addresses a
    socket ``pid`` does not hold listens on).

    The listener table is read before ``pid``'s fds: a socket ``pid`` opens between the two reads is then
    missing from the table (incomplete, asked again) rather than in the table and missing from the fds, which
    would read as another process's listener (tritonserver opens its metrics port after ``/v2/health/ready``
    already answers).
    """
    table = tcp_listeners()
    mine = socket_inodes(pid)
    complete, foreign = True, []
    for name, port in ports:
        found = listeners_on(table, host, port)
        complete = complete and bool(found)
        if any(lst.inode not in mine for lst in found):
            foreign.append(f"{host}:{port} ({name})")
    return complete and not foreign, foreign
