"""How a Triton Deployment rolls when the cluster has no free GPU for a surge pod (pure).

The rendered strategy is ``maxSurge: 1, maxUnavailable: 0``: a new pod loads the model before an old one goes, so
capacity never drops during a rollout. That needs one free GPU. On a GPU-tight cluster the surge pod stays Pending
(``Insufficient nvidia.com/gpu``) and the rollout never finishes: the new config is never served, and every scale
decision meanwhile sees a Pending replica. So once a model's pod has been unschedulable for want of GPUs for
:data:`SURGE_BLOCKED_AFTER_S` during a rollout, the operator rolls *in place* (``maxSurge: 0, maxUnavailable: 1``:
one old pod goes, its GPU takes the new one), and restores the surge strategy when the rollout is complete.

The trade-off: rolling in place serves one replica fewer for one model load per replica; with one replica, the model
is down for one model load. Waiting for a GPU instead could wait forever. Strategy fields:
https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#rolling-update-deployment
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from batchfill.api.validate import GPU_RESOURCE
from batchfill.policy.conditions import parse_rfc3339

#: How long a pod must have been unschedulable for GPUs before a rollout goes in place (s): a GPU freed by another
#: model's scale-in within this time still gives a surge.
SURGE_BLOCKED_AFTER_S = 30.0


def rolls_in_place(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment's strategy is the in-place one (``maxSurge`` 0)."""
    rolling = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    return str(rolling.get("maxSurge", "")) in ("0", "0%")


def rollout_in_progress(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment controller is still replacing pods of an older template (its ``status``): it has not
    seen the newest spec yet, fewer pods than wanted run the newest template, or pods of an older one remain.

    A scale-out whose new pods are Pending is no rollout: they run the newest template already.
    """
    meta, spec, status = (deployment.get(k) or {} for k in ("metadata", "spec", "status"))
    updated = int(status.get("updatedReplicas") or 0)
    return (
        int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0)
        or updated < int(spec.get("replicas") or 0)
        or int(status.get("replicas") or 0) > updated
    )


def gpu_blocked_since(pods: Sequence[Mapping[str, Any]], resource: str = GPU_RESOURCE) -> float | None:
    """When the longest-unschedulable pod (not terminating) became unschedulable for want of GPUs (epoch s), or None.

    The scheduler's message names the resource: ``0/4 nodes are available: 4 Insufficient nvidia.com/gpu.``;
    ``resource`` is the pods' GPU (spec.triton.gpuResource: a MIG slice's name there).
    """
    since: float | None = None
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        for c in (pod.get("status") or {}).get("conditions") or []:
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and f"Insufficient {resource}" in str(c.get("message") or "")
            ):
                t = parse_rfc3339(c.get("lastTransitionTime"))
                if t is not None and (since is None or t < since):
                    since = t
    return since


def in_place_reason(
    deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: float, resource: str = GPU_RESOURCE
) -> str:
    """Why the Deployment should now switch from surge to in place (empty: it should not); ``resource``: the GPU."""
    if rolls_in_place(deployment) or not rollout_in_progress(deployment):
        return ""
    since = gpu_blocked_since(pods, resource)
    if since is None or now - since < SURGE_BLOCKED_AFTER_S:
        return ""
    return (
        f"no free {resource} for a surge pod for {now - since:.0f} s: rolling in place, one replica at a time "
        "(one replica fewer while each new pod loads the model)"
    )


def keeps_rolling_in_place(deployment: Mapping[str, Any] | None) -> bool:
    """Whether an in-place rollout is still under way (render the in-place strategy again); once it is complete the
    surge strategy comes back."""
    return deployment is not None and rolls_in_place(deployment) and rollout_in_progress(deployment)
