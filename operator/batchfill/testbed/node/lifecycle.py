"""Starting a dev cluster's real nodes (kubelet + containerd + CNI, each in its own network namespace) and
waiting until they are Ready; stopping them is :mod:`.cleanup`.

Each step is recorded in the cluster's state file before it is taken (the ``save`` callback), so a ``down``
after a crash half-way finds everything that was made.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from batchfill.testbed.devcluster.binaries import DevClusterError
from batchfill.testbed.devcluster.kubeconfig import api_client, write_kubeconfig
from batchfill.testbed.devcluster.nodes import GPU_RESOURCE, gpu_labels, nodes_ready
from batchfill.testbed.devcluster.pki import b64, sign_client
from batchfill.testbed.devcluster.state import ClusterState
from batchfill.testbed.gpu_plugin import fake_gpu_plugin_argv
from batchfill.testbed.node import apiproxy, cgroups, cni, containerd, images, kubelet, mountns
from batchfill.testbed.node.containerd import ContainerdError
from batchfill.testbed.node.images import ImageBuildError
from batchfill.testbed.node.mountns import MountError
from batchfill.testbed.node.netns import (
    NetnsError,
    create_node_network,
    machine_networks,
    netns_inode,
    netns_names,
    preexec_enter,
)
from batchfill.testbed.node.plan import APISERVER_PROXY_PORT, AddressPlanError, NodePlan, overlaps, plan_nodes
from batchfill.testbed.node.record import GPU_PLUGIN, RealNode, RealNodes, read_sysctls
from batchfill.testbed.process import (
    LOOPBACK,
    Process,
    ProcessExitedError,
    ReadinessTimeoutError,
    stop_all,
    wait_until,
)

#: Seconds between "still waiting" lines while a step takes longer.
HEARTBEAT_S = 30.0


class RealNodeError(DevClusterError):
    """A real node could not be planned, started or made Ready (the message names the log to read)."""


def check_plans(plans: Sequence[NodePlan], networks: Sequence[str], netns: Sequence[str]) -> None:
    """Raise :class:`RealNodeError` when a plan's private block overlaps one of the machine's ``networks`` or its
    namespace name is taken (a leftover of a crashed cluster of the same pod block: run its ``down``)."""
    clash = overlaps(plans, networks)
    if clash:
        raise RealNodeError(
            "the real nodes' addresses overlap the machine's networks: "
            + "; ".join(clash)
            + " (a leftover of another dev cluster? run `batchfill dev-cluster down` on it)"
        )
    taken = sorted({p.netns for p in plans} & set(netns))
    if taken:
        raise RealNodeError(f"network namespaces {taken} exist already (a leftover of a dev cluster of this "
                            "pod block?); remove them or run `batchfill dev-cluster down` on that cluster")  # fmt: skip


def _wait(con: Console, what: str, check: Callable[[], bool], timeout_s: float, watch: Sequence[Process]) -> float:
    """``wait_until`` with a progress line every :data:`HEARTBEAT_S` seconds; raises :class:`RealNodeError`."""
    t0 = time.monotonic()
    while True:
        left = timeout_s - (time.monotonic() - t0)
        try:
            wait_until(check, min(HEARTBEAT_S, max(left, 0.0)), watch=watch)
            return time.monotonic() - t0
        except ProcessExitedError as e:
            raise RealNodeError(f"{e.process.name} exited while waiting for {what}; log {e.process.log_path}\n"
                                f"{e.process.log_tail(25)}") from None  # fmt: skip
        except ReadinessTimeoutError:
            elapsed = time.monotonic() - t0
            if elapsed >= timeout_s:
                logs = "\n".join(f"--- {p.log_path}\n{p.log_tail(15)}" for p in watch)
                raise RealNodeError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs}") from None
            con.log(f"still waiting for {what}: {elapsed:.0f} s")


def _start(
    node: RealNode, name: str, argv: list[str], die_with_parent: bool, steps: Sequence[Callable[[], None]] = ()
) -> Process:
    """Start one of the node's processes; ``steps`` run in the child before ``exec`` (enter the netns, ...)."""

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        for step in steps:
            step()

    p = Process.start(argv, node.log_path(name), name=f"{name}-{node.name}", cwd=node.dir,
                      die_with_parent=die_with_parent, preexec=preexec if steps else None)  # fmt: skip
    node.processes[name] = p
    return p


def start_node(
    node: RealNode,
    *,
    pki: Path,
    apiserver_port: int,
    kubelet_bin: Path,
    image: tuple[str, Path],
    save: Callable[[], None],
    con: Console,
    timeout_s: float,
    die_with_parent: bool,
    plugin_bin: Path | None = None,
) -> None:
    """Network, cgroups, certificates and configs of ``node``, then its forwarder, containerd (image imported),
    kubelet and, when ``node.gpus`` > 0, the fake-GPU device plugin (``plugin_bin``, default
    :func:`~batchfill.testbed.gpu_plugin.plugin_path`); ``save`` after each thing made. Raises
    :class:`RealNodeError`."""
    plan = node.plan
    node.dir.mkdir(parents=True, exist_ok=True)
    create_node_network(plan)
    node.netns_inode = netns_inode(plan.netns) or 0
    save()
    cgroups.create(plan.cgroup_root)
    cert, key = sign_client(pki, f"kubelet-{plan.name}", kubelet.node_subject(plan.name))
    write_kubeconfig(node.dir / "kubelet.kubeconfig", f"https://{LOOPBACK}:{APISERVER_PROXY_PORT}",
                          b64(pki / "ca.crt"), f"system:node:{plan.name}",
                     {"client-certificate": str(cert), "client-key": str(key)})  # fmt: skip
    cni_dir = node.dir / "cni"
    cni.write_conflist(plan, cni_dir, node.dir / "ipam")
    paths = node.containerd
    containerd.write_config(paths, image[0], cni_dir)
    _start(node, "apiproxy", apiproxy.command(plan.netns, APISERVER_PROXY_PORT, apiserver_port), die_with_parent)
    save()
    mountns.share_node_dir(node.dir)
    ctrd_binds = mountns.bind_points({"/var/lib/cni": node.dir / "cni-cache", "/run/containerd/s": node.dir / "shims"})
    ctrd = _start(node, "containerd", containerd.command(paths), die_with_parent,
                  [preexec_enter(plan.netns), mountns.preexec_mount_ns(ctrd_binds)])  # fmt: skip
    save()
    _wait(con, f"containerd of {plan.name}", lambda: containerd.alive(paths.socket), timeout_s, [ctrd])
    containerd.import_image(paths.socket, image[1])
    kubelet.write_kubelet_config(
        node.dir / "kubelet.yaml", kubelet.kubelet_config(plan, node.kubelet_root, pki / "ca.crt", paths.socket)
    )
    node.device_plugin_dir.mkdir(parents=True, exist_ok=True)
    start_kubelet(node, kubelet_bin, die_with_parent)
    save()
    if node.gpus > 0:
        start_gpu_plugin(node, plugin_bin, die_with_parent)
        save()


def start_kubelet(node: RealNode, kubelet_bin: Path, die_with_parent: bool) -> Process:
    """Start ``node``'s kubelet from the files :func:`start_node` wrote (again after a stop: same flags, root
    directory, certificates and checkpoints), in the node's network namespace and a mount namespace of its own
    (:mod:`.mountns`); it registers with the GPU labels when ``node.gpus`` > 0."""
    plan = node.plan
    labels = gpu_labels(node.gpus) if node.gpus else None
    argv = kubelet.command(kubelet_bin, plan, node.dir / "kubelet.yaml", node.dir / "kubelet.kubeconfig",
                           node.kubelet_root, node.dir / "kubelet-pki", labels)  # fmt: skip
    sysctls = mountns.sysctl_binds(mountns.write_values(node.dir / "kubelet-sysctls"))
    binds = mountns.bind_points({"/var/lib/kubelet/device-plugins": node.device_plugin_dir,
                                 "/var/log/containers": node.dir / "container-logs", **sysctls})  # fmt: skip
    return _start(node, "kubelet", argv, die_with_parent, [preexec_enter(plan.netns), mountns.preexec_mount_ns(binds)])


def start_gpu_plugin(node: RealNode, binary: Path | None, die_with_parent: bool) -> Process:
    """Start ``batchfill-fake-gpu`` for ``node`` (``node.gpus`` devices ``fake-gpu-<node>-<i>``), log
    ``<node dir>/logs/gpu-plugin.log``. It serves in ``node.device_plugin_dir`` as seen from the root mount
    namespace: that directory is the one bind-mounted over the kubelet's fixed ``/var/lib/kubelet/device-plugins``
    (:mod:`.mountns`), so the kubelet finds the plugin's socket and the plugin the kubelet's ``kubelet.sock``
    without entering the kubelet's mount namespace. It runs in the node's network namespace (it needs no network
    there) so that :func:`~.cleanup.teardown` finds a stray copy by namespace like the node's other processes."""
    argv = fake_gpu_plugin_argv(node.device_plugin_dir, node.name, node.gpus, binary=binary)
    if not Path(argv[0]).is_file():
        raise RealNodeError(f"{argv[0]} is missing: build it with gpu_plugin.ensure_fake_gpu_plugin()")
    return _start(node, GPU_PLUGIN, argv, die_with_parent, [preexec_enter(node.plan.netns)])


def gpus_allocatable(kubeconfig: Path, gpus: Mapping[str, int]) -> bool:
    """Each named node's ``status.capacity`` and ``status.allocatable`` show ``gpus[name]`` ``nvidia.com/gpu``
    (what the kubelet reports from the devices its device plugins advertise as healthy)."""
    from kubernetes import client

    with api_client(kubeconfig) as api:
        items: list[Any] = client.CoreV1Api(api).list_node().items
    status = {n.metadata.name: n.status for n in items}
    for name, count in gpus.items():
        st = status.get(name)
        if st is None:
            return False
        for resources in (st.capacity, st.allocatable):
            if (resources or {}).get(GPU_RESOURCE, "0") != str(count):
                return False
    return True


def _registered(kubeconfig: Path, name: str) -> bool:
    from kubernetes import client

    with api_client(kubeconfig) as api:
        client.CoreV1Api(api).read_node(name)
    return True


def _set_pod_cidr(kubeconfig: Path, plan: NodePlan) -> None:
    """Give the Node object its pod CIDR (the kubelet cannot; nothing allocates node CIDRs in the dev cluster)."""
    from kubernetes import client

    with api_client(kubeconfig) as api:
        core: Any = client.CoreV1Api(api)
        if not core.read_node(plan.name).spec.pod_cidr:
            core.patch_node(plan.name, {"spec": {"podCIDR": plan.pod_cidr, "podCIDRs": [plan.pod_cidr]}})


@contextlib.contextmanager
def _as_node_error() -> Iterator[None]:
    """The failures of the tools a node is made with, as :class:`RealNodeError` (what the CLI reports)."""
    try:
        yield
    except (AddressPlanError, NetnsError, MountError, ContainerdError, ImageBuildError, OSError,
            subprocess.SubprocessError) as e:  # fmt: skip
        raise RealNodeError(f"{type(e).__name__}: {e}") from e


@_as_node_error()
def start_real_nodes(
    count: int,
    *,
    run_dir: Path,
    pod_block: str,
    apiserver_port: int,
    bin_dir: Path,
    admin_kubeconfig: Path,
    save: Callable[[RealNodes], None],
    con: Console,
    timeout_s: float = 180.0,
    die_with_parent: bool = False,
    gpus: int = 0,
    plugin_bin: Path | None = None,
) -> RealNodes:
    """Start ``count`` real nodes ``real-node-<i>`` and wait until each is Ready (module docstring); with ``gpus``
    > 0, each runs the fake-GPU device plugin (``plugin_bin``, :func:`start_gpu_plugin`) and carries the GPU labels,
    and this waits until the kubelet shows ``gpus`` ``nvidia.com/gpu`` allocatable (:func:`gpus_allocatable`).

    Returns what was started (also passed to ``save`` after every step). Raises :class:`RealNodeError` (what was
    started stays recorded for :func:`~.cleanup.teardown_all`).
    """
    plans = plan_nodes(pod_block, count)
    check_plans(plans, machine_networks(), netns_names())
    real = RealNodes(sysctls=read_sysctls())
    save(real)
    kubelet_bin = bin_dir / "kubelet"
    if not kubelet_bin.is_file():
        raise RealNodeError(f"{kubelet_bin} is missing: run BATCHFILL_BUILD_KUBELET=1 scripts/build-k8s.sh")
    with con.status("building the busybox pause image (cached)"):
        image = images.busybox_image()
    t0 = time.monotonic()
    for plan in plans:
        node = RealNode(plan, run_dir / plan.name, gpus=gpus)
        real.nodes.append(node)
        save(real)
        with con.status(f"starting {plan.name} (containerd, kubelet) in netns {plan.netns}"):
            start_node(node, pki=run_dir / "pki", apiserver_port=apiserver_port, kubelet_bin=kubelet_bin,
                       image=image, save=lambda: save(real), con=con, timeout_s=timeout_s,
                       die_with_parent=die_with_parent, plugin_bin=plugin_bin)  # fmt: skip
        con.log(f"[green]✓[/] {plan.name}: node IP {plan.node_ip}, pods in {plan.pod_cidr}, netns {plan.netns}")
    watch = [p for n in real.nodes for p in n.processes.values()]
    with con.status(f"waiting for {count} real nodes to register and be Ready"):
        for n in real.nodes:
            _wait(
                con, f"{n.name} registered", functools.partial(_registered, admin_kubeconfig, n.name), timeout_s, watch
            )
            _set_pod_cidr(admin_kubeconfig, n.plan)
        names = {n.name for n in real.nodes}
        _wait(con, f"{count} real nodes Ready", lambda: nodes_ready(admin_kubeconfig, names), timeout_s, watch)
    con.log(f"[green]✓[/] {count} real nodes Ready ({time.monotonic() - t0:.1f} s after start)")
    if gpus > 0:
        want = {n.name: gpus for n in real.nodes}
        with con.status(f"waiting for {gpus} {GPU_RESOURCE} allocatable on each real node (device plugin)"):
            _wait(con, f"{GPU_RESOURCE}={gpus} allocatable on the real nodes",
                  lambda: gpus_allocatable(admin_kubeconfig, want), timeout_s, watch)  # fmt: skip
        con.log(f"[green]✓[/] {GPU_RESOURCE}={gpus} allocatable on each real node "
                f"({time.monotonic() - t0:.1f} s after start)")  # fmt: skip
    return real


def restart_kubelet(
    run_dir: str | os.PathLike[str], name: str, *, grace_s: float = 15.0, die_with_parent: bool = False
) -> Process:
    """Stop real node ``name``'s kubelet (SIGTERM, SIGKILL after ``grace_s`` seconds) and start it again as
    :func:`start_kubelet` does, recording the new process in the cluster state of ``run_dir``; the new process.
    Its pods keep running (containerd is not touched). Raises :class:`RealNodeError` when there is no such node
    or the old kubelet survives SIGKILL.
    """
    run = Path(run_dir).resolve()
    state = ClusterState.load(run)
    real = RealNodes.from_record(state.real_nodes if state is not None else None)
    node = next((n for n in real.nodes if n.name == name), None)
    if state is None or node is None:
        raise RealNodeError(f"no real node {name} recorded in {run}")
    old = node.processes.get("kubelet")
    if old is not None and stop_all([old], grace_s):
        raise RealNodeError(f"{old.name} (pid {old.pid}) survived SIGKILL")
    with _as_node_error():
        p = start_kubelet(node, Path(state.bin_dir) / "kubelet", die_with_parent)
    state.real_nodes = real.record()
    state.save(run)
    return p


def import_image(node: RealNode, tar_path: Path, timeout_s: float = 900.0) -> str:
    """Import an image archive (docker-archive or OCI tar) into ``node``'s containerd (``ctr -n k8s.io images
    import``), where its kubelet finds it; ctr's output. Raises :class:`~.containerd.ContainerdError`, or
    ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds.
    """
    return containerd.import_image(node.containerd.socket, tar_path, timeout_s=timeout_s)


def real_nodes(run_dir: str | os.PathLike[str]) -> list[RealNode]:
    """The real nodes recorded in the dev cluster state of ``run_dir`` (empty when there is none): their names,
    plans (IPs, pod CIDRs), kubelet root and device-plugin directories, containerd sockets and processes."""
    state = ClusterState.load(Path(run_dir).resolve())
    return [] if state is None else RealNodes.from_record(state.real_nodes).nodes
