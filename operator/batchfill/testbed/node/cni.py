"""The CNI network of a real node: a ``bridge`` (the node's own bridge, the pods' gateway, no masquerading)
with ``host-local`` addresses from the node's pod CIDR and one route, to the cluster's private block ``10.<a>.0.0/16``
through the bridge (so replies reach the root namespace's end of the node's link), then ``portmap`` and
``loopback``; plugins from the
Debian package containernetworking-plugins (``/usr/lib/cni``). See https://www.cni.dev/plugins/current/main/bridge/
for the fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchfill.testbed.node.plan import NodePlan

CNI_BIN_DIR = "/usr/lib/cni"
CNI_VERSION = "1.0.0"


def conflist(plan: NodePlan, ipam_dir: Path) -> dict[str, Any]:
    """The node's network configuration list (``ipam_dir``: host-local's lease directory, under the run dir)."""
    return {
        "cniVersion": CNI_VERSION,
        "name": f"batchfill-{plan.octet}-{plan.index}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": plan.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": plan.pod_cidr, "gateway": plan.gateway_ip}]],
                    # Only the cluster's private block (the root namespace's end of the node's link is in it):
                    # no default route, so a pod reaches nothing outside the test bed's namespaces.
                    "routes": [{"dst": plan.private_block}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }


def write_conflist(plan: NodePlan, conf_dir: Path, ipam_dir: Path) -> Path:
    """Write :func:`conflist` as ``conf_dir/10-<name>.conflist``; returns its path."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    path = conf_dir / f"10-{plan.name}.conflist"
    path.write_text(json.dumps(conflist(plan, ipam_dir), indent=2) + "\n")
    return path
