"""Suite-wide ordering: latency-sensitive tests first, the real Kubernetes control plane last.

The cluster fixture lives for the whole session once started (etcd, kube-apiserver, controllers and kwok keep
running), and on a 2-core machine that background load would disturb the real-Triton latency measurements of
the component tests. So cluster tests run after everything else.
"""

from __future__ import annotations

import signal
import threading
import warnings
from collections.abc import Iterator

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)  # stable: keeps order within


@pytest.fixture(autouse=True)
def _sigpipe_stays_ignored() -> Iterator[None]:
    # Python ignores SIGPIPE, so a write to a closed socket raises instead of ending the process. A test that
    # leaves it at the default (as `batchfill`'s console entry point sets it) would let the next proxy or
    # client that writes to a peer gone away kill the whole pytest run: CI once died so, mid-cluster tests.
    yield
    if hasattr(signal, "SIGPIPE") and signal.getsignal(signal.SIGPIPE) != signal.SIG_IGN:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        pytest.fail("this test left SIGPIPE at its default disposition; the rest of the run would die on one")


@pytest.fixture(autouse=True, scope="module")
def _threads_left_behind() -> Iterator[None]:
    """Warn about threads a module started and left running. The whole suite is one pytest process, so a leftover
    thread (a load generator, a watcher, a proxy) takes the GIL from the load generators of every later module:
    their client latency grows while the server's does not (tests/cluster/test_shared_pool.py prints the threads
    it starts with)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    if left:
        warnings.warn(f"threads left running after the module: {sorted(left)}", stacklevel=1)
