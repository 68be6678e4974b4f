"""The address and name plan of a dev cluster's real nodes (pure: no I/O).

A cluster whose pods' loopback block is ``127.<a>.0.0/16`` (:mod:`batchfill.testbed.devcluster.pod_block`, unique
among the machine's live dev clusters) gives its real nodes the private block ``10.<a>.0.0/16``:

* node ``i``'s link is the ``i``-th /30 of ``10.<a>.0.0/24``: the host end of its veth pair (root network
  namespace) has ``10.<a>.0.<4i+1>``, the node end (in the node's own namespace) ``10.<a>.0.<4i+2>``, the node IP;
* node ``i``'s pod CIDR is ``10.<a>.<i+1>.0/24``, behind the node IP (a root-namespace route
  ``10.<a>.<i+1>.0/24 via <node IP>``), its CNI bridge's gateway the first address of it.

Every name that lives in a machine-wide table carries the cluster's octet ``a`` and the node index, so two
clusters never collide: the network namespace ``bf-<a>-<i>``, the host veth ``bf<a>n<i>h`` (at most 15
characters, the kernel's interface name limit), the cgroup root ``/batchfill-<a>-<i>``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

#: The most real nodes a cluster may have: node ``i``'s /30 must fit in ``10.<a>.0.0/24`` and its pod CIDR is
#: ``10.<a>.<i+1>.0/24``.
MAX_REAL_NODES = 64
#: Ports inside the node's own network namespace (nothing else listens there, so they are fixed).
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
APISERVER_PROXY_PORT = 6443
#: The label every real node carries (value ``real``), so tests and pods can target it.
REAL_NODE_LABEL = "batchfill.dev/node"


class AddressPlanError(ValueError):
    """The real nodes' addresses cannot be planned (bad octet or count) or overlap the machine's networks."""


@dataclass(frozen=True)
class NodePlan:
    """Names and addresses of real node ``index`` of the cluster with pod block octet ``octet``.

    Addresses are dotted-quad strings; ``*_cidr`` and ``link`` are networks, ``host_ip``/``node_ip`` carry no
    prefix (the link's prefix is ``/30``).
    """

    octet: int
    index: int
    name: str
    netns: str
    veth_host: str
    veth_node: str
    bridge: str
    link: str
    host_ip: str
    node_ip: str
    pod_cidr: str
    gateway_ip: str
    cgroup_root: str

    @property
    def private_block(self) -> str:
        return f"10.{self.octet}.0.0/16"

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> NodePlan:
        return cls(**record)


def node_name(index: int) -> str:
    return f"real-node-{index}"


def plan_node(octet: int, index: int) -> NodePlan:
    """The plan of node ``index`` (0 .. :data:`MAX_REAL_NODES` - 1) for pod block octet ``octet`` (2..254).

    Raises :class:`AddressPlanError` outside those ranges.
    """
    if not 2 <= octet <= 254:
        raise AddressPlanError(f"the pod block's second octet must be in 2..254, got {octet}")
    if not 0 <= index < MAX_REAL_NODES:
        raise AddressPlanError(f"real node index must be in 0..{MAX_REAL_NODES - 1}, got {index}")
    base = 4 * index
    return NodePlan(
        octet=octet,
        index=index,
        name=node_name(index),
        netns=f"bf-{octet}-{index}",
        veth_host=f"bf{octet}n{index}h",
        # The node end is renamed inside the node's namespace, where no other interface can clash.
        veth_node="eth0",
        bridge="bf-cni0",
        link=f"10.{octet}.0.{base}/30",
        host_ip=f"10.{octet}.0.{base + 1}",
        node_ip=f"10.{octet}.0.{base + 2}",
        pod_cidr=f"10.{octet}.{index + 1}.0/24",
        gateway_ip=f"10.{octet}.{index + 1}.1",
        cgroup_root=f"/batchfill-{octet}-{index}",
    )


def plan_nodes(pod_block: str, count: int) -> list[NodePlan]:
    """Plans of ``count`` real nodes of the cluster whose pod block is ``pod_block`` (``127.<a>.0.0/16``).

    Raises :class:`AddressPlanError` for a block that is not such a /16 or a count above :data:`MAX_REAL_NODES`.
    """
    net = ipaddress.IPv4Network(pod_block)
    if net.prefixlen != 16 or net.network_address.packed[0] != 127:
        raise AddressPlanError(f"real nodes need a pod block 127.<a>.0.0/16, got {pod_block}")
    if not 0 <= count <= MAX_REAL_NODES:
        raise AddressPlanError(f"at most {MAX_REAL_NODES} real nodes, asked for {count}")
    return [plan_node(net.network_address.packed[1], i) for i in range(count)]


def overlaps(plans: Iterable[NodePlan], machine_networks: Iterable[str]) -> list[str]:
    """The machine's networks (``ip route`` destinations and interface addresses with their prefixes, e.g.
    ``192.0.2.0/24``; ``default`` is ignored) that overlap a plan's private block, as ``"<network> overlaps
    <block>"`` lines."""
    blocks = {ipaddress.IPv4Network(p.private_block) for p in plans}
    out = []
    for raw in machine_networks:
        if raw in ("default", "") or ":" in raw:
            continue
        net = ipaddress.IPv4Network(raw, strict=False)
        out += [f"{net} overlaps {b}" for b in sorted(blocks) if net.overlaps(b) and net.prefixlen > 0]
    return out
