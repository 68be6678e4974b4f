"""The container images a real node of the test bed runs, built on this machine (scripts/build-triton-image.sh).

No Docker and no registry: the script builds each image as a docker-archive tar in
``${BATCHFILL_IMAGE_CACHE:-~/.cache/batchfill/images}``, named by a hash of its inputs, and rebuilds it only when
one of them changes. A node imports the tar (``ctr -n k8s.io images import``) and pods reference the image by
:attr:`ImageArchive.reference` with ``imagePullPolicy: IfNotPresent``.

* the Triton image (:func:`ensure_triton_image`): tritonserver 2.51 from the ``nvidia-pytriton`` wheel with its
  Python-backend stub, onnxruntime and the OCR example's weights on Debian bookworm; it runs the pod
  :func:`batchfill.render.kube.build_deployment` renders unchanged (``tritonserver ...`` args, the init
  container's ``sh -c``, uid 1000) under ``tini``. 1 to 3 minutes cold (2 cores, idle or busy), a cache hit in
  about 0.05 s.

The nodes' pause image and the small test-pod image are busybox, built without the script
(:mod:`batchfill.testbed.node.images`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from batchfill.testbed.devcluster.binaries import SOURCE_ROOT, default_console, progress_printer
from batchfill.testbed.process import tail

#: The script's exit codes (its header documents them) and what each means to a caller.
EXIT_MEANINGS = {
    1: "the archive is missing",
    2: "the build failed",
    3: "a tool the build needs is missing (the log names its Debian package)",
    4: "the build must run as root (debootstrap, chroot)",
}


class ImageUnavailableError(RuntimeError):
    """An image archive is missing and could not be built; the message names the log and what to do."""


@dataclass(frozen=True)
class ImageArchive:
    """A docker-archive tar and the image reference it carries (``RepoTags`` of its manifest)."""

    path: Path
    reference: str


def cache_root() -> Path:
    """``$BATCHFILL_IMAGE_CACHE``, else ``~/.cache/batchfill/images`` (the same rule as the script)."""
    env = os.environ.get("BATCHFILL_IMAGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "batchfill" / "images"


def build_script() -> Path:
    """``$BATCHFILL_BUILD_IMAGE_SCRIPT``, else ``scripts/build-triton-image.sh`` of the source checkout."""
    env = os.environ.get("BATCHFILL_BUILD_IMAGE_SCRIPT")
    return Path(env) if env else SOURCE_ROOT / "scripts" / "build-triton-image.sh"


def ensure_triton_image(
    console: Console | None = None, *, build: bool = True, progress: Callable[[str], None] | None = None
) -> ImageArchive:
    """The Triton image's archive, built first when it is missing (see :func:`ensure_image`)."""
    return ensure_image("triton", console, build=build, progress=progress)


def image_archive(image: str) -> ImageArchive:
    """Where the script puts ``image``'s archive (``triton``) and its reference; builds nothing.

    Raises:
        ImageUnavailableError: the script is not there or cannot name the archive.
    """
    return ImageArchive(Path(_ask(image, "--print-path")), _ask(image, "--print-ref"))


def ensure_image(
    image: str,
    console: Console | None = None,
    *,
    build: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ImageArchive:
    """``image``'s archive (``triton``), running the build script first when it is missing.

    The build writes its output to ``<cache>/<archive name>.build.log``; each of its progress lines (the step,
    the elapsed time; one at least every 30 s) goes to ``progress`` (default: printed unwrapped on ``console``).

    Raises:
        ImageUnavailableError: missing and ``build`` is False, or the build failed (the message holds the
            log's last lines and the script's exit code with its meaning).
    """
    archive = image_archive(image)
    if archive.path.is_file():
        return archive
    if not build:
        raise ImageUnavailableError(f"{archive.path} is missing; run {build_script()} {image}")
    printer = progress_printer(default_console(console))
    say = progress if progress is not None else printer
    log = archive.path.with_suffix(".build.log")
    t0 = time.monotonic()
    say(f"building the {image} image {archive.reference} (see {build_script().name} --help); log: {log}")
    returncode = _run_build(image, log, say)
    if returncode != 0 or not archive.path.is_file():
        what = EXIT_MEANINGS.get(returncode, "the build failed")
        raise ImageUnavailableError(
            f"{build_script().name} {image} exited with {returncode}: {what}; log {log}\n{tail(log, 25)}\n"
            "Fix the cause above and run the command again: downloaded wheels are kept."
        )
    printer(f"built {archive.reference} in {time.monotonic() - t0:.0f} s: {archive.path}")
    return archive


def _ask(image: str, flag: str) -> str:
    script = build_script()
    if not script.is_file():
        raise ImageUnavailableError(
            f"the image build script {script} is not there (set BATCHFILL_BUILD_IMAGE_SCRIPT or run from a "
            "source checkout)"
        )
    out = subprocess.run(
        ["bash", str(script), image, flag], capture_output=True, text=True, env=_env(), timeout=60, check=False
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise ImageUnavailableError(f"{script.name} {image} {flag} exited with {out.returncode}: {out.stderr.strip()}")
    return lines[-1]


def _env() -> dict[str, str]:
    return {**os.environ, "BATCHFILL_IMAGE_CACHE": str(cache_root())}


def _run_build(image: str, log: Path, say: Callable[[str], None]) -> int:
    """Run the build with its output appended to ``log``; pass on its progress lines; its exit code."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**_env(), "BATCHFILL_BUILD_LOG": str(log)}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["bash", str(build_script()), image],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert proc.stderr is not None
        for raw in proc.stderr:  # the script logs to stderr only; its stdout is the archive path
            out.write(raw)
            out.flush()
            line = raw.decode(errors="replace").rstrip()
            if line.startswith("[build-"):
                say(line)
        return proc.wait()
