"""The dev cluster's run directory and the state file in it (ports, processes), and what a caller gets back.

Run directory layout (``down`` removes it; ``up`` refuses a non-empty directory it did not create)::

    .batchfill-dev-cluster   marker
    cluster.json             ports, pod address block, PIDs (with their /proc start times, so a reused PID is
                             never killed), the real nodes (batchfill.testbed.node.record)
    admin.kubeconfig         system:masters client certificate, embedded
    pki/ etcd-data/ logs/<component>.log
    real-node-<i>/           a real node's kubelet, containerd and CNI state (only with real nodes)
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchfill.testbed.devcluster.binaries import DevClusterError, bin_dir
from batchfill.testbed.process import Process

MARKER = ".batchfill-dev-cluster"
STATE_FILE = "cluster.json"
KUBECONFIG_NAME = "admin.kubeconfig"


def default_run_dir() -> Path:
    """``$BATCHFILL_DEV_CLUSTER_DIR``, else ``$XDG_STATE_HOME/batchfill/dev-cluster`` (``~/.local/state``)."""
    env = os.environ.get("BATCHFILL_DEV_CLUSTER_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "batchfill" / "dev-cluster"


def log_path(run_dir: Path, component: str) -> Path:
    return run_dir / "logs" / f"{component}.log"


@dataclass
class ClusterInfo:
    """What ``cluster_up`` started. ``pids`` maps component name to PID; ``pod_block`` is the loopback block its
    pods' IPs are in (``127.<a>.0.0/16``, :mod:`.pod_block`)."""

    kubeconfig: Path
    server: str
    run_dir: Path
    pids: dict[str, int]
    bin_dir: Path = field(default_factory=bin_dir)
    pod_block: str = ""
    reused: bool = False
    startup_s: float = 0.0

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with ``KUBECONFIG`` and the cluster's kubectl on PATH."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = os.pathsep.join(p for p in (str(self.bin_dir), env.get("PATH", "")) if p)
        return env


@dataclass
class ClusterState:
    """``cluster.json``: where the cluster listens, its pods' address block and which processes are its components.

    ``pod_block`` is empty in the state of a cluster started before clusters chose their blocks. ``real_nodes``
    is :class:`batchfill.testbed.node.record.RealNodes`' record (empty without real nodes).
    """

    server: str
    kubeconfig: str
    bin_dir: str
    ports: dict[str, int]
    processes: dict[str, Process] = field(default_factory=dict)
    gpu_nodes: int = 0
    gpus_per_node: int = 0
    cpu_nodes: int = 0
    pod_block: str = ""
    real_nodes: dict[str, Any] = field(default_factory=dict)

    def save(self, run_dir: Path) -> None:
        doc = {
            "server": self.server, "kubeconfig": self.kubeconfig, "bin_dir": self.bin_dir, "ports": self.ports,
            "processes": {name: p.record() for name, p in self.processes.items()},
            "gpu_nodes": self.gpu_nodes, "gpus_per_node": self.gpus_per_node, "cpu_nodes": self.cpu_nodes,
            "pod_block": self.pod_block, "real_nodes": self.real_nodes,
        }  # fmt: skip
        tmp = run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(run_dir / STATE_FILE)

    @classmethod
    def load(cls, run_dir: Path) -> ClusterState | None:
        """The state in ``run_dir``, or None when there is none or it cannot be read."""
        try:
            raw = json.loads((run_dir / STATE_FILE).read_text())
            raw["processes"] = {
                name: Process.from_record(r, name=name, log_path=log_path(run_dir, name))
                for name, r in raw.get("processes", {}).items()
            }
            return cls(**raw)
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def info(self, run_dir: Path, **kw: Any) -> ClusterInfo:
        return ClusterInfo(
            kubeconfig=Path(self.kubeconfig),
            server=self.server,
            run_dir=run_dir,
            pids={k: p.pid for k, p in self.processes.items()},
            bin_dir=Path(self.bin_dir),
            pod_block=self.pod_block,
            **kw,
        )


def check_run_dir(run_dir: Path) -> None:
    """Raise :class:`DevClusterError` unless ``run_dir`` is absent, empty, or a dev-cluster run directory."""
    if run_dir.exists() and not run_dir.is_dir():
        raise DevClusterError(f"{run_dir} is not a directory")
    if run_dir.exists() and any(run_dir.iterdir()) and not (run_dir / MARKER).exists():
        raise DevClusterError(f"{run_dir} is not empty and is not a dev-cluster run directory; pick another one")


def prepare_run_dir(run_dir: Path) -> None:
    """An empty run directory with its marker and ``logs/`` (an earlier run's directory is removed first)."""
    check_run_dir(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / MARKER).write_text("batchfill dev cluster run directory; `batchfill dev-cluster down` removes it\n")
