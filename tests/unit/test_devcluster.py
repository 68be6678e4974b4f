"""Unit tests of the dev cluster's parts that need no Kubernetes binaries (PKI, manifests, PIDs, the CLI entry)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from batchfill.cli.dev_cluster import dev_cluster_main
from batchfill.testbed import devcluster
from batchfill.testbed.devcluster.binaries import VERSION_OF
from batchfill.testbed.devcluster.components import start_component, stop_components
from batchfill.testbed.devcluster.kubeconfig import cluster_of
from batchfill.testbed.process import Process

ROOT = Path(__file__).resolve().parents[2]


def test_versions_match_the_build_script_defaults() -> None:
    script = (ROOT / "scripts" / "build-k8s.sh").read_text()
    for var, value in [
        ("K8S_VERSION", devcluster.K8S_VERSION),
        ("ETCD_VERSION", devcluster.ETCD_VERSION),
        ("KWOK_VERSION", devcluster.KWOK_VERSION),
    ]:
        m = re.search(rf"^{var}=\$\{{{var}:-([^}}]+)\}}", script, re.M)
        assert m, f"{var} default not found in scripts/build-k8s.sh"
        assert m.group(1) == value, f"scripts/build-k8s.sh {var}={m.group(1)} but devcluster has {value}"


def test_build_script_check_and_print_dir_do_not_build(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BATCHFILL_K8S_CACHE": str(tmp_path / "k8s")}
    script = str(ROOT / "scripts" / "build-k8s.sh")
    r = subprocess.run(["bash", script, "--print-dir"], env=env, capture_output=True, text=True, check=False)
    assert r.returncode == 0
    assert r.stdout.strip() == str(tmp_path / "k8s" / devcluster.K8S_VERSION / "bin")
    r = subprocess.run(["bash", script, "--check"], env=env, capture_output=True, text=True, check=False)
    assert r.returncode == 1
    assert not (tmp_path / "k8s").exists()


def test_missing_binaries_follows_files_and_version_stamps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHFILL_K8S_CACHE", str(tmp_path))
    assert set(devcluster.missing_binaries()) == {*devcluster.BINARIES, "kwok-stages"}
    bins = devcluster.bin_dir()
    bins.mkdir(parents=True)
    for name in devcluster.BINARIES:
        (bins / name).write_text("#!/bin/sh\n")
        (bins / f".{name}.version").write_text(VERSION_OF[name] + "\n")
    stage = devcluster.kwok_stages_dir() / "node" / "fast" / "node-initialize.yaml"
    stage.parent.mkdir(parents=True)
    stage.write_text("kind: Stage\n")
    assert devcluster.missing_binaries() == []
    (bins / ".etcd.version").write_text("v3.5.0\n")
    assert devcluster.missing_binaries() == ["etcd"]
    with pytest.raises(devcluster.BinariesUnavailableError, match="etcd"):
        devcluster.ensure_binaries(build=False)


def test_build_progress_lines_are_printed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not on a terminal rich wraps at 80 columns and takes ``[build-k8s]`` for markup: neither may happen."""
    line = (
        "[build-k8s] Kubernetes v1.36.5: go build kube-apiserver kube-controller-manager: building, 30 s elapsed, log x"
    )
    script = tmp_path / "build.sh"
    script.write_text(f"echo 'go: noise'\necho '{line}'\n")
    monkeypatch.setenv("BATCHFILL_K8S_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BATCHFILL_BUILD_K8S_SCRIPT", str(script))
    out = io.StringIO()
    console = Console(file=out, width=80, log_path=False)
    assert not console.is_terminal
    with pytest.raises(devcluster.BinariesUnavailableError, match="still missing"):  # the fake build builds nothing
        devcluster.ensure_binaries(console)
    printed = out.getvalue().splitlines()
    assert line in printed
    assert not any("go: noise" in p for p in printed)  # only the script's own progress lines
    assert printed[0].startswith("building etcd, ")
    assert printed[0].endswith(f"log: {devcluster.cache_root() / devcluster.K8S_VERSION / 'build.log'}")


def test_fake_gpu_node_advertises_gpus_and_gfd_labels() -> None:
    nodes = devcluster.desired_nodes(2, 4, cpu_nodes=1)
    assert [n["metadata"]["name"] for n in nodes] == ["gpu-node-0", "gpu-node-1", "cpu-node-0"]
    gpu, cpu = nodes[0], nodes[2]
    assert gpu["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert gpu["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert gpu["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert "nvidia.com/gpu" not in cpu["status"]["capacity"]
    assert "nvidia.com/gpu.present" not in cpu["metadata"]["labels"]
    ips = [a["address"] for n in nodes for a in n["status"]["addresses"] if a["type"] == "InternalIP"]
    assert len(set(ips)) == 3


def test_pki_chain_and_admin_identity(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    devcluster.make_pki(pki)
    for cert in ("apiserver.crt", "admin.crt"):
        r = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", cert], cwd=pki, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    subject = subprocess.run(["openssl", "x509", "-noout", "-subject", "-in", "admin.crt"], cwd=pki,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "O = system:masters" in subject
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", "apiserver.crt"], cwd=pki,
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "IP Address:127.0.0.1" in text
    assert oct((pki / "ca.key").stat().st_mode & 0o777) == "0o600"


def test_kubeconfig_round_trip_and_external_ca_file(tmp_path: Path) -> None:
    kc = devcluster.write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443", "Q0E=", "u", {"token": "t"})
    assert cluster_of(kc) == ("https://127.0.0.1:6443", "Q0E=", "batchfill-dev")
    assert oct(kc.stat().st_mode & 0o777) == "0o600"
    (tmp_path / "ca.crt").write_bytes(b"CA")
    doc = yaml.safe_load(kc.read_text())
    doc["clusters"][0]["cluster"] = {"server": "https://x", "certificate-authority": "ca.crt"}
    kc.write_text(yaml.safe_dump(doc))
    assert cluster_of(kc) == ("https://x", "Q0E=", "batchfill-dev")


def test_stop_kills_only_the_process_it_started(tmp_path: Path) -> None:
    sleeper = start_component("sleeper", ["/bin/sleep", "60"], tmp_path, die_with_parent=True)
    assert sleeper.alive()
    assert (tmp_path / "logs" / "sleeper.log").is_file()
    # A record whose start time differs is a reused PID: never signalled.
    impostor = Process.from_record({**sleeper.record(), "start_ticks": sleeper.start_ticks + 1})
    assert not impostor.alive()
    assert stop_components({"x": impostor}) == []
    assert sleeper.alive()
    # The record read back (as `down` reads cluster.json) is still this interpreter's child: stopped and reaped.
    assert stop_components({"sleeper": Process.from_record(sleeper.record())}) == []
    assert not sleeper.alive()
    assert not Path(f"/proc/{sleeper.pid}").exists()


def test_run_dir_safety(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(devcluster.DevClusterError, match="not a dev-cluster run directory"):
        devcluster.cluster_down(tmp_path, quiet=True)
    with pytest.raises(devcluster.DevClusterError, match="not empty"):
        devcluster.cluster_up(tmp_path, quiet=True, build=False)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
    devcluster.cluster_down(tmp_path / "never-created", quiet=True)  # nothing to do


def test_dev_cluster_main_exit_codes(tmp_path: Path) -> None:
    assert dev_cluster_main("sideways", run_dir=tmp_path) == 2
    assert dev_cluster_main("status", run_dir=tmp_path / "none") == 3
    assert dev_cluster_main("down", run_dir=tmp_path / "none") == 0


def test_command_is_runnable() -> None:
    r = subprocess.run([sys.executable, "-m", "batchfill.cli", "dev-cluster", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "up" in r.stdout
