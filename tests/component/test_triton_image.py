"""The local Triton image (scripts/build-triton-image.sh) runs the pod the operator renders, checked without a
container runtime: the archive is unpacked with umoci and its entrypoint, user, environment and working directory
are run with chroot in a mount and network namespace of their own (unshare), with the pod's volumes bind-mounted
where its containers mount them.

The Deployment comes from the real rendering path (desired_state -> build_deployment) with the one setting a
GPU-less cluster uses (BATCHFILL_TRITON_CPU_IMAGE, :func:`batchfill.controller.desired.render_on_cpu`): the init
container's ``sh -c`` assembles the model repository, then the main container's args serve the OCR example model
with Triton's fixed ports inside its own network namespace (as in a pod), where the test's client joins it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchfill.controller.desired import desired_state, render_on_cpu
from batchfill.render.kube import HTTP_PORT, Owner, build_deployment
from batchfill.testbed.images import ImageArchive, ensure_triton_image
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.process import Process

pytestmark = [
    pytest.mark.component,
    pytest.mark.slow,  # a cold build takes 1 to 3 minutes; warm, the fixture is a cache hit
    pytest.mark.skipif(
        shutil.which("debootstrap") is None, reason="debootstrap is not installed (apt-get install debootstrap)"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="building and chroot-ing the image needs root"),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "ocr-recognizer.yaml"
OWNER = Owner(name="text-recognizer", namespace="ocr", uid="u-1")
#: A cache hit: the script hashes its inputs and finds the archive.
WARM_CHECK_S = 10.0

# Runs as root in fresh mount and network namespaces (mounts and the loopback vanish with the last process):
# $1 rootfs, $2 uid:gid, then volumes as host-dir=path-in-container=ro|rw up to "--", then the container's argv.
_CONTAINER = r"""
set -eu
root=$1; user=$2; shift 2
ip link set lo up
mkdir -p "$root/proc" "$root/dev"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o size=256m shm "$root/dev/shm"
while [ "$1" != "--" ]; do
  src=${1%%=*}; rest=${1#*=}; dst=${rest%=*}; mode=${rest##*=}
  mkdir -p "$root$dst"
  mount --bind "$src" "$root$dst"
  if [ "$mode" = ro ]; then mount -o remount,bind,ro "$root$dst"; fi
  shift
done
shift
exec chroot --userspec="$user" "$root" "$@"
"""


@dataclass(frozen=True)
class Image:
    """An unpacked image: its root filesystem and the runtime config umoci derived from the image config."""

    archive: ImageArchive
    rootfs: Path
    entrypoint: list[str]  # process.args of a container without args: the image's Entrypoint (no Cmd)
    env: list[str]
    uid: int
    gid: int
    cwd: str

    def argv(self, pod_argv: Sequence[str], mounts: dict[str, tuple[Path, bool]]) -> list[str]:
        """unshare + chroot argv running ``pod_argv`` (already entrypoint + args, or a command) as the image's
        user, environment and working directory, with ``mounts``: container path -> (host dir, read-only)."""
        volumes = [f"{src}={dst}={'ro' if ro else 'rw'}" for dst, (src, ro) in mounts.items()]
        inner = ["/usr/bin/env", "-i", "-C", self.cwd, *self.env, *pod_argv]
        return ["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", _CONTAINER, "container",
                str(self.rootfs), f"{self.uid}:{self.gid}", *volumes, "--", *inner]  # fmt: skip


@pytest.fixture(scope="module")
def archive() -> ImageArchive:
    built = ensure_triton_image(progress=lambda line: print(line, file=sys.stderr, flush=True))
    t0 = time.monotonic()
    again = ensure_triton_image()
    warm_s = time.monotonic() - t0
    assert again == built
    assert warm_s < WARM_CHECK_S, f"the warm check took {warm_s:.1f} s: not a cache hit?"
    print(f"warm check: {warm_s:.2f} s; archive {built.path.stat().st_size / 1e6:.0f} MB", file=sys.stderr)
    return built


@pytest.fixture(scope="module")
def image(archive: ImageArchive, tmp_path_factory: pytest.TempPathFactory) -> Image:
    work = tmp_path_factory.mktemp("image")
    subprocess.run(["skopeo", "copy", "--quiet", f"docker-archive:{archive.path}", f"oci:{work}/oci:image"], check=True)
    subprocess.run(["umoci", "unpack", "--image", f"{work}/oci:image", str(work / "bundle")], check=True)
    process = json.loads((work / "bundle" / "config.json").read_text())["process"]
    return Image(
        archive, work / "bundle" / "rootfs", process["args"], process["env"],
        process["user"]["uid"], process["user"]["gid"], process["cwd"],
    )  # fmt: skip


def test_the_archive_carries_the_reference_and_the_config_a_pod_needs(archive: ImageArchive, image: Image) -> None:
    def member(name: str) -> Any:
        return json.loads(subprocess.run(["tar", "-xOf", str(archive.path), name], capture_output=True,
                                         check=True).stdout)  # fmt: skip

    manifest = member("manifest.json")
    assert manifest[0]["RepoTags"] == [archive.reference]
    assert archive.reference.startswith("batchfill.local/tritonserver:2.51-")
    config = member(manifest[0]["Config"])["config"]  # what the kubelet's runtime reads
    assert config["Entrypoint"] == ["/usr/bin/tini", "--"]
    assert not config.get("Cmd")  # the pod's args are the whole command line after tini
    assert config["User"] == "1000:1000"  # numeric, so runAsNonRoot can verify it
    assert config["WorkingDir"] == "/opt/tritonserver"
    assert "HOME=/home/triton-server" in config["Env"]
    assert image.entrypoint == ["/usr/bin/tini", "--"]
    assert (image.uid, image.gid) == (1000, 1000)
    assert "triton-server:x:1000:1000:" in (image.rootfs / "etc" / "passwd").read_text()
    assert (image.rootfs / "home" / "triton-server").stat().st_uid == 1000
    root = image.rootfs
    for tool in ("bin/sh", "bin/cp", "bin/mkdir", "usr/bin/tini", "usr/local/bin/tritonserver", "usr/bin/python3"):
        assert (root / tool).exists(), tool
    backend = root / "opt" / "tritonserver" / "backends" / "python"
    assert {p.name for p in backend.iterdir()} >= {
        "libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub"
    }  # fmt: skip
    # small: no package lists, pip cache or docs besides the licences
    assert not list((root / "var" / "lib" / "apt" / "lists").glob("*Packages*"))
    assert not (root / "root" / ".cache").exists()
    docs = [p for p in (root / "usr" / "share" / "doc").rglob("*") if p.is_file()]
    assert docs
    assert all(p.name == "copyright" for p in docs)


def run_in_image(image: Image, argv: Sequence[str], mounts: dict[str, tuple[Path, bool]] | None = None,
                 *, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(image.argv(argv, mounts or {}), capture_output=True, text=True, timeout=timeout_s)


def test_tritonserver_is_on_path_for_the_images_user(image: Image) -> None:
    out = run_in_image(image, [*image.entrypoint, "tritonserver", "--help"])
    # tritonserver 2.51 prints its usage and exits 1 on --help (the wheel's binary does the same outside the image)
    # (tini warns on stderr that it is not PID 1 here: no PID namespace, unlike a pod)
    assert out.returncode == 1, out.stderr
    assert "Usage: tritonserver" in out.stdout + out.stderr, out
    assert "--model-repository" in out.stdout + out.stderr
    who = run_in_image(image, ["id", "-un"])
    assert who.stdout.strip() == "triton-server", who


@pytest.fixture
def deployment(archive: ImageArchive) -> Iterator[tuple[dict[str, Any], str]]:
    """The rendered Deployment and config.pbtxt of the OCR example, for a cluster without GPUs."""
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    render_on_cpu(archive.reference)
    try:
        desired = desired_state(spec)
        yield build_deployment(OWNER, desired.spec, desired.config_hash, 1), desired.config
    finally:
        render_on_cpu("")


def test_the_rendered_pod_assembles_its_repository_and_serves_in_the_image(
    image: Image, deployment: tuple[dict[str, Any], str], tmp_path: Path
) -> None:
    """Long-running (model load): init container, main container, one inference, SIGTERM through tini."""
    dep, config = deployment
    pod = dep["spec"]["template"]["spec"]
    init, main = pod["initContainers"][0], pod["containers"][0]
    assert init["image"] == main["image"] == image.archive.reference
    assert "kind: KIND_CPU" in config

    # the volumes: the PVC with the model files (a config.pbtxt of its own, which the ConfigMap's replaces), the
    # ConfigMap, the emptyDir the pod's fsGroup makes writable for uid 1000
    model = "text_recognizer"
    source, configmap, models = tmp_path / "pvc", tmp_path / "configmap", tmp_path / "models"
    write_model(source, model, "name: 'stale'\n", "ocr_recognizer")
    configmap.mkdir()
    (configmap / "config.pbtxt").write_text(config)
    models.mkdir()
    os.chown(models, image.uid, image.gid)
    for d in (tmp_path, source, configmap):
        d.chmod(0o755)
    host_dir = {"model-source": source, "config": configmap, "models": models}

    def mounts(container: dict[str, Any]) -> dict[str, tuple[Path, bool]]:
        out = {}
        for m in container["volumeMounts"]:
            if m["name"] in host_dir:
                out[m["mountPath"]] = (host_dir[m["name"]], bool(m.get("readOnly")))
        return out

    assembled = run_in_image(image, init["command"], mounts(init))
    assert assembled.returncode == 0, assembled.stderr
    assert (models / model / "config.pbtxt").read_text() == config
    assert (models / model / "1" / "model.py").is_file()

    log = tmp_path / "tritonserver.log"
    server = Process.start(image.argv([*image.entrypoint, *main["args"]], mounts(main)), log, name="triton-image")
    try:
        answer = pod_client(server, model, timeout_s=180)
        assert answer.get("ready") is True, f"{answer}\n{server.log_tail(40)}"
        assert answer["tokens_shape"] == [1, 40]
        assert answer["tokens_dtype"] == "int64"
        assert answer["scores_shape"] == [1, 40]
        assert 0.0 <= answer["scores_min"] <= answer["scores_max"] <= 1.0
        t0 = time.monotonic()
        server.send_signal(signal.SIGTERM)  # what the kubelet sends: tini passes it on, tritonserver exits
        while server.alive() and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        stop_s = time.monotonic() - t0
        assert not server.alive(), f"still running {stop_s:.0f} s after SIGTERM\n{server.log_tail(20)}"
        assert server.returncode == 0, server.log_tail(20)
        assert stop_s < 15
    finally:
        server.stop(grace_s=5)


# Joins the pod's network namespace (nsenter) and talks to Triton on its fixed port there.
_CLIENT = r"""
import json, sys, time
import numpy as np
import tritonclient.http as httpclient
port, model, deadline = int(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3])
client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
ready = False
while time.monotonic() < deadline and not ready:
    try:
        ready = client.is_server_ready()
    except Exception:
        pass
    if not ready:
        time.sleep(0.5)
if not ready:
    print(json.dumps({"ready": False})); sys.exit(0)
x = httpclient.InferInput("x", [1, 3, 48, 320], "FP32")
x.set_data_from_numpy(np.random.default_rng(0).random((1, 3, 48, 320), dtype=np.float32))
result = client.infer(model, [x])
tokens, scores = result.as_numpy("tokens"), result.as_numpy("scores")
print(json.dumps({"ready": True, "tokens_shape": list(tokens.shape), "tokens_dtype": str(tokens.dtype),
                  "scores_shape": list(scores.shape), "scores_min": float(scores.min()),
                  "scores_max": float(scores.max())}))
"""


def pod_client(server: Process, model: str, *, timeout_s: float) -> dict[str, Any]:
    """Wait for /v2/health/ready on the pod's HTTP port and run one inference, from inside its network namespace."""
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{server.pid}/ns/net").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # the namespace is the one unshare made once it has exec'd sh; wait for that before joining it
    own = os.readlink("/proc/self/ns/net")
    while os.readlink(f"/proc/{server.pid}/ns/net") == own and time.monotonic() < deadline:
        time.sleep(0.05)
    out = subprocess.run(
        ["nsenter", f"--net=/proc/{server.pid}/ns/net", sys.executable, "-c", _CLIENT, str(HTTP_PORT), model,
         str(timeout_s)],
        capture_output=True, text=True, timeout=timeout_s + 30,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stderr}\n{server.log_tail(40)}"
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
