"""Fixtures of the cluster tests: a real Kubernetes API server, scheduler and controller-manager.

By default the session starts the local dev cluster (``batchfill.testbed.devcluster``: etcd, kube-apiserver,
kube-scheduler, kube-controller-manager and kwok as processes on 127.0.0.1, with 2 fake GPU nodes of 4
``nvidia.com/gpu`` each) in a temporary run directory and stops it at the end. Its binaries are built from Go
modules by ``scripts/build-k8s.sh`` when missing (~9 min cold on 2 cores; cached in ``~/.cache/batchfill/k8s``). The
build runs once, at collection time, only when cluster tests are selected, so it is outside the per-test
timeout. When the binaries can't be built, the tests fail under CI (``CI`` set) and skip elsewhere.

``BATCHFILL_USE_EXISTING_CLUSTER=1`` (like envtest's ``USE_EXISTING_CLUSTER``) runs the same tests against the
cluster named by ``KUBECONFIG`` (first file of the list; default ``~/.kube/config``), e.g. one made by
``kind create cluster``. The tests then create and delete their own namespaces only, and need nodes that
advertise ``nvidia.com/gpu`` for the GPU tests (on kind: patch the node status; see the README).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from batchfill.testbed import devcluster, gpu_plugin

from .support import Kube, skip_or_fail

USE_EXISTING = os.environ.get("BATCHFILL_USE_EXISTING_CLUSTER", "").strip().lower() in ("1", "true", "yes")
BUILD_ERROR = pytest.StashKey[str]()
GPU_NODES = 2
GPUS_PER_NODE = 4


def pytest_configure(config: pytest.Config) -> None:
    # Also to be declared in pyproject's [tool.pytest.ini_options] markers; registering here keeps
    # --strict-markers happy either way.
    config.addinivalue_line("markers", "cluster: needs a real Kubernetes control plane (local dev cluster or existing)")


@pytest.hookimpl(trylast=True)  # after -m/-k deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build the control-plane binaries (and for real nodes the kubelet and the fake-GPU device plugin) before any
    test runs (not inside a test's timeout) when needed."""
    if USE_EXISTING or not any(item.get_closest_marker("cluster") for item in items):
        return
    # The kubelet only for the real-node tests (their modules set NEEDS_KUBELET).
    kubelet = any(getattr(getattr(item, "module", None), "NEEDS_KUBELET", False) for item in items)
    missing = devcluster.missing_binaries(kubelet=kubelet)
    if not missing and not kubelet:
        return
    tr = config.pluginmanager.get_plugin("terminalreporter")
    log = devcluster.cache_root() / devcluster.K8S_VERSION / "build.log"

    def progress(line: str) -> None:
        if tr is not None:
            tr.write_line(f"cluster tests: {line}")

    try:
        path = devcluster.ensure_binaries(
            Console(stderr=True, quiet=True), log_path=log, progress=progress, kubelet=kubelet
        )
        if kubelet:  # the real nodes' fake-GPU device plugin: its --check is instant, a build seconds warm
            gpu_plugin.ensure_fake_gpu_plugin(Console(stderr=True, quiet=True), progress=progress)
    except devcluster.BinariesUnavailableError as e:
        config.stash[BUILD_ERROR] = str(e)
        if tr is not None:
            tr.write_line(f"cluster tests: build failed: {str(e).splitlines()[0]}")
        return
    if tr is not None:
        tr.write_line(f"cluster tests: binaries ready in {path}")


def _existing_kubeconfig() -> Path:
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), "")
    return Path(first) if first else Path.home() / ".kube" / "config"


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """The cluster under test (see the module docstring)."""
    if USE_EXISTING:
        kc = _existing_kubeconfig()
        if not kc.is_file():
            pytest.fail(f"BATCHFILL_USE_EXISTING_CLUSTER=1 but the kubeconfig {kc} does not exist", pytrace=False)
        k = Kube(kubeconfig=kc, existing=True)
        try:
            from kubernetes import client

            client.VersionApi(k.api).get_code()
        except Exception as e:
            pytest.fail(f"BATCHFILL_USE_EXISTING_CLUSTER=1 but the cluster of {kc} is unreachable: {e}", pytrace=False)
        yield k
        k.close()
        return

    error = request.config.stash.get(BUILD_ERROR, None)
    if error is None and devcluster.missing_binaries():
        try:  # e.g. only unmarked tests were selected at collection but this fixture was still requested
            devcluster.ensure_binaries(Console(stderr=True, quiet=True))
        except devcluster.BinariesUnavailableError as e:
            error = str(e)
    if error is not None:
        skip_or_fail(f"the local Kubernetes control plane could not be built: {error}")

    run_dir = tmp_path_factory.mktemp("devcluster")
    # die_with_parent: the components get SIGTERM if this pytest process dies without running the teardown.
    info = devcluster.cluster_up(run_dir, GPU_NODES, GPUS_PER_NODE, die_with_parent=True, build=False)
    k = Kube(kubeconfig=info.kubeconfig, existing=False, info=info)
    try:
        yield k
    finally:
        k.close()
        devcluster.cluster_down(run_dir, quiet=True)
        survivors = [f"{n}({pid})" for n, pid in info.pids.items() if Path(f"/proc/{pid}").exists()]
        assert not survivors, f"dev-cluster processes survived cluster_down: {survivors}"
        assert not run_dir.exists(), f"cluster_down left {run_dir}"
