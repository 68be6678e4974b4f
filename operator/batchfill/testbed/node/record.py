"""What the dev cluster's state file (``cluster.json``, key ``real_nodes``) records of its real nodes, so that
``down`` (even in another process, after a crash) can find and remove everything they made.

Layout of a node's directory ``<run dir>/<node name>/``::

    kubelet/                 the kubelet's --root-dir (device-plugins/ is where device plugins register)
    kubelet-pki/             its serving certificate (self-signed) and client certificate
    kubelet.yaml kubelet.kubeconfig
    pod-logs/                the kubelet's podLogsDir
    containerd/              config.toml, root/, state/, runc/, containerd.sock
    cni/ ipam/               the CNI conflist and host-local's leases
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchfill.testbed.node.containerd import ContainerdPaths
from batchfill.testbed.node.plan import NodePlan
from batchfill.testbed.process import Process

#: Start order of a node's processes; stopped in reverse (the device plugin, then the kubelet). A node without
#: GPUs has no ``gpu-plugin`` (the fake-GPU device plugin, :mod:`batchfill.testbed.gpu_plugin`).
NODE_PROCESSES = ("apiproxy", "containerd", "kubelet", "gpu-plugin")
GPU_PLUGIN = "gpu-plugin"
#: Root-namespace sysctls recorded at ``up`` and compared at ``down`` (the ones a kubelet would change).
WATCHED_SYSCTLS = (
    "kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory", "net.ipv4.ip_forward",
    "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
)  # fmt: skip


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names: tuple[str, ...] = WATCHED_SYSCTLS) -> dict[str, str]:
    """name -> value (whitespace-normalised) of each sysctl that exists."""
    out = {}
    for n in names:
        try:
            out[n] = " ".join(sysctl_path(n).read_text().split())
        except OSError:
            continue
    return out


@dataclass
class RealNode:
    """One real node: its plan, its directory, its processes (:data:`NODE_PROCESSES`), its netns inode and the
    number of fake ``nvidia.com/gpu`` devices its device plugin advertises (0: no plugin)."""

    plan: NodePlan
    dir: Path
    processes: dict[str, Process] = field(default_factory=dict)
    netns_inode: int = 0
    gpus: int = 0

    @property
    def expected_processes(self) -> tuple[str, ...]:
        """The names of :data:`NODE_PROCESSES` this node runs (no ``gpu-plugin`` without GPUs)."""
        return tuple(n for n in NODE_PROCESSES if n != GPU_PLUGIN or self.gpus > 0)

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        """Where a device plugin puts its socket and finds the kubelet's ``kubelet.sock``."""
        return self.kubelet_root / "device-plugins"

    @property
    def containerd(self) -> ContainerdPaths:
        return ContainerdPaths(self.dir / "containerd")

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def log_path(self, process: str) -> Path:
        return self.logs / f"{process}.log"

    def record(self) -> dict[str, Any]:
        return {"plan": self.plan.record(), "dir": str(self.dir), "netns_inode": self.netns_inode, "gpus": self.gpus,
                "kubelet_root": str(self.kubelet_root), "containerd_socket": str(self.containerd.socket),
                "processes": {n: p.record() for n, p in self.processes.items()}}  # fmt: skip

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> RealNode:
        node = cls(NodePlan.from_record(dict(r["plan"])), Path(r["dir"]), netns_inode=int(r.get("netns_inode", 0)),
                   gpus=int(r.get("gpus", 0)))  # fmt: skip
        node.processes = {n: Process.from_record(p, name=f"{n}-{node.name}", log_path=node.log_path(n))
                          for n, p in r.get("processes", {}).items()}  # fmt: skip
        return node


@dataclass
class RealNodes:
    """The ``real_nodes`` entry of ``cluster.json``: the nodes and the watched sysctls' values before ``up``."""

    nodes: list[RealNode] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"nodes": [n.record() for n in self.nodes], "sysctls": dict(self.sysctls)}

    def running(self, count: int, gpus: int | None = None) -> bool:
        """Exactly ``count`` nodes are recorded, each with ``gpus`` fake GPUs (None: any number), and every process
        of each is alive."""
        return len(self.nodes) == count and all(
            set(n.processes) == set(n.expected_processes)
            and (gpus is None or n.gpus == gpus)
            and all(p.alive() for p in n.processes.values())
            for n in self.nodes
        )

    @classmethod
    def from_record(cls, r: Mapping[str, Any] | None) -> RealNodes:
        if not r:
            return cls()
        return cls([RealNode.from_record(n) for n in r.get("nodes", [])], dict(r.get("sysctls", {})))
