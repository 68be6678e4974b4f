"""A real node's containerd (the Debian package, 1.6): its configuration, command line, and importing images.

Each node's containerd has its own root, state, socket and runc root under the node's directory, so it shares
nothing with another containerd on the machine. Settings that matter on these machines
(https://github.com/containerd/containerd/blob/release/1.6/docs/cri/config.md):

* ``restrict_oom_score_adj = true``: root here lacks CAP_SYS_RESOURCE, and without it every sandbox fails
  (``can't get final child's PID from pipe: EOF``) because the pause container asks for a lower oom_score_adj;
* ``sandbox_image``: a local image (:mod:`.images`); nothing is pulled from a registry;
* ``netns_mounts_under_state_dir = true``: the pods' network namespaces are bind-mounted under the node's state
  directory instead of the machine-wide ``/run/netns``;
* ``SystemdCgroup = false`` (no systemd here; the kubelet's ``cgroupDriver: cgroupfs``), snapshotter overlayfs;
  the other snapshotters disabled (aufs would ``modprobe aufs``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from batchfill.testbed.node.cni import CNI_BIN_DIR

CONTAINERD = "containerd"
CTR = "ctr"
#: The containerd namespace the CRI plugin (so the kubelet) uses.
K8S_NAMESPACE = "k8s.io"
#: Snapshotters a node never uses (overlayfs is the one).
DISABLED_PLUGINS = tuple(f"io.containerd.snapshotter.v1.{s}" for s in ("aufs", "btrfs", "zfs", "devmapper"))


class ContainerdError(RuntimeError):
    """A ``ctr`` command failed."""


@dataclass(frozen=True)
class ContainerdPaths:
    """Where one node's containerd keeps everything (all under ``base``)."""

    base: Path

    @property
    def config(self) -> Path:
        return self.base / "config.toml"

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        return self.base / "runc"

    @property
    def opt(self) -> Path:
        return self.base / "opt"


def _q(path: Path | str) -> str:
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_toml(paths: ContainerdPaths, sandbox_image: str, cni_conf_dir: Path) -> str:
    """containerd's configuration (version 2; every key not named keeps containerd's default)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join([
        "version = 2",
        # aufs would try `modprobe aufs` (a machine-wide change); btrfs, zfs and devmapper are never used here.
        "disabled_plugins = [" + ", ".join(f'"{p}"' for p in DISABLED_PLUGINS) + "]",
        f"root = {_q(paths.root)}",
        f"state = {_q(paths.state)}",
        "",
        "[grpc]",
        f"  address = {_q(paths.socket)}",
        "",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {_q(paths.opt)}",
        "",
        f"[{cri}]",
        f"  sandbox_image = {_q(sandbox_image)}",
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        '  stream_server_address = "127.0.0.1"',
        "",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        "",
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        "",
        f"[{cri}.containerd.runtimes.runc.options]",
        "  SystemdCgroup = false",
        f"  Root = {_q(paths.runc_root)}",
        "",
        f"[{cri}.cni]",
        f"  bin_dir = {_q(CNI_BIN_DIR)}",
        f"  conf_dir = {_q(cni_conf_dir)}",
        "  max_conf_num = 1",
        "",
    ])  # fmt: skip


def write_config(paths: ContainerdPaths, sandbox_image: str, cni_conf_dir: Path) -> Path:
    paths.base.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(config_toml(paths, sandbox_image, cni_conf_dir))
    return paths.config


def command(paths: ContainerdPaths) -> list[str]:
    return [CONTAINERD, "--config", str(paths.config)]


def ctr(socket: Path, *args: str, timeout_s: float = 120.0) -> str:
    """``ctr -n k8s.io -a <socket> <args>``; its stdout. Raises :class:`ContainerdError` on failure."""
    r = subprocess.run([CTR, "-n", K8S_NAMESPACE, "-a", str(socket), *args], capture_output=True, text=True,
                       check=False, timeout=timeout_s)  # fmt: skip
    if r.returncode != 0:
        raise ContainerdError(f"ctr {' '.join(args)} failed: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def images(socket: Path) -> list[str]:
    """The image references in the node's ``k8s.io`` namespace."""
    return ctr(socket, "images", "list", "-q").split()


def import_image(socket: Path, tar_path: Path, timeout_s: float = 900.0) -> str:
    """Import a ``docker-archive`` or OCI archive into the node's ``k8s.io`` namespace (``ctr images import``),
    where the kubelet finds it (pods use ``imagePullPolicy: IfNotPresent`` or ``Never``); ctr's output."""
    return ctr(socket, "images", "import", str(tar_path), timeout_s=timeout_s)


def alive(socket: Path) -> bool:
    """containerd answers on ``socket``."""
    try:
        ctr(socket, "version", timeout_s=10)
        return True
    except (ContainerdError, subprocess.TimeoutExpired):
        return False
