"""A real local Kubernetes control plane on 127.0.0.1 for the cluster tests and the demo (no Docker, no kind).

``cluster_up`` starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok, each as a plain
process with its own PID recorded in the run directory (:mod:`.components` says how each is configured), then
creates ``gpu_nodes`` fake GPU nodes (``nvidia.com/gpu`` capacity, GPU-feature-discovery style labels) and waits
until they are Ready and schedulable (:mod:`.nodes`). Pods bound to them become Running without a process (kwok),
with IP addresses in the cluster's own loopback block ``127.<a>.0.0/16`` (``ClusterInfo.pod_block``), which no
other dev cluster on the machine has (:mod:`.pod_block`).

The binaries come from ``scripts/build-k8s.sh`` (built from Go modules through the module proxy) in
``${BATCHFILL_K8S_CACHE:-~/.cache/batchfill/k8s}/<k8s version>/bin``; :func:`ensure_binaries` runs it when
one is missing (:mod:`.binaries`). Every component authenticates with an admin client certificate
(``O=system:masters``, :mod:`.pki`); the operator should not: :func:`service_account_kubeconfig` writes a token
kubeconfig for a ServiceAccount (:mod:`.kubeconfig`). The run directory and its state file: :mod:`.state`.

Modules: ``binaries`` (versions, cache, build), ``pki`` (openssl), ``kubeconfig`` (kubeconfigs, clients,
kubectl), ``components`` (command lines, start, staged stop), ``nodes`` (fake nodes), ``pod_block`` (each
cluster's pod address block), ``state`` (run directory, ``cluster.json``), ``cluster`` (up, down, status,
restart). The names below are the package's API.
"""

from batchfill.testbed.devcluster.binaries import (
    BINARIES,
    ETCD_VERSION,
    K8S_VERSION,
    KWOK_VERSION,
    SOURCE_ROOT,
    BinariesUnavailableError,
    DevClusterError,
    bin_dir,
    build_script,
    cache_root,
    ensure_binaries,
    kubectl_path,
    kwok_stages_dir,
    missing_binaries,
)
from batchfill.testbed.devcluster.cluster import (
    cluster_down,
    cluster_status,
    cluster_up,
    restart_components,
    running_cluster,
)
from batchfill.testbed.devcluster.components import COMPONENTS, POD_CIDR, SERVICE_CIDR, STOP_TIMEOUT_S
from batchfill.testbed.devcluster.kubeconfig import (
    api_client,
    kubectl,
    service_account_kubeconfig,
    service_account_token,
    write_kubeconfig,
)
from batchfill.testbed.devcluster.nodes import (
    FAKE_NODE_LABEL,
    GPU_PRODUCT,
    GPU_RESOURCE,
    NODE_IP_PREFIX,
    desired_nodes,
    ensure_fake_nodes,
    fake_node,
)
from batchfill.testbed.devcluster.pki import make_pki
from batchfill.testbed.devcluster.pod_block import (
    choose_pod_block,
    claim_pod_block,
    claimed_pod_blocks,
    node_pod_cidr,
    release_pod_block,
)
from batchfill.testbed.devcluster.state import KUBECONFIG_NAME, MARKER, STATE_FILE, ClusterInfo, default_run_dir

__all__ = [
    "BINARIES",
    "COMPONENTS",
    "ETCD_VERSION",
    "FAKE_NODE_LABEL",
    "GPU_PRODUCT",
    "GPU_RESOURCE",
    "K8S_VERSION",
    "KUBECONFIG_NAME",
    "KWOK_VERSION",
    "MARKER",
    "NODE_IP_PREFIX",
    "POD_CIDR",
    "SERVICE_CIDR",
    "SOURCE_ROOT",
    "STATE_FILE",
    "STOP_TIMEOUT_S",
    "BinariesUnavailableError",
    "ClusterInfo",
    "DevClusterError",
    "api_client",
    "bin_dir",
    "build_script",
    "cache_root",
    "choose_pod_block",
    "claim_pod_block",
    "claimed_pod_blocks",
    "cluster_down",
    "cluster_status",
    "cluster_up",
    "default_run_dir",
    "desired_nodes",
    "ensure_binaries",
    "ensure_fake_nodes",
    "fake_node",
    "kubectl",
    "kubectl_path",
    "kwok_stages_dir",
    "make_pki",
    "missing_binaries",
    "node_pod_cidr",
    "release_pod_block",
    "restart_components",
    "running_cluster",
    "service_account_kubeconfig",
    "service_account_token",
    "write_kubeconfig",
]
