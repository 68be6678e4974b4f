"""Start, reuse, restart and stop the dev cluster recorded in a run directory (the package docstring says what
runs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from batchfill.testbed.devcluster.binaries import DevClusterError, default_console, ensure_binaries, kwok_stages_dir
from batchfill.testbed.devcluster.components import (
    COMPONENTS,
    PORT_NAMES,
    commands,
    http_get,
    start_component,
    stop_components,
)
from batchfill.testbed.devcluster.kubeconfig import write_kubeconfig
from batchfill.testbed.devcluster.nodes import (
    default_service_account_exists,
    desired_nodes,
    ensure_fake_nodes,
    nodes_ready,
)
from batchfill.testbed.devcluster.pki import admin_ssl_context, b64, make_pki
from batchfill.testbed.devcluster.pod_block import claim_pod_block, release_pod_block
from batchfill.testbed.devcluster.state import (
    KUBECONFIG_NAME,
    MARKER,
    STATE_FILE,
    ClusterInfo,
    ClusterState,
    check_run_dir,
    log_path,
    prepare_run_dir,
)
from batchfill.testbed.process import (
    LOOPBACK,
    ProcessExitedError,
    ReadinessTimeoutError,
    free_ports,
    kill_all,
    tail,
    wait_until,
)


def _wait(
    what: str, check: Callable[[], bool], timeout_s: float, run_dir: Path, state: ClusterState, watch: Sequence[str]
) -> float:
    """Poll ``check`` until true; fail early when a watched component exits. Returns the seconds waited."""
    try:
        return wait_until(check, timeout_s, watch=[state.processes[n] for n in watch if n in state.processes])
    except ProcessExitedError as e:
        p = e.process
        raise DevClusterError(f"{p.name} exited while waiting for {what}; log {p.log_path}\n{p.log_tail(25)}") from None
    except ReadinessTimeoutError:
        logs = "\n".join(f"--- {n} ({log_path(run_dir, n)})\n{tail(log_path(run_dir, n), 12)}" for n in watch)
        raise DevClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs}") from None


def _api_ready(run_dir: Path, server: str) -> bool:
    return http_get(f"{server}/readyz", admin_ssl_context(run_dir / "pki"))[0] == 200


def cluster_status(run_dir: Path) -> ClusterInfo | None:
    """The running cluster recorded in ``run_dir`` if every component is alive and the API is ready (and its
    state records its pods' address block: one started before clusters chose their blocks does not count)."""
    state = ClusterState.load(run_dir)
    if state is None or set(state.processes) != set(COMPONENTS) or not state.pod_block:
        return None
    if not all(p.alive() for p in state.processes.values()) or not _api_ready(run_dir, state.server):
        return None
    if state.real_nodes and not _real_nodes_running(state, len(state.real_nodes.get("nodes", []))):
        return None
    return state.info(run_dir, reused=True)


def _real_nodes_running(state: ClusterState | None, count: int, gpus: int | None = None) -> bool:
    """``state`` records exactly ``count`` real nodes with ``gpus`` fake GPUs each (None: any) and all their
    processes run (0: none recorded)."""
    from batchfill.testbed.node.record import RealNodes  # lazy: batchfill.testbed.node imports this package

    return state is not None and RealNodes.from_record(state.real_nodes).running(count, gpus)


def _reusable(run: Path, real_nodes: int, real_node_gpus: int) -> ClusterInfo | None:
    """The running cluster of ``run`` when its real nodes are ``real_nodes`` with ``real_node_gpus`` GPUs each
    (else None: start afresh). Raises :class:`DevClusterError` for a negative GPU count or a foreign ``run``."""
    if real_node_gpus < 0:
        raise DevClusterError(f"real_node_gpus must be >= 0, got {real_node_gpus}")
    check_run_dir(run)
    existing = cluster_status(run)
    gpus = real_node_gpus if real_nodes else None
    if existing is not None and not _real_nodes_running(ClusterState.load(run), real_nodes, gpus):
        return None
    return existing


def _stop_all(state: ClusterState) -> tuple[list[str], list[str]]:
    """Remove the real nodes (:func:`batchfill.testbed.node.teardown_all`, while the control plane still runs),
    then stop the components. Returns (surviving components, real-node problems)."""
    problems: list[str] = []
    if state.real_nodes:
        from batchfill.testbed.node import RealNodes, teardown_all

        problems = teardown_all(RealNodes.from_record(state.real_nodes))
    return stop_components(state.processes), problems


def cluster_up(
    run_dir: str | os.PathLike[str],
    gpu_nodes: int = 2,
    gpus_per_node: int = 4,
    *,
    cpu_nodes: int = 0,
    console: Console | None = None,
    quiet: bool = False,
    build: bool = True,
    die_with_parent: bool = False,
    timeout_s: float = 240.0,
    real_nodes: int = 0,
    real_node_gpus: int = 4,
) -> ClusterInfo:
    """Start the local cluster in ``run_dir`` (or reuse the one running there) and return where it is.

    Args:
        gpu_nodes, gpus_per_node: fake GPU nodes ``gpu-node-<i>`` with ``nvidia.com/gpu`` capacity.
        cpu_nodes: fake nodes ``cpu-node-<i>`` without GPUs.
        build: build missing binaries with scripts/build-k8s.sh (else raise :class:`BinariesUnavailableError`).
        die_with_parent: the components get SIGTERM when the calling thread exits (test sessions); the CLI's
            ``up`` leaves them running until ``down``.
        timeout_s: how long to wait for the API server (each later wait gets at most this too).
        real_nodes: real nodes ``real-node-<i>`` (kubelet + containerd, label ``batchfill.dev/node=real``) that run
            real containers, each in its own network namespace (:mod:`batchfill.testbed.node`); waited Ready.
        real_node_gpus: fake ``nvidia.com/gpu`` devices of each real node, advertised to its kubelet by a
            ``batchfill-fake-gpu`` device plugin (:mod:`batchfill.testbed.gpu_plugin`, built when missing: seconds
            with a warm Go cache); waited until the kubelet shows them allocatable. 0: no plugin.

    A cluster recorded in ``run_dir`` that is fully alive and ready is reused (its fake nodes are brought to
    the requested set; its pods' address block stays); anything else there is stopped by PID and the directory
    is started afresh, with a pod address block ``127.<a>.0.0/16`` no other dev cluster has claimed and nothing
    listens in (:mod:`.pod_block`; ``ClusterInfo.pod_block``). On a failure every started component is stopped,
    the block's claim is released and the logs stay in ``run_dir/logs``.
    """
    run = Path(run_dir).resolve()
    con = default_console(console, quiet)
    t0 = time.monotonic()

    existing = _reusable(run, real_nodes, real_node_gpus)
    if existing is not None:
        state = _reuse(existing, desired_nodes(gpu_nodes, gpus_per_node, cpu_nodes, pod_block=existing.pod_block),
                       con, timeout_s)  # fmt: skip
        state.gpu_nodes, state.gpus_per_node, state.cpu_nodes = gpu_nodes, gpus_per_node, cpu_nodes
        state.save(run)
        existing.startup_s = time.monotonic() - t0
        con.log(f"reusing the dev cluster at {existing.server} ({run}; pod IPs in {existing.pod_block})")
        return existing
    old = ClusterState.load(run)
    if old is not None:
        _stop_all(old)

    bins = ensure_binaries(con, build=build, kubelet=real_nodes > 0)
    plugin = _ensure_plugin(con, build) if real_nodes and real_node_gpus else None
    prepare_run_dir(run)
    block = claim_pod_block(run)  # drops an earlier claim of this run directory
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
    server = f"https://{LOOPBACK}:{ports['apiserver']}"
    state = ClusterState(server=server, kubeconfig=str(run / KUBECONFIG_NAME), bin_dir=str(bins), ports=ports,
                         gpu_nodes=gpu_nodes, gpus_per_node=gpus_per_node, cpu_nodes=cpu_nodes,
                         pod_block=str(block))  # fmt: skip
    try:
        state.save(run)
        _start(state, run, desired_nodes(gpu_nodes, gpus_per_node, cpu_nodes, pod_block=block), con, timeout_s,
               die_with_parent)  # fmt: skip
        if real_nodes:
            _start_real_nodes(state, run, real_nodes, con, timeout_s, die_with_parent, real_node_gpus, plugin)
    except BaseException:
        survivors, problems = _stop_all(state)
        for line in problems:
            con.log(f"[red]real nodes: {line}")
        if survivors:
            con.log(f"[red]could not stop {', '.join(survivors)}; PIDs in {run / STATE_FILE}")
        else:
            release_pod_block(run, block)
        raise
    info = state.info(run, startup_s=time.monotonic() - t0)
    con.log(f"dev cluster up in {info.startup_s:.1f} s at {server}; pod IPs in {block}")
    return info


def _ensure_plugin(con: Console, build: bool) -> Path:
    """The fake-GPU device plugin's binary, built when missing or stale (``build`` False: raise instead)."""
    from batchfill.testbed.gpu_plugin import ensure_fake_gpu_plugin  # lazy: it imports this package

    return ensure_fake_gpu_plugin(con, build=build)


def _start_real_nodes(
    state: ClusterState,
    run: Path,
    count: int,
    con: Console,
    timeout_s: float,
    die_with_parent: bool,
    gpus: int,
    plugin: Path | None,
) -> None:
    from batchfill.testbed.node import RealNodes, start_real_nodes

    def save(real: RealNodes) -> None:
        state.real_nodes = real.record()
        state.save(run)

    start_real_nodes(count, run_dir=run, pod_block=state.pod_block, apiserver_port=state.ports["apiserver"],
                     bin_dir=Path(state.bin_dir), admin_kubeconfig=Path(state.kubeconfig), save=save, con=con,
                     timeout_s=timeout_s, die_with_parent=die_with_parent, gpus=gpus,
                     plugin_bin=plugin)  # fmt: skip


def _reuse(existing: ClusterInfo, nodes: list[dict[str, Any]], con: Console, timeout_s: float) -> ClusterState:
    """Bring the fake nodes of a running cluster to ``nodes`` (in its pod block); returns its state."""
    run = existing.run_dir
    state = ClusterState.load(run)
    assert state is not None  # cluster_status just read it
    names = {n["metadata"]["name"] for n in nodes}
    with con.status("reusing the running dev cluster; checking its nodes"):
        ensure_fake_nodes(existing.kubeconfig, nodes)
        _wait("fake nodes Ready", lambda: nodes_ready(existing.kubeconfig, names), timeout_s, run, state,
              list(COMPONENTS))  # fmt: skip
    return state


def _start(
    state: ClusterState, run: Path, nodes: list[dict[str, Any]], con: Console, timeout_s: float, die_with_parent: bool
) -> None:
    """Certificates, kubeconfig, then each component in order, each waited for; then the fake nodes."""
    ports, server, kubeconfig = state.ports, state.server, Path(state.kubeconfig)
    names = {n["metadata"]["name"] for n in nodes}
    pki = run / "pki"
    with con.status("creating certificates") as status:
        make_pki(pki)
        write_kubeconfig(kubeconfig, server, b64(pki / "ca.crt"), "batchfill-admin",
                         {"client-certificate-data": b64(pki / "admin.crt"),
                          "client-key-data": b64(pki / "admin.key")})  # fmt: skip
        cmds = commands(Path(state.bin_dir), run, ports, kwok_stages_dir())

        def start(name: str) -> None:
            state.processes[name] = start_component(name, cmds[name], run, die_with_parent)
            state.save(run)

        def step(msg: str, what: str, check: Callable[[], bool], watch: Sequence[str] = COMPONENTS) -> None:
            status.update(msg)
            dt = _wait(what, check, timeout_s, run, state, watch)
            con.log(f"[green]✓[/] {what} ({dt:.1f} s)")

        admin, loose = admin_ssl_context(pki), admin_ssl_context(pki, verify=False)

        def healthy(url: str, ctx: ssl.SSLContext | None = None) -> Callable[[], bool]:
            return lambda: http_get(url, ctx)[0] == 200

        start("etcd")
        step("starting etcd", "etcd healthy", healthy(f"http://{LOOPBACK}:{ports['etcd']}/health"), ["etcd"])
        start("kube-apiserver")
        step("starting kube-apiserver (15-60 s on 2 cores)", "kube-apiserver ready",
             healthy(f"{server}/readyz", admin), ["etcd", "kube-apiserver"])  # fmt: skip
        for name in ("kube-scheduler", "kube-controller-manager", "kwok"):
            start(name)
        step("starting kube-scheduler", "kube-scheduler healthy",
             healthy(f"https://{LOOPBACK}:{ports['scheduler']}/healthz", loose))  # fmt: skip
        step("starting kube-controller-manager", "kube-controller-manager healthy",
             healthy(f"https://{LOOPBACK}:{ports['controller-manager']}/healthz", loose))  # fmt: skip
        status.update("creating fake nodes")
        ensure_fake_nodes(kubeconfig, nodes)
        step(f"waiting for {len(names)} fake nodes (kwok) to be Ready and schedulable",
             f"{len(names)} fake nodes Ready", lambda: nodes_ready(kubeconfig, names))  # fmt: skip
        step("waiting for the default ServiceAccount (controller-manager)", "ServiceAccount default/default",
             lambda: default_service_account_exists(kubeconfig))  # fmt: skip


def cluster_down(run_dir: str | os.PathLike[str], *, console: Console | None = None, quiet: bool = False) -> None:
    """Remove the real nodes (everything they made), stop every component recorded in ``run_dir`` by its PID
    and remove the directory.

    Raises :class:`DevClusterError` when a component survives SIGKILL or a real node left something behind
    (:func:`batchfill.testbed.node.leftovers`; the directory is then kept), or when ``run_dir`` exists but was
    not made by :func:`cluster_up`.
    """
    run = Path(run_dir).resolve()
    con = default_console(console, quiet)
    if not run.exists():
        return
    if not (run / MARKER).exists():
        raise DevClusterError(f"{run} is not a dev-cluster run directory; not touching it")
    state = ClusterState.load(run)
    if state is not None:
        with con.status("stopping the dev cluster"):
            survivors, problems = _stop_all(state)
        if survivors:
            raise DevClusterError(f"{', '.join(survivors)} did not stop; PIDs in {run / STATE_FILE}")
        if state.real_nodes:
            from batchfill.testbed.node import RealNodes, leftovers

            for line in problems:
                con.log(f"real nodes: {line}")
            left = leftovers(RealNodes.from_record(state.real_nodes))
            if left:
                raise DevClusterError(f"the real nodes left {'; '.join(left)} (run dir {run} kept)")
        if state.pod_block:
            release_pod_block(run, state.pod_block)
    shutil.rmtree(run)
    con.log(f"dev cluster stopped; removed {run}")


def restart_components(
    info: ClusterInfo,
    names: Sequence[str] = ("etcd", "kube-apiserver"),
    *,
    down_s: float = 0.0,
    timeout_s: float = 180.0,
    die_with_parent: bool = True,
) -> float:
    """Kill (SIGKILL) the named components of a running dev cluster and start them again with the same flags,
    ports and data directory, as a crash and a supervisor's restart would. Returns the seconds from the kill
    until the API server answers ``/readyz`` again.

    ``down_s``: seconds to stay down between the kill and the restart. Raises :class:`DevClusterError` when a
    component cannot be stopped or does not come back within ``timeout_s``.
    """
    run = info.run_dir
    state = ClusterState.load(run)
    if state is None:
        raise DevClusterError(f"{run} has no dev-cluster state")
    unknown = [n for n in names if n not in state.processes]
    if unknown:
        raise DevClusterError(f"unknown components {unknown}; known: {sorted(state.processes)}")
    t0 = time.monotonic()
    survivors = kill_all([state.processes[n] for n in names])
    if survivors:
        raise DevClusterError(f"{', '.join(p.name for p in survivors)} survived SIGKILL")
    time.sleep(down_s)
    cmds = commands(Path(state.bin_dir), run, state.ports, kwok_stages_dir())
    for n in (c for c in COMPONENTS if c in names):  # etcd before the API server
        state.processes[n] = start_component(n, cmds[n], run, die_with_parent)
        info.pids[n] = state.processes[n].pid
    state.save(run)
    _wait("kube-apiserver ready after a restart", lambda: _api_ready(run, state.server), timeout_s, run, state,
          list(names))  # fmt: skip
    return time.monotonic() - t0


@contextlib.contextmanager
def running_cluster(run_dir: str | os.PathLike[str], **kwargs: Any) -> Iterator[ClusterInfo]:
    """``cluster_up`` ... ``cluster_down`` as a context manager (the demo and tests)."""
    info = cluster_up(run_dir, **kwargs)
    try:
        yield info
    finally:
        cluster_down(run_dir, console=kwargs.get("console"), quiet=bool(kwargs.get("quiet", False)))
