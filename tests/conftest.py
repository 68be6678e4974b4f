"""Suite-wide ordering: latency-sensitive tests first, the real Kubernetes control plane last.

The cluster fixture lives for the whole session once started (etcd, kube-apiserver, controllers and kwok keep
running), and on a 2-core machine that background load would disturb the real-Triton latency measurements of
the component tests. So cluster tests run after everything else.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)  # stable: keeps order within
