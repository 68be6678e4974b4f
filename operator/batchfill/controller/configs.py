"""Who owns each of a BatchedModel's config ConfigMaps, so the API server's garbage collector deletes a config
once nothing can mount it again (pure).

Each config.pbtxt lives in an immutable ConfigMap named by its digest (``render.kube.configmap_name``). The
Deployment's ReplicaSets are its revision history (``spec.revisionHistoryLimit``), and ``kubectl rollout undo``
copies an old one's template back, so a config must live as long as a ReplicaSet mounts it
(https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#rolling-back-a-deployment):

* the config the Deployment's template mounts is owned by the BatchedModel (its controller), as every child is;
* an older config is owned by the ReplicaSets that mount it, and by nothing else: when the Deployment controller
  deletes the last of them, the garbage collector deletes the config
  (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents);
* an older config no ReplicaSet mounts (the spec changed again before the Deployment controller made one) is owned
  by the Deployment, so it goes with the BatchedModel.

The operator therefore never deletes anything itself, and needs no ``delete`` permission.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from batchfill.render.kube import CONFIG_HASH_ANNOTATION, template_config_name


def _template_spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return (((obj or {}).get("spec") or {}).get("template") or {}).get("spec")


def _controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("uid") == uid for r in refs)


def _reference(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    # blockOwnerDeletion would need permission to set finalizers on the owner; nothing waits on these
    return {"apiVersion": "apps/v1", "kind": kind, "name": meta.get("name"), "uid": meta.get("uid"),
            "controller": False, "blockOwnerDeletion": False}  # fmt: skip


def _refs_key(refs: Iterable[Mapping[str, Any]]) -> list[tuple[str, bool]]:
    return sorted((str(r.get("uid")), bool(r.get("controller"))) for r in refs)


def config_owners(
    model_reference: Mapping[str, Any],
    configmaps: Iterable[Mapping[str, Any]],
    deployment: Mapping[str, Any],
    replica_sets: Iterable[Mapping[str, Any]],
) -> dict[str, list[dict[str, Any]]]:
    """The ownerReferences each config ConfigMap should have, for those whose references differ from that.

    Args:
        model_reference: the BatchedModel's controller ownerReference (``render.kube.Owner.reference()``).
        configmaps: the ConfigMaps with the model's labels; only those carrying the config-hash annotation
            are configs (a user's ConfigMap with the same labels is left alone).
        deployment: the model's Deployment as the API returns it (with its uid and template).
        replica_sets: ReplicaSets with the model's labels; only those the Deployment controls count.

    Returns ``{configmap name: ownerReferences}``, sorted by name; empty when every config is owned right.
    """
    dep_uid = (deployment.get("metadata") or {}).get("uid")
    current = template_config_name(_template_spec(deployment))
    mounted_by: dict[str, list[dict[str, Any]]] = {}
    for rs in replica_sets:
        name = template_config_name(_template_spec(rs))
        if dep_uid and name and _controlled_by(rs, dep_uid):
            mounted_by.setdefault(name, []).append(_reference(rs, "ReplicaSet"))
    out: dict[str, list[dict[str, Any]]] = {}
    for cm in configmaps:
        meta = cm.get("metadata") or {}
        name = meta.get("name")
        if not name or CONFIG_HASH_ANNOTATION not in (meta.get("annotations") or {}) or meta.get("deletionTimestamp"):
            continue
        if name == current:
            wanted = [dict(model_reference)]
        elif name in mounted_by:
            wanted = sorted(mounted_by[name], key=lambda r: str(r["name"]))
        else:
            wanted = [_reference(deployment, "Deployment")]
        if _refs_key(meta.get("ownerReferences") or []) != _refs_key(wanted):
            out[str(name)] = wanted
    return dict(sorted(out.items()))
