"""Real nodes of the dev cluster: a kubelet and containerd per node, each node in its own network namespace.

``cluster_up(..., real_nodes=N)`` (``batchfill dev-cluster up --real-nodes N``) adds nodes ``real-node-<i>``
labelled ``batchfill.dev/node=real`` that run real containers, each with ``real_node_gpus`` fake ``nvidia.com/gpu``
advertised to its kubelet by the fake-GPU device plugin (:mod:`batchfill.testbed.gpu_plugin`); ``cluster_down``
removes everything they made and reports what it could not (:func:`leftovers`). :func:`real_nodes` reads them back
from a run directory (``RealNode.device_plugin_dir`` is where a device plugin registers with the node's kubelet),
:func:`import_image` puts an image archive into a node's containerd and :func:`restart_kubelet` restarts a node's
kubelet.

Every connection stays on loopback or inside namespaces the test bed made: node ``i`` has the address
``10.<a>.0.<4i+2>`` in its own namespace ``bf-<a>-<i>``, reached through a veth pair from the root namespace, its
pods ``10.<a>.<i+1>.0/24`` behind it (``127.<a>.0.0/16`` is the cluster's pod block, :mod:`.plan`), and its
kubelet reaches the API server (root namespace, 127.0.0.1) through a forwarder listening on the node namespace's
127.0.0.1 (:mod:`.apiproxy`). No sysctl of the machine changes: the kubelet and containerd run in mount
namespaces of their own with private views of a few fixed paths (:mod:`.mountns`).

Modules: ``plan`` (names and addresses, pure), ``netns`` (namespace, veth, route, setns), ``apiproxy`` (the
forwarder), ``containerd``, ``kubelet``, ``cni`` (configs and command lines), ``images`` (the busybox pause
image), ``cgroups`` (the kubelet's cgroup root), ``mountns`` (private views of fixed paths), ``record`` (what
``cluster.json`` keeps), ``lifecycle`` (start, wait Ready), ``cleanup`` (teardown, leftovers).
"""

from batchfill.testbed.node.cleanup import leftovers, teardown, teardown_all
from batchfill.testbed.node.lifecycle import (
    RealNodeError,
    gpus_allocatable,
    import_image,
    real_nodes,
    restart_kubelet,
    start_real_nodes,
)
from batchfill.testbed.node.plan import REAL_NODE_LABEL, NodePlan, plan_node, plan_nodes
from batchfill.testbed.node.record import RealNode, RealNodes

__all__ = [
    "REAL_NODE_LABEL",
    "NodePlan",
    "RealNode",
    "RealNodeError",
    "RealNodes",
    "gpus_allocatable",
    "import_image",
    "leftovers",
    "plan_node",
    "plan_nodes",
    "real_nodes",
    "restart_kubelet",
    "start_real_nodes",
    "teardown",
    "teardown_all",
]
