"""The fake-GPU device plugin of the test bed's real nodes: building ``batchfill-fake-gpu`` and starting it.

A kubelet accounts for ``nvidia.com/gpu`` itself once a device plugin registers devices of that resource with it
through the kubelet's device-plugin API v1beta1
(https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/): the node's capacity
and allocatable count the healthy devices, a pod is admitted only onto free ones, and a pod asking for more than
are free stays Pending with the scheduler's own reason. ``batchfill-fake-gpu`` (Go, ``tools/fake-gpu-plugin/``)
is such a plugin without a GPU: devices ``fake-gpu-<node>-<i>``, and each container that gets some has
``NVIDIA_VISIBLE_DEVICES=<comma-separated IDs>`` (as from the NVIDIA device plugin) and ``BATCHFILL_FAKE_GPU=1``,
and no device nodes. It serves on ``<plugin dir>/<socket name>``, registers with ``<plugin dir>/kubelet.sock``
(waiting for it), registers again within about a second after the kubelet restarts, and exits 0 on SIGTERM,
removing its socket.

``scripts/build-fake-gpu-plugin.sh`` builds it through the Go module proxy into the control plane's
:func:`~batchfill.testbed.devcluster.bin_dir`, again whenever a file of its source changes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from batchfill.testbed.devcluster.binaries import (
    K8S_VERSION,
    SOURCE_ROOT,
    BinariesUnavailableError,
    bin_dir,
    cache_root,
    default_console,
    progress_printer,
    run_build,
)
from batchfill.testbed.devcluster.nodes import GPU_RESOURCE
from batchfill.testbed.process import Process, tail

PLUGIN_NAME = "batchfill-fake-gpu"
#: The plugin's socket file name in the kubelet's plugin directory (its ``--socket-name`` default too).
SOCKET_NAME = "batchfill-fake-gpu.sock"


def plugin_path() -> Path:
    """Where scripts/build-fake-gpu-plugin.sh puts the binary: ``<bin_dir()>/batchfill-fake-gpu``."""
    return bin_dir() / PLUGIN_NAME


def build_script() -> Path:
    """``$BATCHFILL_BUILD_FAKE_GPU_SCRIPT``, else ``scripts/build-fake-gpu-plugin.sh`` of the source checkout."""
    env = os.environ.get("BATCHFILL_BUILD_FAKE_GPU_SCRIPT")
    return Path(env) if env else SOURCE_ROOT / "scripts" / "build-fake-gpu-plugin.sh"


def device_ids(node: str, count: int) -> list[str]:
    """The IDs the plugin advertises for ``node`` (``deviceIDs`` in tools/fake-gpu-plugin/plugin.go)."""
    return [f"fake-gpu-{node}-{i}" for i in range(count)]


def ensure_fake_gpu_plugin(
    console: Console | None = None,
    *,
    build: bool = True,
    log_path: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Return :func:`plugin_path`, running scripts/build-fake-gpu-plugin.sh first when the binary is missing or
    was built from other source (``build`` False: raise instead of building).

    Seconds with a warm Go build cache, about a minute cold. The build's output goes to ``log_path`` (default
    ``<cache>/<k8s version>/build-fake-gpu.log``) and its progress lines to ``progress`` (default: printed on
    ``console``), as in :func:`~batchfill.testbed.devcluster.ensure_binaries`. Raises
    :class:`~batchfill.testbed.devcluster.BinariesUnavailableError` with the log's last lines when there is no
    script or Go toolchain or the build fails.
    """
    script = build_script()
    if not script.is_file():
        raise BinariesUnavailableError(
            f"no build script {script} for {PLUGIN_NAME} (set BATCHFILL_BUILD_FAKE_GPU_SCRIPT or run from a source "
            "checkout)"
        )
    env = dict(os.environ, K8S_VERSION=K8S_VERSION, BATCHFILL_K8S_CACHE=str(cache_root()))
    check = subprocess.run(["bash", str(script), "--check"], env=env, stdin=subprocess.DEVNULL, check=False)
    if check.returncode == 0:
        return plugin_path()
    if not build:
        raise BinariesUnavailableError(f"{plugin_path()} is missing or stale: run {script}")
    say = progress if progress is not None else progress_printer(default_console(console))
    log = log_path or cache_root() / K8S_VERSION / "build-fake-gpu.log"
    returncode = run_build(script, log, say)
    if returncode != 0:
        what = {3: "no usable Go toolchain (Go >= 1.26 needed)"}.get(returncode, "the build failed")
        raise BinariesUnavailableError(
            f"scripts/build-fake-gpu-plugin.sh exited with {returncode}: {what}; log {log}\n{tail(log, 25)}"
        )
    if not plugin_path().is_file():
        raise BinariesUnavailableError(f"build finished but {plugin_path()} is missing; log {log}")
    return plugin_path()


def fake_gpu_plugin_argv(
    plugin_dir: Path,
    node: str,
    count: int,
    *,
    binary: Path | None = None,
    resource: str = GPU_RESOURCE,
    socket_name: str = SOCKET_NAME,
    fail_health: Sequence[str] = (),
) -> list[str]:
    """The plugin's command line: ``count`` devices of ``resource`` for ``node``, served in ``plugin_dir`` (the
    kubelet's ``<root-dir>/device-plugins``); ``fail_health``: IDs of :func:`device_ids` advertised Unhealthy.
    ``binary`` defaults to :func:`plugin_path`."""
    argv = [str(binary or plugin_path()), "--plugin-dir", str(plugin_dir), "--resource", resource]
    argv += ["--count", str(count), "--node", node, "--socket-name", socket_name]
    if fail_health:
        argv += ["--fail-health", ",".join(fail_health)]
    return argv


def start_fake_gpu_plugin(
    plugin_dir: Path,
    node: str,
    count: int,
    log: Path,
    *,
    binary: Path | None = None,
    resource: str = GPU_RESOURCE,
    fail_health: Sequence[str] = (),
    die_with_parent: bool = False,
) -> Process:
    """Start the plugin (:func:`fake_gpu_plugin_argv`) as a :class:`~batchfill.testbed.process.Process`, its
    stderr appended to ``log``. It need not wait for the kubelet: it registers once ``kubelet.sock`` appears.

    Stop it with ``Process.stop`` (SIGTERM: it removes its socket and exits 0). Raises
    :class:`~batchfill.testbed.devcluster.BinariesUnavailableError` when the binary is not there (build it with
    :func:`ensure_fake_gpu_plugin`).
    """
    argv = fake_gpu_plugin_argv(plugin_dir, node, count, binary=binary, resource=resource, fail_health=fail_health)
    if not Path(argv[0]).is_file():
        raise BinariesUnavailableError(f"{argv[0]} is missing: build it with ensure_fake_gpu_plugin()")
    return Process.start(argv, log, name=PLUGIN_NAME, die_with_parent=die_with_parent)
