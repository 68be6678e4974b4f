"""Unit tests of the dev cluster's parts that need no Kubernetes binaries (PKI, manifests, PIDs, the CLI entry)."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from batchfill.cli.dev_cluster import dev_cluster_main
from batchfill.testbed import devcluster, listeners
from batchfill.testbed.devcluster.binaries import VERSION_OF
from batchfill.testbed.devcluster.components import start_component, stop_components
from batchfill.testbed.devcluster.kubeconfig import cluster_of
from batchfill.testbed.devcluster.pod_block import STARTING_GRACE_S, pod_block, registry_dir, run_dir_seed
from batchfill.testbed.devcluster.state import ClusterState
from batchfill.testbed.listeners import (
    Listener,
    listener_verdict,
    listeners_on,
    parse_tcp_table,
    socket_inodes,
    tcp_listeners,
)
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
    nodes = devcluster.desired_nodes(2, 4, cpu_nodes=1, pod_block="127.9.0.0/16")
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
    assert [n["spec"]["podCIDR"] for n in nodes] == ["127.9.0.0/24", "127.9.1.0/24", "127.9.2.0/24"]
    assert [n["spec"]["podCIDRs"] for n in nodes] == [["127.9.0.0/24"], ["127.9.1.0/24"], ["127.9.2.0/24"]]


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


# --- each cluster's pod address block ----------------------------------------------------------------------


def test_pod_block_search_starts_at_the_seed_and_wraps() -> None:
    assert str(devcluster.choose_pod_block([], [], seed=0)) == "127.2.0.0/16"
    assert str(devcluster.choose_pod_block([], [], seed=252)) == "127.254.0.0/16"
    assert str(devcluster.choose_pod_block([], [], seed=253)) == "127.2.0.0/16"  # 253 octets: 2..254
    assert str(devcluster.choose_pod_block(["127.254.0.0/16"], [], seed=252)) == "127.2.0.0/16"
    a, b = run_dir_seed(Path("/run/a")), run_dir_seed(Path("/run/b"))
    assert a == run_dir_seed(Path("/run/a"))
    assert devcluster.choose_pod_block([], [], a) != devcluster.choose_pod_block([], [], b)


def test_pod_block_skips_claimed_blocks_and_blocks_with_listeners() -> None:
    taken = [ipaddress.IPv4Network("127.2.0.0/16"), "127.3.0.0/16"]
    listening = [
        "127.4.0.7",  # a tritonserver of another cluster's pod
        ipaddress.IPv6Address("::ffff:127.5.1.1"),  # gRPC listens on tcp6, IPv4-mapped
        "127.0.0.1",  # the host's own loopback: outside 2..254, blocks nothing
        "127.1.0.2",  # a cluster of a checkout older than per-cluster blocks: outside 2..254 too
        "0.0.0.0",
        "::",
        "10.0.0.1",
    ]
    assert str(devcluster.choose_pod_block(taken, listening, seed=0)) == "127.6.0.0/16"
    assert str(devcluster.choose_pod_block([], ["127.200.255.254"], seed=198)) == "127.201.0.0/16"


def test_pod_block_when_every_block_is_taken() -> None:
    everything = [pod_block(a) for a in range(2, 255)]
    with pytest.raises(devcluster.DevClusterError, match="no free pod address block"):
        devcluster.choose_pod_block(everything[1:], ["127.2.9.9"], seed=0)
    with pytest.raises(ValueError, match=re.escape("2..254")):
        pod_block(1)
    assert devcluster.node_pod_cidr("127.7.0.0/16", 255) == "127.7.255.0/24"
    with pytest.raises(ValueError, match=re.escape("0..255")):
        devcluster.node_pod_cidr("127.7.0.0/16", 256)
    with pytest.raises(ValueError, match="/16"):
        devcluster.node_pod_cidr("127.7.0.0/24", 0)


def test_parse_tcp_table_reads_listeners_of_both_families() -> None:
    if sys.byteorder != "little":
        pytest.skip("the sample table is as an x86 kernel prints it")
    tcp = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0200057F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4101 1 0 100 0\n"
        "   1: 0100007F:9AA3 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 4102 1 0 100 0\n"
        "   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4103 1 0 100 0\n"
    )
    tcp6 = (
        "  sl  local_address                         remote_address                        st tx_queue ...\n"
        "   0: 0000000000000000FFFF00000200057F:1F41 00000000000000000000000000000000:0000 0A 00000000:00000000"
        " 00:00000000 00000000     0        0 4104 1 0 100 0\n"
        "   1: 00000000000000000000000001000000:0277 00000000000000000000000000000000:0000 0A 00000000:00000000"
        " 00:00000000 00000000     0        0 4105 1 0 100 0\n"
    )
    assert parse_tcp_table(tcp) == [
        Listener(ipaddress.IPv4Address("127.5.0.2"), 8000, 4101),  # the ESTABLISHED line is no listener
        Listener(ipaddress.IPv4Address("0.0.0.0"), 22, 4103),
    ]
    assert parse_tcp_table(tcp6) == [
        Listener(ipaddress.IPv4Address("127.5.0.2"), 8001, 4104),
        Listener(ipaddress.IPv6Address("::1"), 631, 4105),
    ]


def test_tcp_listeners_see_a_listening_socket_and_its_owner() -> None:
    with socket.socket() as s:
        s.bind(("127.33.4.5", 0))
        s.listen()
        port = s.getsockname()[1]
        found = listeners_on(tcp_listeners(), "127.33.4.5", port)
        assert [lst.inode for lst in found] == [os.fstat(s.fileno()).st_ino]
        assert found[0].inode in socket_inodes(os.getpid())
        assert str(devcluster.choose_pod_block([], [lst.address for lst in tcp_listeners()], seed=31)) != (
            "127.33.0.0/16"
        )
    assert listeners_on(tcp_listeners(), "127.33.4.5", port) == []


@pytest.mark.parametrize("opens", ["before the table is read", "between the reads", "after the fds are read"])
def test_a_listener_the_server_opens_during_the_check_is_never_another_process(
    opens: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CI failure of 2026-12-01: tritonserver opened its metrics port while LocalTriton checked its
    listeners, and the check called it another process's. This process stands in for the server: it opens a
    real listening socket on the checked port at each point of the check."""
    host = "127.33.4.6"
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    opened: list[socket.socket] = []

    def open_listener(at: str) -> None:
        if at == opens and not opened:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen()
            opened.append(s)

    real_table, real_fds = listeners.tcp_listeners, listeners.socket_inodes

    def table() -> list[Listener]:
        open_listener("before the table is read")
        out = real_table()
        open_listener("between the reads")
        return out

    def fds(pid: int) -> set[int]:
        out = real_fds(pid)
        open_listener("after the fds are read")
        return out

    monkeypatch.setattr(listeners, "tcp_listeners", table)
    monkeypatch.setattr(listeners, "socket_inodes", fds)
    try:
        alone, foreign = listener_verdict(os.getpid(), host, [("metrics", port)])
        assert foreign == []
        assert alone == (opens == "before the table is read")
        assert len(opened) == 1
        # Once open, the next check sees it and calls it this process's.
        assert listener_verdict(os.getpid(), host, [("metrics", port)]) == (True, [])
    finally:
        for s in opened:
            s.close()


def test_a_listener_of_another_process_is_named() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import socket,sys,time; s=socket.socket(); s.bind(('127.33.4.7',0)); s.listen();"
         " print(s.getsockname()[1], flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        assert listener_verdict(os.getpid(), "127.33.4.7", [("metrics", port)]) == (
            False,
            [f"127.33.4.7:{port} (metrics)"],
        )
        assert listener_verdict(child.pid, "127.33.4.7", [("metrics", port)]) == (True, [])
    finally:
        child.kill()
        child.wait()


def _state(run_dir: Path, block: str, processes: dict[str, Process]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    ClusterState(server="https://127.0.0.1:1", kubeconfig="kc", bin_dir="bin", ports={}, processes=processes,
                 pod_block=block).save(run_dir)  # fmt: skip


def test_pod_block_claims_exclude_each_other_and_stale_ones_are_removed(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    seed_a = run_dir_seed(tmp_path / "a") % 253
    # A second run directory whose search starts where a's does: only a's claim keeps it off a's block.
    other = next(tmp_path / f"b{i}" for i in range(100_000) if run_dir_seed(tmp_path / f"b{i}") % 253 == seed_a)
    a = devcluster.claim_pod_block(tmp_path / "a", registry=reg, listening=[])
    b = devcluster.claim_pod_block(other, registry=reg, listening=[])
    assert a == pod_block(2 + seed_a)
    assert b == pod_block(2 + (seed_a + 1) % 253)
    assert devcluster.claimed_pod_blocks(reg) == {a: tmp_path / "a", b: other}
    # The same run directory started afresh drops its own earlier claim (and its seed gives it the same block).
    assert devcluster.claim_pod_block(tmp_path / "a", registry=reg, listening=[]) == a
    assert devcluster.claimed_pod_blocks(reg) == {a: tmp_path / "a", b: other}

    # Past the starting grace, a claim is live while its state records the block and a component runs.
    sleeper = start_component("etcd", ["/bin/sleep", "60"], tmp_path, die_with_parent=True)
    _state(tmp_path / "a", str(a), {"etcd": sleeper})
    _state(other, str(b), {"etcd": sleeper})
    old = time.time() - STARTING_GRACE_S - 1
    for block, run in ((a, tmp_path / "a"), (b, other)):
        (reg / f"{block.network_address}.json").write_text(json.dumps({"run_dir": str(run), "claimed_at": old}))
    assert set(devcluster.claimed_pod_blocks(reg)) == {a, b}
    _state(other, str(a), {"etcd": sleeper})
    assert set(devcluster.claimed_pod_blocks(reg)) == {a}  # b's run dir now records another block
    assert not (reg / f"{b.network_address}.json").exists()
    stop_components({"etcd": sleeper})
    assert devcluster.claimed_pod_blocks(reg) == {}  # its cluster is gone
    (reg / "127.50.0.0.json").write_text("not json")
    assert devcluster.claimed_pod_blocks(reg) == {}
    assert not (reg / "127.50.0.0.json").exists()


def test_pod_block_claim_skips_listeners_and_release_removes_only_its_own(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    run = tmp_path / "a"
    free = devcluster.choose_pod_block([], [], run_dir_seed(run))
    nxt = devcluster.choose_pod_block([free], [], run_dir_seed(run))
    assert devcluster.claim_pod_block(run, registry=reg, listening=[f"{free.network_address + 9}"]) == nxt
    devcluster.release_pod_block(tmp_path / "other", nxt, registry=reg)
    assert devcluster.claimed_pod_blocks(reg) == {nxt: run}
    devcluster.release_pod_block(run, nxt, registry=reg)
    assert devcluster.claimed_pod_blocks(reg) == {}
    devcluster.release_pod_block(run, nxt, registry=tmp_path / "never-made")  # nothing to do


def test_fake_nodes_without_a_block_get_one_no_cluster_claimed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    reg = registry_dir()
    assert reg == tmp_path / "batchfill" / "pod-blocks"
    reg.mkdir(parents=True)
    (reg / "127.2.0.0.json").write_text(json.dumps({"run_dir": str(tmp_path / "run"), "claimed_at": time.time()}))
    monkeypatch.setattr(os, "getpid", lambda: 0)  # the seed of nodes added to an existing cluster: from 127.2 on
    cidrs = [n["spec"]["podCIDR"] for n in devcluster.desired_nodes(1, 4, cpu_nodes=1)]
    block = ipaddress.IPv4Network(cidrs[0]).supernet(new_prefix=16)
    assert block != pod_block(2)
    assert cidrs == [devcluster.node_pod_cidr(block, 0), devcluster.node_pod_cidr(block, 1)]
    assert set(devcluster.claimed_pod_blocks(reg)) == {pod_block(2)}  # choosing claimed nothing


def test_cluster_state_keeps_the_pod_block(tmp_path: Path) -> None:
    _state(tmp_path, "127.42.0.0/16", {})
    state = ClusterState.load(tmp_path)
    assert state is not None
    assert state.pod_block == "127.42.0.0/16"
    assert state.info(tmp_path).pod_block == "127.42.0.0/16"
    doc = json.loads((tmp_path / "cluster.json").read_text())
    del doc["pod_block"]  # the state of a cluster started before clusters chose their blocks
    (tmp_path / "cluster.json").write_text(json.dumps(doc))
    legacy = ClusterState.load(tmp_path)
    assert legacy is not None
    assert legacy.pod_block == ""


def test_real_node_gpus_reach_cluster_up_and_a_negative_count_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dev-cluster up --real-node-gpus K`` is cluster_up's ``real_node_gpus`` (default 4); K < 0 fails before
    anything starts."""
    from batchfill.cli.main import main

    seen: list[dict[str, object]] = []

    def fake_up(*args: object, **kwargs: object) -> None:
        seen.append(kwargs)
        raise devcluster.DevClusterError("stop here")

    monkeypatch.setattr(devcluster, "cluster_up", fake_up)
    run = str(tmp_path / "run")
    assert main(["dev-cluster", "up", "--run-dir", run, "--real-nodes", "1", "--real-node-gpus", "2"]) == 1
    assert main(["dev-cluster", "up", "--run-dir", run, "--real-nodes", "1"]) == 1
    assert [(k["real_nodes"], k["real_node_gpus"]) for k in seen] == [(1, 2), (1, 4)]
    monkeypatch.undo()
    with pytest.raises(devcluster.DevClusterError, match="real_node_gpus must be >= 0"):
        devcluster.cluster_up(tmp_path / "run", 0, 0, real_nodes=1, real_node_gpus=-1, quiet=True)
    assert not (tmp_path / "run").exists()
