"""Container images built without a registry: a busybox image (``busybox-static``) that serves as the nodes'
pause image and as a tiny image for test pods (``busybox httpd``, ``sleep``).

The root filesystem (the static busybox and a few applet links) goes into an OCI layout with umoci
(https://umo.ci/), skopeo turns it into a ``docker-archive`` tar that ``ctr images import`` reads. The tar is
cached in ``$BATCHFILL_IMAGE_CACHE`` (default ``~/.cache/batchfill/images``) under the hash of its inputs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
#: busybox applets linked into the image's /bin.
APPLETS = ("sh", "sleep", "httpd", "cat", "echo", "ls", "wget", "mkdir", "true")
#: The pause process: sleep as long as a 32-bit timer allows (busybox sleep has no "infinity").
PAUSE_COMMAND = ("/bin/sleep", "2147483647")
IMAGE_REPO = "batchfill.local/busybox"


class ImageBuildError(RuntimeError):
    """A tool is missing or umoci/skopeo failed."""


def image_cache() -> Path:
    env = os.environ.get("BATCHFILL_IMAGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "batchfill" / "images"


def busybox_tag(busybox: Path = BUSYBOX) -> str:
    """The image's tag: 12 hex digits of SHA-256 over the busybox binary, the applets and the command."""
    h = hashlib.sha256(busybox.read_bytes())
    h.update(repr((APPLETS, PAUSE_COMMAND)).encode())
    return h.hexdigest()[:12]


def _run(*argv: str) -> None:
    if shutil.which(argv[0]) is None:
        raise ImageBuildError(f"{argv[0]} is needed to build the busybox image (Debian package {argv[0]})")
    r = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=300)
    if r.returncode != 0:
        raise ImageBuildError(f"{' '.join(argv)} failed: {(r.stderr or r.stdout).strip()}")


def busybox_image(busybox: Path = BUSYBOX) -> tuple[str, Path]:
    """``(reference, docker-archive tar)`` of the busybox image, built when not cached.

    Raises :class:`ImageBuildError` when ``busybox`` (Debian busybox-static), umoci or skopeo is missing or fails.
    """
    if not busybox.is_file():
        raise ImageBuildError(f"{busybox} is missing (Debian package busybox-static)")
    tag = busybox_tag(busybox)
    ref = f"{IMAGE_REPO}:{tag}"
    out = image_cache() / f"busybox-{tag}.tar"
    if out.is_file():
        return ref, out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        layout, rootfs = Path(tmp) / "oci", Path(tmp) / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        for d in ("tmp", "www", "etc", "proc", "sys", "dev"):
            (rootfs / d).mkdir()
        shutil.copy2(busybox, rootfs / "bin" / "busybox")
        for applet in APPLETS:
            (rootfs / "bin" / applet).symlink_to("busybox")
        _run("umoci", "init", "--layout", str(layout))
        _run("umoci", "new", "--image", f"{layout}:img")
        _run("umoci", "insert", "--image", f"{layout}:img", str(rootfs), "/")
        cmd = [f"--config.cmd={c}" for c in PAUSE_COMMAND]
        _run("umoci", "config", "--image", f"{layout}:img", "--config.workingdir=/", *cmd)
        part = out.with_name(f"{out.name}.{os.getpid()}.part")  # two builds at once each write their own
        part.unlink(missing_ok=True)
        _run("skopeo", "--insecure-policy", "copy", f"oci:{layout}:img", f"docker-archive:{part}:{ref}")
        part.replace(out)
    return ref, out
