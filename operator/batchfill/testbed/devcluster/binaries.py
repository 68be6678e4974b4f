"""The control plane's binaries: where they are cached, which are missing, and building them (scripts/build-k8s.sh).

``scripts/build-k8s.sh`` builds them from Go modules through the module proxy into
``${BATCHFILL_K8S_CACHE:-~/.cache/batchfill/k8s}/<k8s version>/bin``, each with a ``.<name>.version`` stamp.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from batchfill.testbed.process import tail

K8S_VERSION = "v1.36.5"  # keep in step with scripts/build-k8s.sh (tests/unit/test_devcluster.py checks it)
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
VERSION_OF = {
    "etcd": ETCD_VERSION,
    "kwok": KWOK_VERSION,
    "kube-apiserver": K8S_VERSION,
    "kube-controller-manager": K8S_VERSION,
    "kube-scheduler": K8S_VERSION,
    "kubectl": K8S_VERSION,
}
#: The source checkout this package runs from (operator/batchfill/testbed/devcluster/ is four levels down).
SOURCE_ROOT = Path(__file__).resolve().parents[4]


class DevClusterError(RuntimeError):
    """The local cluster could not be started, reached or stopped; the message names the log to read."""


class BinariesUnavailableError(DevClusterError):
    """The control-plane binaries are missing and could not be built (no Go, no proxy, build failure)."""


def cache_root() -> Path:
    """``$BATCHFILL_K8S_CACHE``, else ``~/.cache/batchfill/k8s`` (the same rule as scripts/build-k8s.sh)."""
    env = os.environ.get("BATCHFILL_K8S_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "batchfill" / "k8s"


def bin_dir() -> Path:
    return cache_root() / K8S_VERSION / "bin"


def kwok_stages_dir() -> Path:
    return cache_root() / K8S_VERSION / "kwok-stages"


def kubectl_path() -> Path:
    """The kubectl built with the cluster (the machine's own kubectl may be older)."""
    return bin_dir() / "kubectl"


def build_script() -> Path:
    """``$BATCHFILL_BUILD_K8S_SCRIPT``, else ``scripts/build-k8s.sh`` of the source checkout."""
    env = os.environ.get("BATCHFILL_BUILD_K8S_SCRIPT")
    return Path(env) if env else SOURCE_ROOT / "scripts" / "build-k8s.sh"


#: Built only for real nodes (``BATCHFILL_BUILD_KUBELET=1 scripts/build-k8s.sh``).
KUBELET = "kubelet"


def missing_binaries(*, kubelet: bool = False) -> list[str]:
    """Binaries that are absent from :func:`bin_dir` or were built for another version (``kubelet``: the kubelet
    too)."""
    d = bin_dir()
    missing = []
    for name in (*BINARIES, KUBELET) if kubelet else BINARIES:
        stamp = d / f".{name}.version"
        ok = (d / name).is_file() and stamp.is_file() and stamp.read_text().strip() == VERSION_OF.get(name, K8S_VERSION)
        if not ok:
            missing.append(name)
    if not (kwok_stages_dir() / "node" / "fast" / "node-initialize.yaml").is_file():
        missing.append("kwok-stages")
    return missing


def default_console(console: Console | None, quiet: bool = False) -> Console:
    """``console``, else a new stderr console (``quiet``: prints nothing)."""
    return console if console is not None else Console(stderr=True, quiet=quiet, log_path=False)


def progress_printer(console: Console) -> Callable[[str], None]:
    """Print a progress line on ``console`` as it is: no markup (``[build-k8s]`` is not a style tag) and not
    wrapped, so a log of a run that is not on a terminal gets each line whole (rich wraps at 80 columns there)."""

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)

    return say


def ensure_binaries(
    console: Console | None = None,
    *,
    build: bool = True,
    log_path: Path | None = None,
    progress: Callable[[str], None] | None = None,
    kubelet: bool = False,
) -> Path:
    """Return :func:`bin_dir`, running scripts/build-k8s.sh first when something is missing.

    The build (about 15 min cold on 2 cores, about 35 s with a warm Go build cache) writes its output to
    ``log_path`` (default ``<cache>/<version>/build.log``). Every progress line of the script (which
    component, the elapsed time, the log path; one at least every 30 s) is passed to ``progress`` (default:
    printed unwrapped on ``console``, :func:`progress_printer`), so a build is never silent, on a terminal or
    not. ``kubelet``: the kubelet too (real nodes; about 95 s more with a warm cache, ~8 min cold). Raises
    :class:`BinariesUnavailableError` with the log's last lines and what to do.
    """
    missing = missing_binaries(kubelet=kubelet)
    if not missing:
        return bin_dir()
    if not build:
        raise BinariesUnavailableError(f"missing in {bin_dir()}: {', '.join(missing)}; run scripts/build-k8s.sh")
    script = build_script()
    if not script.is_file():
        raise BinariesUnavailableError(
            f"missing in {bin_dir()}: {', '.join(missing)}, and the build script {script} is not there "
            "(set BATCHFILL_BUILD_K8S_SCRIPT or run from a source checkout)"
        )
    printer = progress_printer(default_console(console))
    say = progress if progress is not None else printer
    log = log_path or cache_root() / K8S_VERSION / "build.log"
    t0 = time.monotonic()
    say(f"building {', '.join(missing)} from Go modules (cold: 12-25 min on 2 cores, once); log: {log}")
    returncode = run_build(script, log, say, kubelet)
    if returncode != 0:
        what = {3: "no usable Go toolchain (Go >= 1.26 needed)"}.get(returncode, "the build failed")
        raise BinariesUnavailableError(
            f"scripts/build-k8s.sh exited with {returncode}: {what}; log {log}\n{tail(log, 25)}\n"
            "Fix the cause above and run the command again: finished components and Go's caches are kept."
        )
    still = missing_binaries(kubelet=kubelet)
    if still:
        raise BinariesUnavailableError(f"build finished but {', '.join(still)} still missing; log {log}")
    printer(f"built the control plane in {time.monotonic() - t0:.0f} s: {bin_dir()}")
    return bin_dir()


def run_build(script: Path, log: Path, say: Callable[[str], None], kubelet: bool = False) -> int:
    """Run the build script ``script`` (scripts/build-k8s.sh, scripts/build-fake-gpu-plugin.sh) with its output
    appended to ``log`` and the cache's settings in its environment; pass each of its ``[build-...]`` progress lines
    to ``say``; return its exit code (``kubelet``: ``BATCHFILL_BUILD_KUBELET=1``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        K8S_VERSION=K8S_VERSION, ETCD_VERSION=ETCD_VERSION, KWOK_VERSION=KWOK_VERSION,
        BATCHFILL_K8S_CACHE=str(cache_root()), BATCHFILL_BUILD_LOG=str(log),
        BATCHFILL_BUILD_KUBELET="1" if kubelet else env.get("BATCHFILL_BUILD_KUBELET", "0"),
    )  # fmt: skip
    with open(log, "ab") as out:
        lines = _LogFollower(log, out.tell())
        proc = subprocess.Popen(
            ["bash", str(script)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
        while proc.poll() is None:
            time.sleep(1.0)
            for line in lines.new_lines():
                say(line)
        for line in lines.new_lines():
            say(line)
    return proc.returncode


class _LogFollower:
    """The build script's own progress lines (``[build-...] ...``) appended to a log since ``start`` (bytes)."""

    def __init__(self, path: Path, start: int) -> None:
        self._path, self._offset, self._partial = path, start, b""

    def new_lines(self) -> list[str]:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(1 << 20)
        except OSError:
            return []
        self._offset += len(chunk)
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        text = (raw.decode(errors="replace").rstrip() for raw in whole)
        return [line for line in text if line.startswith("[build-")]
