"""`batchfill dev-cluster up|down|status|build`: the local control plane of :mod:`batchfill.testbed.devcluster`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console

from batchfill.testbed import devcluster


def _print_info(info: devcluster.ClusterInfo, out: Console) -> None:
    from kubernetes import client

    out.print(f"server:     {info.server}")
    out.print(f"kubeconfig: {info.kubeconfig}")
    out.print(f"kubectl:    {info.kubectl}")
    out.print(f"run dir:    {info.run_dir}   (logs in logs/, PIDs in {devcluster.STATE_FILE})")
    out.print(f"pod IPs:    {info.pod_block}")
    with devcluster.api_client(info.kubeconfig) as api:
        items: list[Any] = client.CoreV1Api(api).list_node().items
        for n in items:
            gpus = (n.status.allocatable or {}).get(devcluster.GPU_RESOURCE, "0")
            out.print(f"node:       {n.metadata.name}  {devcluster.GPU_RESOURCE}={gpus}")
    out.print("")
    out.print(f"export KUBECONFIG={info.kubeconfig} PATH={info.bin_dir}:$PATH")


def dev_cluster_main(
    action: str,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    gpu_nodes: int = 2,
    gpus_per_node: int = 4,
    cpu_nodes: int = 0,
    real_nodes: int = 0,
    real_node_gpus: int = 4,
    build: bool = True,
    console: Console | None = None,
) -> int:
    """``up`` (start or reuse; ``real_nodes``: kubelet + containerd nodes with ``real_node_gpus`` fake GPUs each
    from a device plugin), ``down`` (stop, remove everything,
    the run dir too), ``status``, ``build`` (binaries only).

    Progress goes to stderr; the kubeconfig and the ``export`` line to stdout. Returns the exit code:
    0 ok, 1 failure (message printed), 2 unknown action, 3 ``status`` found no running cluster.
    """
    err = console or Console(stderr=True, log_path=False)
    out = Console(highlight=False, soft_wrap=True)
    run = Path(run_dir) if run_dir is not None else devcluster.default_run_dir()
    try:
        if action == "up":
            info = devcluster.cluster_up(
                run, gpu_nodes, gpus_per_node, cpu_nodes=cpu_nodes, console=err, build=build, real_nodes=real_nodes,
                real_node_gpus=real_node_gpus,
            )  # fmt: skip
            _print_info(info, out)
            err.print(f"stop it with: batchfill dev-cluster down{'' if run_dir is None else f' --run-dir {run}'}")
            return 0
        if action == "down":
            devcluster.cluster_down(run, console=err)
            return 0
        if action == "status":
            status = devcluster.cluster_status(run.resolve())
            if status is None:
                err.print(f"no running dev cluster in {run}")
                return 3
            _print_info(status, out)
            return 0
        if action == "build":
            out.print(str(devcluster.ensure_binaries(err, build=True)))
            return 0
    except devcluster.DevClusterError as e:
        err.print(f"[red]dev-cluster {action} failed:[/] {e}", markup=True, highlight=False)
        return 1
    err.print(f"unknown dev-cluster action {action!r} (up, down, status, build)")
    return 2
