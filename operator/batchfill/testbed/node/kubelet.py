"""A real node's kubelet: its KubeletConfiguration, client certificate and kubeconfig, and command line.

The kubelet runs inside the node's network namespace (:mod:`.netns`), serves on the node IP, and reaches the API
server through the forwarder on that namespace's ``127.0.0.1`` (:mod:`.apiproxy`). Its identity is a client
certificate of the cluster CA for ``system:node:<name>`` in ``system:nodes`` (what the Node authorizer and the
NodeRestriction admission plugin expect); it authenticates its own clients (the API server's kubelet client
certificate, bearer tokens through TokenReview) and authorizes them with SubjectAccessReview (webhook mode).

Fields, per https://kubernetes.io/docs/reference/config-api/kubelet-config.v1beta1/: cgroup v1 on these machines
(``failCgroupV1: false``, the cgroupfs driver, the node's own ``cgroupRoot``); ``protectKernelDefaults: true`` so
the kubelet never changes a kernel sysctl (it would set ``vm.overcommit_memory``, ``kernel.panic``,
``kernel.panic_on_oops`` and the ``kernel.keys`` limits otherwise); eviction thresholds near zero and image
garbage collection off (small disks); no read-only port; the node status computed every 2 s, so a device plugin's
devices show in ``status.allocatable`` soon after it registers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from batchfill.testbed.node.plan import KUBELET_HEALTHZ_PORT, KUBELET_PORT, REAL_NODE_LABEL, NodePlan

CGROUP_DRIVER = "cgroupfs"


def kubelet_config(plan: NodePlan, root_dir: Path, client_ca: Path, runtime_socket: Path) -> dict[str, Any]:
    """The node's KubeletConfiguration (``root_dir``: the kubelet's ``--root-dir``; ``runtime_socket``:
    containerd's socket; ``client_ca``: the cluster CA its clients' certificates are checked against)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": plan.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True, "cacheTTL": "10s"},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": CGROUP_DRIVER,
        "cgroupRoot": plan.cgroup_root,
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "failSwapOn": False,
        "enforceNodeAllocatable": [],
        "protectKernelDefaults": True,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "podCIDR": plan.pod_cidr,
        "podLogsDir": str(root_dir.parent / "pod-logs"),
        "volumePluginDir": str(root_dir / "volume-plugins"),
        "resolvConf": "",
        "registerNode": True,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "maxPods": 110,
        # How often the kubelet computes its node status (default 10 s) and posts it when it changed: the GPUs a
        # device plugin registers reach status.allocatable within this, at up, after a kubelet restart.
        "nodeStatusUpdateFrequency": "2s",
    }


def write_kubelet_config(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def node_subject(name: str) -> str:
    """The certificate subject of node ``name``'s kubelet (``/O=system:nodes/CN=system:node:<name>``)."""
    return f"/O=system:nodes/CN=system:node:{name}"


def command(
    kubelet: Path,
    plan: NodePlan,
    config: Path,
    kubeconfig: Path,
    root_dir: Path,
    cert_dir: Path,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """The kubelet's command line (flags that have no KubeletConfiguration field). The node registers with the
    label ``batchfill.dev/node=real`` and ``labels`` (the GPU labels of a node with fake GPUs: outside the
    ``kubernetes.io`` prefixes the NodeRestriction admission plugin keeps from kubelets, or in its allowed ones)."""
    node_labels = {REAL_NODE_LABEL: "real", **(labels or {})}
    return [
        str(kubelet), f"--config={config}", f"--kubeconfig={kubeconfig}", f"--root-dir={root_dir}",
        f"--cert-dir={cert_dir}", f"--node-ip={plan.node_ip}", f"--hostname-override={plan.name}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in node_labels.items()),
    ]  # fmt: skip
