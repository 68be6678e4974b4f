"""Each dev cluster's own loopback block for its pods' IP addresses, ``127.<a>.0.0/16``.

kwok gives a pod an address from its node's ``podCIDR``, and a real tritonserver can then listen on the pod's IP
with Triton's standard ports (the demo and the cluster tests start one per Ready pod), so clients reach pods at
``<pod IP>:8000`` as in a real cluster. Two dev clusters on one machine must therefore never share a block: one
server would fail to bind, or a client would read the other cluster's server.

``cluster_up`` claims a block in a registry shared by the machine's dev clusters (:func:`registry_dir`, one
file per claimed block naming the claiming run directory, changed under an exclusive ``flock``), skipping every
block another live cluster has claimed and every block something listens in (``/proc/net/tcp``, ``tcp6``: this
also catches servers of clusters that do not use the registry). A claim is live while the run directory's state
file records that block and one of its components runs, or for :data:`STARTING_GRACE_S` after it was made (the
cluster is still starting); other claims are removed when the registry is next read. ``cluster_down`` releases
the claim.

The search starts at an octet derived from the run directory (:func:`run_dir_seed`), so two clusters that
choose at the same moment without seeing each other (e.g. registries in different temporary directories) are
unlikely to choose the same block.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from batchfill.testbed.devcluster.binaries import DevClusterError
from batchfill.testbed.devcluster.state import ClusterState
from batchfill.testbed.listeners import tcp_listeners

#: The second octets a block may have: 127.0.0.0/16 holds the host's own 127.0.0.1, 127.255.255.255 is the
#: loopback network's broadcast address, and 127.1.0.0/16 was every dev cluster's block before each chose its own,
#: so checkouts older than this module still use it.
OCTETS = range(2, 255)
#: How long a claim counts without a live component of its cluster (certificates, then the first process).
STARTING_GRACE_S = 600.0
_LOCK = ".lock"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def pod_block(octet: int) -> ipaddress.IPv4Network:
    """``127.<octet>.0.0/16``. Raises ValueError unless ``octet`` is in :data:`OCTETS`."""
    if octet not in OCTETS:
        raise ValueError(f"a pod block's second octet must be in {OCTETS.start}..{OCTETS.stop - 1}, got {octet}")
    return ipaddress.IPv4Network(f"127.{octet}.0.0/16")


def node_pod_cidr(block: ipaddress.IPv4Network | str, index: int) -> str:
    """The ``podCIDR`` of fake node ``index`` (0..255): the ``index``-th /24 of ``block`` (``127.<a>.<index>.0/24``).

    Raises ValueError for an index outside 0..255 or a block that is not a /16.
    """
    net = ipaddress.IPv4Network(block)
    if net.prefixlen != 16 or not 0 <= index <= 255:
        raise ValueError(f"node {index} of {net}: the block must be a /16 and the index in 0..255")
    return str(ipaddress.IPv4Network((int(net.network_address) + (index << 8), 24)))


def run_dir_seed(run_dir: Path) -> int:
    """A number derived from the run directory's absolute path (SHA-256), where the block search starts."""
    return int.from_bytes(hashlib.sha256(str(Path(run_dir).resolve()).encode()).digest()[:8], "big")


def choose_pod_block(
    taken: Iterable[ipaddress.IPv4Network | str], listening: Iterable[IPAddress | str], seed: int
) -> ipaddress.IPv4Network:
    """The first block ``127.<a>.0.0/16`` (``a`` in :data:`OCTETS`, from ``a = 2 + seed mod 253`` upwards, wrapping)
    that is not in ``taken`` and holds none of the ``listening`` addresses.

    ``listening``: local addresses of listening sockets; IPv4-mapped IPv6 ones count as their IPv4 address, and
    wildcard ones (``0.0.0.0``, ``::``) are in no block. Raises :class:`DevClusterError` when every block is taken.
    """
    used = {ipaddress.IPv4Network(t) for t in taken}
    for raw in listening:
        addr = ipaddress.ip_address(raw)
        if isinstance(addr, ipaddress.IPv6Address):
            addr = addr.ipv4_mapped or addr
        if isinstance(addr, ipaddress.IPv4Address) and addr.packed[0] == 127 and addr.packed[1] in OCTETS:
            used.add(pod_block(addr.packed[1]))
    start = seed % len(OCTETS)
    for i in range(len(OCTETS)):
        block = pod_block(OCTETS[(start + i) % len(OCTETS)])
        if block not in used:
            return block
    raise DevClusterError(
        f"no free pod address block: each of 127.{OCTETS.start}-{OCTETS.stop - 1}.0.0/16 is claimed by a dev cluster "
        "or has a listening socket in it"
    )


def registry_dir() -> Path:
    """``$XDG_RUNTIME_DIR/batchfill/pod-blocks``, else ``<temporary directory>/batchfill-<uid>/pod-blocks``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "batchfill" if runtime else Path(tempfile.gettempdir()) / f"batchfill-{os.getuid()}"
    return base / "pod-blocks"


@contextlib.contextmanager
def _locked(registry: Path) -> Iterator[None]:
    registry.mkdir(parents=True, exist_ok=True)
    with open(registry / _LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _claim_file(registry: Path, block: ipaddress.IPv4Network) -> Path:
    return registry / f"{block.network_address}.json"


def _claim_is_live(claim: dict[str, Any], block: ipaddress.IPv4Network, now: float) -> bool:
    if now - float(claim["claimed_at"]) < STARTING_GRACE_S:
        return True
    state = ClusterState.load(Path(claim["run_dir"]))
    return state is not None and state.pod_block == str(block) and any(p.alive() for p in state.processes.values())


def _live_claims(registry: Path, now: float) -> dict[ipaddress.IPv4Network, Path]:
    """Block -> claiming run directory, for the live claims; removes the others (the registry is locked)."""
    out: dict[ipaddress.IPv4Network, Path] = {}
    for f in registry.glob("127.*.json"):
        try:
            block = ipaddress.IPv4Network(f.name.removesuffix(".json") + "/16")
            claim = json.loads(f.read_text())
            if _claim_is_live(claim, block, now):
                out[block] = Path(claim["run_dir"])
                continue
        except (OSError, ValueError, TypeError, KeyError):
            pass  # unreadable: not a claim this module wrote
        f.unlink(missing_ok=True)
    return out


def claimed_pod_blocks(registry: Path | None = None) -> dict[ipaddress.IPv4Network, Path]:
    """The blocks live dev clusters have claimed -> their run directories (stale claims are removed)."""
    reg = registry or registry_dir()
    with _locked(reg):
        return _live_claims(reg, time.time())


def claim_pod_block(
    run_dir: Path, *, registry: Path | None = None, listening: Iterable[IPAddress | str] | None = None
) -> ipaddress.IPv4Network:
    """Choose a block for the cluster of ``run_dir`` (:func:`choose_pod_block`: the live claims of other run
    directories, the listening sockets, :func:`run_dir_seed`) and record the claim; earlier claims of
    ``run_dir`` are dropped.

    ``listening`` defaults to the machine's listening sockets now (:func:`~batchfill.testbed.listeners.tcp_listeners`).
    Raises :class:`DevClusterError` when no block is free or the registry cannot be written.
    """
    run = Path(run_dir).resolve()
    reg = registry or registry_dir()
    try:
        with _locked(reg):
            now = time.time()
            claims = _live_claims(reg, now)
            for block, owner in claims.items():
                if owner == run:
                    _claim_file(reg, block).unlink(missing_ok=True)
            taken = [b for b, owner in claims.items() if owner != run]
            addrs = listening if listening is not None else [lst.address for lst in tcp_listeners()]
            block = choose_pod_block(taken, addrs, run_dir_seed(run))
            tmp = reg / f".{block.network_address}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"run_dir": str(run), "claimed_at": now}) + "\n")
            tmp.replace(_claim_file(reg, block))
            return block
    except OSError as e:
        raise DevClusterError(f"cannot record the pod address block of {run} in {reg}: {e}") from None


def release_pod_block(run_dir: Path, block: ipaddress.IPv4Network | str, *, registry: Path | None = None) -> None:
    """Remove the claim of ``block`` if ``run_dir`` made it (another cluster's claim of it stays)."""
    reg = registry or registry_dir()
    if not reg.is_dir():
        return
    run = Path(run_dir).resolve()
    with _locked(reg):
        f = _claim_file(reg, ipaddress.IPv4Network(block))
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if Path(json.loads(f.read_text())["run_dir"]) == run:
                f.unlink()
