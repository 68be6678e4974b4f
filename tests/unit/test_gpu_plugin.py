"""The fake-GPU device plugin: its Go test against a fake kubelet, its build script, and the Python side
(batchfill.testbed.gpu_plugin) that builds and starts it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from batchfill.testbed import devcluster, gpu_plugin
from batchfill.testbed.process import wait_until

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tools" / "fake-gpu-plugin"
GO = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)
needs_go = pytest.mark.skipif(GO is None, reason="no Go toolchain (go on PATH or /usr/local/go/bin/go)")


def go_env(**extra: str) -> dict[str, str]:
    """The build script's Go settings: no toolchain download, static, the committed go.mod/go.sum unchanged."""
    env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false")
    env.update(extra)
    return env


@needs_go
@pytest.mark.slow
def test_go_plugin_against_a_fake_kubelet() -> None:
    """tools/fake-gpu-plugin/plugin_test.go plays the kubelet: Register (resource, v1beta1, endpoint),
    ListAndWatch (3 healthy devices), Allocate (envs), re-registration after kubelet.sock is recreated and after
    the plugin's socket is removed, and SIGTERM (exit 0, socket gone). -count=1: run it, not a cached pass."""
    assert GO is not None
    r = subprocess.run(
        [GO, "test", "-count=1", "-v", "./..."], cwd=SOURCE, env=go_env(), capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for name in ("TestAgainstFakeKubelet", "TestFailHealth", "TestParseFlags"):
        assert f"--- PASS: {name}" in out, out


@needs_go
def test_go_sources_are_gofmt_formatted_and_vetted() -> None:
    assert GO is not None
    goroot = subprocess.run([GO, "env", "GOROOT"], env=go_env(), capture_output=True, text=True, check=True)
    gofmt = subprocess.run(  # -l: the files whose formatting differs from gofmt's
        [str(Path(goroot.stdout.strip()) / "bin" / "gofmt"), "-l", "."], cwd=SOURCE, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert (gofmt.returncode, gofmt.stdout) == (0, ""), gofmt.stdout + gofmt.stderr
    vet = subprocess.run([GO, "vet", "./..."], cwd=SOURCE, env=go_env(), capture_output=True, text=True, check=False)
    assert vet.returncode == 0, vet.stdout + vet.stderr


def test_versions_match_the_control_plane() -> None:
    script = (ROOT / "scripts" / "build-fake-gpu-plugin.sh").read_text()
    m = re.search(r"^K8S_VERSION=\$\{K8S_VERSION:-([^}]+)\}", script, re.M)
    assert m, "K8S_VERSION default not found in scripts/build-fake-gpu-plugin.sh"
    assert m.group(1) == devcluster.K8S_VERSION
    # The kubelet's API module of the same release: Kubernetes v1.Y.Z publishes k8s.io/kubelet v0.Y.Z.
    gomod = (SOURCE / "go.mod").read_text()
    assert re.search(rf"^\s*k8s\.io/kubelet v0\.{re.escape(devcluster.K8S_VERSION[3:])}$", gomod, re.M), gomod


@needs_go
@pytest.mark.slow
def test_build_script_rebuilds_only_when_the_source_changes(tmp_path: Path) -> None:
    """A copy of the script and the source (so the test may edit it), built into a temporary cache: --check
    fails before the build and after a source edit, passes after a build; --print-path builds nothing."""
    (tmp_path / "scripts" / "lib").mkdir(parents=True)
    script = tmp_path / "scripts" / "build-fake-gpu-plugin.sh"
    shutil.copy(ROOT / "scripts" / "build-fake-gpu-plugin.sh", script)
    shutil.copy(ROOT / "scripts" / "lib" / "progress.sh", tmp_path / "scripts" / "lib" / "progress.sh")
    src = tmp_path / "tools" / "fake-gpu-plugin"
    shutil.copytree(SOURCE, src)
    cache = tmp_path / "cache"
    env = go_env(BATCHFILL_K8S_CACHE=str(cache), PATH=f"{Path(str(GO)).parent}:/usr/bin:/bin")
    binary = cache / devcluster.K8S_VERSION / "bin" / gpu_plugin.PLUGIN_NAME

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, check=False)

    assert run("--print-path").stdout.strip() == str(binary)
    assert run("--check").returncode == 1
    assert not cache.exists()
    built = run()
    assert built.returncode == 0, built.stderr
    assert built.stdout.splitlines()[-1] == str(binary)
    assert "go build: done" in built.stderr
    assert run("--check").returncode == 0
    again = run()
    assert again.returncode == 0
    assert "up to date" in again.stderr
    with open(src / "main.go", "a") as f:
        f.write("\n// an edit\n")
    assert run("--check").returncode == 1
    assert run().returncode == 0
    assert run("--check").returncode == 0
    r = subprocess.run([str(binary), "--count", "0"], capture_output=True, text=True, check=False)
    assert r.returncode == 2
    assert "--count must be >= 1, got 0" in r.stderr


def test_argv() -> None:
    argv = gpu_plugin.fake_gpu_plugin_argv(
        Path("/var/lib/kubelet/device-plugins"), "node-a", 4, binary=Path("/opt/bin/batchfill-fake-gpu")
    )
    assert argv == [
        "/opt/bin/batchfill-fake-gpu", "--plugin-dir", "/var/lib/kubelet/device-plugins",
        "--resource", "nvidia.com/gpu", "--count", "4", "--node", "node-a",
        "--socket-name", "batchfill-fake-gpu.sock",
    ]  # fmt: skip
    unhealthy = gpu_plugin.fake_gpu_plugin_argv(
        Path("/p"), "n", 2, resource="example.com/gpu", fail_health=gpu_plugin.device_ids("n", 2)
    )
    assert unhealthy[0] == str(gpu_plugin.plugin_path())
    assert unhealthy[unhealthy.index("--resource") + 1] == "example.com/gpu"
    assert unhealthy[-2:] == ["--fail-health", "fake-gpu-n-0,fake-gpu-n-1"]


def test_start_runs_the_argv_as_a_process(tmp_path: Path) -> None:
    fake = tmp_path / "batchfill-fake-gpu"
    fake.write_text('#!/bin/sh\necho "argv: $*"\nexec sleep 60\n')
    fake.chmod(0o755)
    log = tmp_path / "logs" / "plugin.log"
    p = gpu_plugin.start_fake_gpu_plugin(tmp_path / "dp", "n1", 2, log, binary=fake)
    try:
        assert p.name == "batchfill-fake-gpu"
        want = f"argv: --plugin-dir {tmp_path / 'dp'} --resource nvidia.com/gpu --count 2 --node n1"
        wait_until(lambda: want in log.read_text(), 10, watch=[p])
    finally:
        assert p.stop(grace_s=5) == -15  # sleep dies of the SIGTERM
    with pytest.raises(devcluster.BinariesUnavailableError, match="ensure_fake_gpu_plugin"):
        gpu_plugin.start_fake_gpu_plugin(tmp_path, "n1", 1, log, binary=tmp_path / "absent")


def fake_build_script(tmp_path: Path, build: str) -> Path:
    """A build script whose --check passes once the binary exists and whose build runs ``build``."""
    script = tmp_path / "build.sh"
    script.write_text(
        "#!/bin/sh\nbin=$BATCHFILL_K8S_CACHE/$K8S_VERSION/bin/batchfill-fake-gpu\n"
        'if [ "$1" = --check ]; then [ -x "$bin" ]; exit $?; fi\n'
        f"echo '[build-fake-gpu] building'\n{build}\n"
    )
    return script


def test_ensure_builds_when_missing_and_not_when_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHFILL_K8S_CACHE", str(tmp_path / "cache"))
    script = fake_build_script(
        tmp_path, 'mkdir -p "$(dirname "$bin")" && printf "#!/bin/sh\\n" > "$bin" && chmod +x "$bin"'
    )
    monkeypatch.setenv("BATCHFILL_BUILD_FAKE_GPU_SCRIPT", str(script))
    lines: list[str] = []
    assert gpu_plugin.ensure_fake_gpu_plugin(progress=lines.append) == gpu_plugin.plugin_path()
    assert lines == ["[build-fake-gpu] building"]
    assert gpu_plugin.plugin_path().is_file()
    assert gpu_plugin.ensure_fake_gpu_plugin(progress=lines.append) == gpu_plugin.plugin_path()
    assert lines == ["[build-fake-gpu] building"]  # current: no second build


def test_ensure_reports_a_missing_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHFILL_K8S_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BATCHFILL_BUILD_FAKE_GPU_SCRIPT", str(fake_build_script(tmp_path, "echo 'go: none'; exit 3")))
    with pytest.raises(devcluster.BinariesUnavailableError, match=r"exited with 3: no usable Go(.|\n)*go: none"):
        gpu_plugin.ensure_fake_gpu_plugin(progress=lambda _: None)
    monkeypatch.setenv("BATCHFILL_BUILD_FAKE_GPU_SCRIPT", str(tmp_path / "absent.sh"))
    with pytest.raises(devcluster.BinariesUnavailableError, match="no build script"):
        gpu_plugin.ensure_fake_gpu_plugin()
