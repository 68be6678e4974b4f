"""What a BatchedModel's pods say about its capacity (pure): Ready, starting, unschedulable, or failing, from pod
statuses as the API server returns them (the loops' caches keep these fields: adapters.informer.POD_FIELDS)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PodCounts:
    """The BatchedModel's pods now: names of the Ready ones, others starting, unschedulable ones, and failing ones
    (``failing``: ``"<pod>: <reason>"`` each, sorted by pod name)."""

    ready: frozenset[str]
    starting: int
    pending: int
    pending_reason: str
    failing: tuple[str, ...] = ()


#: Container waiting reasons the kubelet sets for a container that will not start by waiting
#: (kubernetes/pkg/kubelet/images/types.go, kubernetes/pkg/kubelet/container/sync_result.go).
FAILING_WAITING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def _container_failure(c: Mapping[str, Any], init: bool) -> str:
    """Why one container status (``status.containerStatuses[i]``) will not become Ready by waiting ("": it may)."""
    name = f"init container {c.get('name')}" if init else str(c.get("name"))
    state = c.get("state") or {}
    last = (c.get("lastState") or {}).get("terminated") or {}
    restarts = int(c.get("restartCount") or 0)
    waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
    if waiting.get("reason") in FAILING_WAITING_REASONS:
        if last:
            how = f"{last.get('reason') or 'exited'} with exit code {last.get('exitCode')}"
            return f"{waiting['reason']} ({name}: {how}, {restarts} restarts)"
        return f"{waiting['reason']} ({name}: {str(waiting.get('message') or '')[:200]})"
    if terminated and terminated.get("exitCode") not in (None, 0):
        return f"{terminated.get('reason') or 'Error'} ({name} exited with exit code {terminated['exitCode']})"
    return ""


def pod_failure(pod: Mapping[str, Any]) -> str:
    """Why a scheduled, not Ready pod will not become Ready by waiting, from its status as the kubelet writes it
    ("": it may still): phase Failed (e.g. Evicted), an init or main container crash-looping, exited with an
    error, or unable to start (image, config). A failing model load is one of these: tritonserver exits when a
    model of the repository fails to load (``--exit-on-error``, on by default), and the kubelet restarts it."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return f"{status.get('reason') or 'Failed'}: {str(status.get('message') or '')[:200]}".rstrip(": ")
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for c in status.get(key) or []:
            why = _container_failure(c, init)
            if why:
                return why
    return ""


def pod_counts(pods: Sequence[Mapping[str, Any]]) -> PodCounts:
    """Classify pods (terminating ones do not count): Ready; Pending with PodScheduled=False (the scheduler's
    message, e.g. ``0/2 nodes are available: 2 Insufficient nvidia.com/gpu``); failing (:func:`pod_failure`);
    everything else is starting."""
    ready: set[str] = set()
    starting = pending = 0
    reason = ""
    failing: list[str] = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        conds = {c.get("type"): c for c in status.get("conditions") or []}
        if (conds.get("Ready") or {}).get("status") == "True":
            ready.add(meta.get("name", ""))
        elif (conds.get("PodScheduled") or {}).get("status") == "False":
            pending += 1
            reason = reason or str(conds["PodScheduled"].get("message") or conds["PodScheduled"].get("reason") or "")
        elif why := pod_failure(pod):
            failing.append(f"{meta.get('name', '')}: {why}")
        else:
            starting += 1
    return PodCounts(frozenset(ready), starting, pending, reason, tuple(sorted(failing)))


def ready_pod_ips(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(uid, pod IP) of the pods that are Ready, not terminating and have an IP."""
    out = []
    for pod in pods:
        meta, st = pod.get("metadata") or {}, pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        if ready and not meta.get("deletionTimestamp") and st.get("podIP") and meta.get("uid"):
            out.append((str(meta["uid"]), str(st["podIP"])))
    return out
