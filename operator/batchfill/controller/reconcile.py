"""The reconcile of create, update and resume, and the loops' re-apply: plan -> gather -> act.

* plan: validate the spec, derive the batching plan, render config.pbtxt and the children (pure,
  :mod:`batchfill.controller.desired`; the plan is cached by spec, so a resume or a status-only event does not
  re-simulate);
* gather: read what exists (the Deployment's replicas, whether ServiceMonitor is served);
* act: server-side apply the children (an unchanged child is a no-op on the server), hand each older config
  ConfigMap to the ReplicaSets that mount it (:mod:`batchfill.controller.configs`), then compute the status
  (:mod:`batchfill.controller.status`, from the Deployment as applied) and return only the fields that differ
  from the stored status, so an idle system writes nothing.

An invalid or infeasible spec writes its conditions, emits one Warning event per generation and raises
:class:`SpecRejectedError`; the handler turns that into ``kopf.PermanentError``: retrying the same spec cannot
help (https://docs.kopf.dev/en/stable/errors/).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from batchfill.adapters.kube import Kube, KubeNotFoundError
from batchfill.api.errors import SpecError
from batchfill.api.reasons import ConditionType, EventReason
from batchfill.controller.configs import config_owners
from batchfill.controller.desired import Desired, adopted_profile, desired_state
from batchfill.controller.rollout import keeps_rolling_in_place
from batchfill.controller.shared_status import served_shared, shared_status
from batchfill.controller.status import (
    changed_fields,
    desired_status,
    hand_rollback,
    on_pool_copies,
    planned_plan_warnings,
    rejection_status,
)
from batchfill.policy import conditions as cond
from batchfill.render.kube import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_KEY,
    Owner,
    build_configmap,
    build_deployment,
    build_service,
    build_service_monitor,
    names,
    selector_labels,
)
from batchfill.render.pool import build_shared_service

log = logging.getLogger("batchfill")

#: emit(type, reason, message): posts a Kubernetes Event on the BatchedModel.
Emit = Callable[[str, str, str], None]
#: first_tick(body, desired, deployment, wanted, now): the status ``wanted`` of a model no scaling tick has seen yet,
#: completed with what that tick would write (controller/scaling.status_before_first_tick).
FirstTick = Callable[[Mapping[str, Any], Desired, Mapping[str, Any], dict[str, Any], float], dict[str, Any]]
#: (type, reason, message) of a Kubernetes Event a tick decided to post.
Event = tuple[str, str, str]
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")


class SpecRejectedError(Exception):
    """The spec cannot be served; ``status`` holds the conditions to write."""

    def __init__(self, message: str, status: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status


def log_event(namespace: str, name: str, type_: str, reason: str, message: str) -> None:
    """The operator's log line of an Event it posts (Warning events at WARNING, the rest at INFO)."""
    log.log(logging.WARNING if type_ == "Warning" else logging.INFO, "%s/%s %s: %s", namespace, name, reason, message)


def emitter(kube: Kube, body: Mapping[str, Any]) -> Emit:
    """Posts Events on ``body`` through the operator's own (rate-limited) client, and logs them.

    Not kopf.event: kopf's requests have no client-side limit, and it works only inside handlers.
    """
    meta = body["metadata"]

    def emit(type_: str, reason: str, message: str) -> None:
        kube.post_event(body, type_, reason, message)
        log_event(meta["namespace"], meta["name"], type_, reason, message)

    return emit


# One writer of a model's children at a time in this process: the create/update handlers, the scaling loop's
# re-apply and the profiling loop's re-plan run on threads of their own, and two of them that both read the
# Deployment before either applied the new config would both roll it and post ConfigChanged twice (seen in
# tests/cluster/test_real_pods.py: the profiling loop adopting a profile while the scaling loop found the drift).
# Striped, so the memory is bounded however many models there are; two models sharing a stripe only wait.
_CHILDREN_LOCKS = tuple(threading.RLock() for _ in range(64))


def children_lock(namespace: str, name: str) -> threading.RLock:
    """The lock held while the children of the BatchedModel ``namespace/name`` are read and applied."""
    return _CHILDREN_LOCKS[zlib.crc32(f"{namespace}/{name}".encode()) % len(_CHILDREN_LOCKS)]


def reconcile(body: Mapping[str, Any], kube: Kube, *, now: float, emit: Emit, in_place: bool = False,
              first: bool = False, first_tick: FirstTick | None = None) -> dict[str, Any]:  # fmt: skip
    """Bring the children in line with the spec; return the status fields to patch (possibly none).

    Holds :func:`children_lock` throughout: a second caller reads the Deployment as the first applied it.

    ``first``: the create handler's first attempt; on an object with no status none of its children exists yet, so
    nothing is read (three requests fewer per new model; a retry reads, an earlier attempt may have applied some).

    ``first_tick``: completes the status of a model without ``status.lastScaleReason`` (no scaling tick has written
    yet) with the fields its first tick would write while none of its pods is Ready, so that tick finds nothing to
    write (benchmarks/scale.py: 1,000 new models, 898 first ticks that wrote only these fields).

    ``in_place``: roll without a surge pod (the scaling tick found none can be scheduled,
    :func:`batchfill.controller.rollout.in_place_reason`); an in-place rollout under way stays in place until it
    is complete either way.

    Raises:
        SpecRejectedError: invalid or infeasible spec (its conditions are in the exception).
        KubeTemporaryError / KubePermanentError: from the API (adapters.kube).
    """
    meta = body["metadata"]
    with children_lock(meta["namespace"], meta["name"]):
        return _reconcile(body, kube, now=now, emit=emit, in_place=in_place, first=first, first_tick=first_tick)


def _reconcile(body: Mapping[str, Any], kube: Kube, *, now: float, emit: Emit, in_place: bool,
               first: bool, first_tick: FirstTick | None) -> dict[str, Any]:  # fmt: skip
    """:func:`reconcile` under its lock."""
    meta, spec = body["metadata"], body.get("spec") or {}
    status: Mapping[str, Any] = body.get("status") or {}
    generation = meta.get("generation")
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    shared = served_shared(body)
    try:
        desired = desired_state(spec, adopted_profile(spec, status))
        # a plannable spec may still not be deployable (no repository, an object-store uri): a condition, not a
        # traceback and a retry every minute. A shared model is loaded from its pool's repository instead.
        if not shared:
            build_deployment(owner, desired.spec, desired.config_hash, desired.spec.scaling.minReplicas)
    except SpecError as err:
        rejected = rejection_status(err, status, generation, now)
        previous = cond.find(status.get("conditions"), ConditionType.PLANNED)
        message = "; ".join(str(p) for p in err.problems)
        if not (previous and previous.get("observedGeneration") == generation and previous.get("message") == message):
            emit("Warning", err.reason, message)  # once per generation, not on every resume
        raise SpecRejectedError(message, rejected) from None

    # gather
    first = first and not status
    existing = None if first else kube.get("apps/v1", "Deployment", names(owner)["deployment"], owner.namespace)
    if shared:
        return _reconcile_shared(body, kube, desired, owner, existing, now=now)
    placed = status.get("placement") or {}
    replicas = _replicas(existing, placed, desired.spec.scaling.minReplicas)
    with_monitor = kube.has_kind(*SERVICE_MONITOR)

    # a person's rollback (kubectl rollout undo) holds until the spec changes: a resume or a re-apply of the
    # same generation leaves the Deployment as they set it (controller.status.hand_rollback)
    rolled_back, who = hand_rollback(existing, desired)
    keep = existing is not None and rolled_back and status.get("observedGeneration") == generation

    # act
    keep_from = existing if keep else None
    in_place = in_place or keeps_rolling_in_place(existing)
    deployment = _apply_children(kube, owner, desired, placed, replicas, in_place=in_place, kept=keep_from)
    if with_monitor:
        apply_service_monitor(kube, build_service_monitor(owner))
    if not first:  # a new model's only config is the one just applied, owned by the model
        own_configs(kube, owner, deployment)
    if existing is None:
        emit("Normal", EventReason.DEPLOYED, f"created Triton Deployment with config {desired.config_hash}")
    elif keep:
        log.info("%s/%s: config %s set by %s kept until the spec changes", meta["namespace"], meta["name"],
                 rolled_back, who)  # fmt: skip
    elif (old_hash := _config_hash(existing)) != desired.config_hash:
        emit(
            "Normal",
            EventReason.CONFIG_CHANGED,
            f"config.pbtxt {old_hash} -> {desired.config_hash}: rolling the pods once",
        )

    wanted = desired_status(body, desired, deployment, now=now)
    if first_tick is not None and not status.get("lastScaleReason"):
        wanted = first_tick(body, desired, deployment, wanted, now)
    stored = cond.find(status.get("conditions"), ConditionType.PLANNED) or {}
    for warning in planned_plan_warnings(desired):  # once: while the stored condition does not carry it yet
        if warning.message not in str(stored.get("message") or ""):
            emit("Warning", warning.reason, warning.message)
    return changed_fields(status, wanted)


def _apply_children(
    kube: Kube,
    owner: Owner,
    desired: Desired,
    placed: Mapping[str, Any],
    replicas: int,
    *,
    in_place: bool,
    kept: Mapping[str, Any] | None,
) -> Mapping[str, Any]:
    """Server-side apply the config ConfigMap, the Deployment (unless ``kept``: a hand rollback holds it) and the
    Service, at once (:meth:`Kube.apply_all`: they are independent on the server); returns the Deployment as applied
    (or ``kept``). The Service of a model leaving its pool depends on that Deployment (:func:`_service`), so it comes
    after."""
    children = [build_configmap(owner, desired.config, desired.config_hash)]
    if kept is None:
        children.append(build_deployment(owner, desired.spec, desired.config_hash, replicas, in_place=in_place))
    leaving = on_pool_copies(placed)
    if not leaving:
        children.append(build_service(owner))
    applied = kube.apply_all(children)
    deployment = kept if kept is not None else applied[1]
    if leaving:
        kube.apply(_service(owner, placed, deployment))
    return deployment


def _config_hash(deployment: Mapping[str, Any]) -> str | None:
    """The config hash of the Deployment's pod template (:data:`CONFIG_HASH_ANNOTATION`), or None."""
    template = (deployment.get("spec") or {}).get("template") or {}
    return ((template.get("metadata") or {}).get("annotations") or {}).get(CONFIG_HASH_ANNOTATION)


def _leaving_pool(placed: Mapping[str, Any]) -> bool:
    """Whether ``status.placement`` says the model is (still) on its pool: mode Shared (its spec left the pool), or
    copies on pool pods (``podCount``; an ``Auto`` model the joint plan moved to replicas of its own is written
    Dedicated at once, while its pool copies still serve it)."""
    return bool(placed.get("pool")) and (placed.get("mode") == "Shared" or on_pool_copies(placed))


def _replicas(existing: Mapping[str, Any] | None, placed: Mapping[str, Any], least: int) -> int:
    """The Deployment's replicas: as they are (the scaling loop's), or ``least`` (minReplicas) for a new one and for
    one coming back from a pool with its replicas scaled below it (:func:`_leaving_pool`)."""
    replicas = (existing or {}).get("spec", {}).get("replicas")
    if replicas is None or (_leaving_pool(placed) and replicas < least):
        return least
    return int(replicas)


def _service(owner: Owner, placed: Mapping[str, Any], deployment: Mapping[str, Any]) -> dict[str, Any]:
    """The model's Service: its own pods', except while it leaves its pool (``status.placement`` names the pool and
    counts copies there) and no replica of its own is Ready: then the pool's copies keep the model's address, and
    the pool keeps them until ``status.readyReplicas`` counts a Ready replica of its own (written after this)."""
    ready = int(((deployment.get("status") or {}).get("readyReplicas")) or 0)
    if on_pool_copies(placed) and not ready:
        return build_shared_service(owner, str(placed.get("pool")))
    return build_service(owner)


def _reconcile_shared(
    body: Mapping[str, Any],
    kube: Kube,
    desired: Desired,
    owner: Owner,
    existing: Mapping[str, Any] | None,
    *,
    now: float,
) -> dict[str, Any]:
    """A model served on its pool's pods: its Service selects the pods it is loaded and ready on
    (:func:`batchfill.render.pool.build_shared_service`), the pool loop loads it; no Deployment or config of its own.
    Replicas of its own from before (it was Dedicated) serve until a pool copy is labelled, then scale to 0."""
    status: Mapping[str, Any] = body.get("status") or {}
    copies = int((status.get("placement") or {}).get("podCount") or 0)
    own = int(((existing or {}).get("spec") or {}).get("replicas") or 0)
    if existing is None or copies:
        pool = str(((body.get("spec") or {}).get("placement") or {}).get("pool"))
        kube.apply(build_shared_service(owner, pool))
        if own:
            kube.scale_deployment(names(owner)["deployment"], owner.namespace, 0)
    return changed_fields(status, shared_status(body, desired, None, now=now))


def own_configs(kube: Kube, owner: Owner, deployment: Mapping[str, Any]) -> list[str]:
    """Give each of the owner's config ConfigMaps the owners :func:`config_owners` says (gather the ConfigMaps and
    ReplicaSets, decide, apply only the changed ones); returns the names re-owned. The garbage collector then
    deletes a config once no ReplicaSet can mount it again.

    Raises:
        KubeTemporaryError / KubePermanentError: from the API (adapters.kube).
    """
    selector = selector_labels(owner)
    configmaps = {cm["metadata"]["name"]: cm for cm in kube.list_config_maps(owner.namespace, selector)}
    replica_sets = kube.list_replica_sets(owner.namespace, selector)
    changed = config_owners(owner.reference(), configmaps.values(), deployment, replica_sets)
    for name, owners in changed.items():
        cm = configmaps[name]
        digest = cm["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
        kube.apply(build_configmap(owner, (cm.get("data") or {}).get(CONFIG_KEY, ""), digest, owners=owners))
    return list(changed)


def apply_service_monitor(kube: Kube, monitor: dict[str, Any]) -> bool:
    """Server-side apply a model's ServiceMonitor (``build_service_monitor``); False when its kind is not served
    any more (the cached discovery is dropped then, so the next look asks the API again).

    Raises:
        KubeTemporaryError / KubePermanentError: from the API, except a 404.
    """
    try:
        kube.apply(monitor)
    except KubeNotFoundError:  # the prometheus-operator CRD went away after discovery cached it
        kube.forget_kinds()
        return False
    return True


def reapply(kube: Kube, name: str, namespace: str, *, now: float, in_place: bool = False) -> None:
    """Apply the children again and write the status that results (a loop's re-apply; the handlers apply once
    per generation). The object is read again first: its status may have just changed.

    A spec rejected now (e.g. a measured profile that makes the SLA infeasible) only writes its conditions, with
    the numbers: the running pods keep their config (children are applied only for a plan that serves).

    Raises:
        KubeTemporaryError / KubePermanentError: from the API (adapters.kube).
    """
    with children_lock(namespace, name):  # the read, the apply and its status: another re-apply waits for all
        fresh = kube.get_batched_model(name, namespace)
        if fresh is None:
            return
        try:
            changed = reconcile(fresh, kube, now=now, emit=emitter(kube, fresh), in_place=in_place)
        except SpecRejectedError as err:
            kube.patch_status(fresh, changed_fields(fresh.get("status") or {}, err.status))
            return
        if changed:
            kube.patch_status(fresh, changed)
