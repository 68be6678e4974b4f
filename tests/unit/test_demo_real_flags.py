"""`batchfill demo --real-nodes`: the flag's checks that need no cluster, and the stop bound it prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from batchfill.cli import demo
from batchfill.cli.demo import real
from batchfill.cli.demo.results import DemoError
from batchfill.cli.main import main
from batchfill.cli.shutdown import Shutdown


def test_real_nodes_with_an_existing_cluster_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", "--real-nodes", "--kubeconfig", str(tmp_path / "kubeconfig")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["--real-nodes starts its own cluster: it cannot be combined with --kubeconfig"]


def test_a_run_directory_too_deep_for_containerd_sockets_is_refused_before_anything_starts(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    console = Console(file=open("/dev/null", "w"))  # noqa: SIM115 - closed with the test process
    with Shutdown(console) as shutdown, pytest.raises(DemoError, match="too deep for the node's sockets"):
        real.real_cluster(deep, shutdown, console)
    assert not deep.exists()


def test_the_real_node_stop_bound_counts_prometheus_instead_of_tritonservers() -> None:
    kwok = demo.stop_timeout_s()
    real_nodes = demo.stop_timeout_s(real_nodes=True)
    assert real_nodes - kwok == pytest.approx(real.PROMETHEUS_STOP_S - demo.triton_stop_timeout_s())
