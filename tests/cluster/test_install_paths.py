"""The install paths on a real API server: `helm template` of charts/batchfill and `kubectl kustomize deploy/base`,
server-side applied, then the ServiceAccount they create is checked with its own token (not system:masters):
`kubectl auth can-i` for what the operator must and must not do, and a SelfSubjectRulesReview that its rights are
exactly the documented rules (leases, for leader election, only in the operator's own namespace). The operator's
pod must pass the "restricted" Pod Security admission.

Every install gets its own release name / name prefix and namespaces (created here, deleted after), and the
cluster-scoped RBAC objects are deleted after, so the tests do not disturb an operator installed by other tests.
The CRD is applied (it is the repository's) and left in place. The operator image is pointed at an unpullable
name so no operator actually starts (on kind); on the local dev cluster kwok "runs" the pod without a process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.api.crd import CRD_NAME
from batchfill.testbed import devcluster

from ..unit.test_install_paths import (
    CLUSTER_READ_RULES,
    LEADER_ELECTION_RULES,
    NAMESPACE_GLOB_RULES,
    NAMESPACED_RULES,
)
from .support import Kube, skip_or_fail, temp_namespace, wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "batchfill"
FIELD_MANAGER = "batchfill-install-test"
NO_PULL_IMAGE = "batchfill-install-test.invalid/batchfill"  # never pulled: no operator starts on a real cluster
# Granted to every authenticated user by the default ClusterRoles (system:basic-user & co.), not by us.
BUILTIN_GROUPS = {"authorization.k8s.io", "authentication.k8s.io"}
STATUS_WRITTEN = {"Deployment", "CustomResourceDefinition"}

Rule = tuple[list[str], list[str], list[str]]


def _triples(rules: list[Rule]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for groups, resources, verbs in rules for g in groups for r in resources for v in verbs}


@pytest.fixture(scope="module")
def helm() -> str:
    cache = Path(os.environ.get("BATCHFILL_K8S_CACHE") or Path.home() / ".cache" / "batchfill" / "k8s")
    built = cache / "tools" / "bin" / "helm"
    found = str(built) if built.is_file() else shutil.which("helm")
    if not found:
        skip_or_fail("helm is missing; build it with: scripts/build-helm.sh")
    return str(found)


@dataclass
class Install:
    """What one install created: the operator's namespace and ServiceAccount, and its token kubeconfig."""

    namespace: str
    service_account: str
    sa_kubeconfig: Path
    manifest: Path

    def can_i(self, *args: str) -> bool:
        r = devcluster.kubectl(self.sa_kubeconfig, "auth", "can-i", *args, check=False)
        answer = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        assert answer in ("yes", "no"), f"kubectl auth can-i {' '.join(args)}: {r.stdout}{r.stderr}"
        return answer == "yes"

    def review(self, verb: str, group: str, resource: str, namespace: str, subresource: str = "") -> bool:
        """A SelfSubjectAccessReview, for resources the cluster does not serve (kubectl can-i cannot map them)."""
        attrs = {"verb": verb, "group": group, "resource": resource, "namespace": namespace}
        if subresource:
            attrs["subresource"] = subresource
        with devcluster.api_client(self.sa_kubeconfig) as api:
            review = client.AuthorizationV1Api(api).create_self_subject_access_review(
                {"spec": {"resourceAttributes": attrs}}
            )
        return bool(review.status.allowed)

    def rules_in(self, namespace: str) -> set[tuple[str, str, str]]:
        """(apiGroup, resource, verb) the ServiceAccount may use in ``namespace``, as the API server says."""
        with devcluster.api_client(self.sa_kubeconfig) as api:
            review = client.AuthorizationV1Api(api).create_self_subject_rules_review({"spec": {"namespace": namespace}})
        out = set()
        for rule in review.status.resource_rules or []:
            assert not rule.resource_names, f"unexpected resourceNames rule: {rule}"
            groups = set(rule.api_groups or [])
            if groups & BUILTIN_GROUPS:
                continue
            out |= _triples([(list(groups), list(rule.resources or []), list(rule.verbs or []))])
        return out


def _apply(kube: Kube, manifest: Path) -> None:
    kube.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts", "-f", str(manifest))


def _versions(kube: Kube, manifest: Path) -> dict[str, str]:
    """generation for objects whose status controllers keep writing (Deployment, CRD), else resourceVersion."""
    r = kube.kubectl("get", "-f", str(manifest), "-o", "json")
    items = json.loads(r.stdout).get("items", [])
    out = {}
    for o in items:
        meta = o["metadata"]
        key = f"{o['kind']}/{meta.get('namespace', '')}/{meta['name']}"
        out[key] = str(meta["generation"]) if o["kind"] in STATUS_WRITTEN else meta["resourceVersion"]
    return out


def _delete_cluster_scoped(kube: Kube, objs: list[dict[str, Any]]) -> None:
    rbac = kube.rbac
    for obj in objs:
        name = obj["metadata"]["name"]
        with suppress(ApiException):
            if obj["kind"] == "ClusterRoleBinding":
                rbac.delete_cluster_role_binding(name)
            elif obj["kind"] == "ClusterRole":
                rbac.delete_cluster_role(name)


@contextmanager
def _restricted_namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace where Pod Security admission enforces the "restricted" profile."""
    with temp_namespace(kube, prefix="bf-install-") as ns:
        kube.core.patch_namespace(ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        yield ns


@contextmanager
def _installed(kube: Kube, objs: list[dict[str, Any]], workdir: Path, sa_namespace: str) -> Iterator[Install]:
    """Server-side apply ``objs``; yield the ServiceAccount's view; delete the cluster-scoped RBAC after."""
    manifest = workdir / "install.yaml"
    manifest.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    (sa,) = [o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"]
    try:
        _apply(kube, manifest)
        kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
        # Applying the same manifests again changes nothing (GitOps tools re-apply all the time).
        before = _versions(kube, manifest)
        _apply(kube, manifest)
        assert _versions(kube, manifest) == before, "a second server-side apply changed objects"
        sa_kc = devcluster.service_account_kubeconfig(kube.kubeconfig, sa_namespace, sa, workdir / "sa.kubeconfig")
        yield Install(namespace=sa_namespace, service_account=sa, sa_kubeconfig=sa_kc, manifest=manifest)
    finally:
        _delete_cluster_scoped(kube, objs)


def _helm_objs(helm: str, release: str, namespace: str, *values: str) -> list[dict[str, Any]]:
    cmd = [helm, "template", release, str(CHART), "--namespace", namespace, "--include-crds"]
    cmd += ["--set", f"image.repository={NO_PULL_IMAGE}", *values]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _assert_operator_pod_admitted(kube: Kube, namespace: str, deployment: str) -> None:
    """The ReplicaSet controller could create the operator's pod: Pod Security "restricted" admitted it."""

    def pod_or_none() -> Any:
        pods = kube.core.list_namespaced_pod(namespace).items
        if pods:
            return pods
        for rs in kube.apps.list_namespaced_replica_set(namespace).items:
            for cond in (rs.status.conditions if rs.status else None) or []:
                if cond.type == "ReplicaFailure" and cond.status == "True":
                    pytest.fail(f"the operator pod of {deployment} was rejected: {cond.message}")
        return None

    pods = wait_for(f"the operator pod of {namespace}/{deployment}", pod_or_none, 90)
    assert pods[0].spec.service_account_name


def _check_common_denials(install: Install, namespace: str) -> None:
    denied: list[tuple[str, str, tuple[str, ...]]] = [
        ("get", "secrets", ()),
        ("list", "secrets", ()),
        ("create", "pods", ()),
        ("create", "pods", ("--subresource=exec",)),
        ("delete", "pods", ()),
        ("update", "pods", ()),
        ("delete", "configmaps", ()),
        ("delete", "replicasets.apps", ()),
        ("delete", "deployments.apps", ()),
        ("update", "deployments.apps", ()),
        ("update", "deployments.apps", ("--subresource=scale",)),
        ("delete", CRD_NAME, ()),
        ("create", CRD_NAME, ()),
        ("update", CRD_NAME, ("--subresource=status",)),
        ("create", "serviceaccounts", ("--subresource=token",)),
        ("create", "leases.coordination.k8s.io", ()),
        ("create", "roles.rbac.authorization.k8s.io", ()),
        ("*", "*", ()),
    ]
    for verb, resource, extra in denied:
        assert not install.can_i(verb, resource, *extra, "-n", namespace), f"may {verb} {resource} in {namespace}"
    for verb, resource in [("list", "secrets"), ("create", "clusterroles.rbac.authorization.k8s.io")]:
        assert not install.can_i(verb, resource, "--all-namespaces"), f"may {verb} {resource} cluster-wide"
    assert not install.can_i("create", "customresourcedefinitions.apiextensions.k8s.io")
    assert not install.can_i("get", "nodes")


def _check_operator_allowed(install: Install, namespace: str) -> None:
    allowed = [
        ("get", CRD_NAME, ()),
        ("list", CRD_NAME, ()),
        ("watch", CRD_NAME, ()),
        ("patch", CRD_NAME, ()),
        ("patch", CRD_NAME, ("--subresource=status",)),
        ("create", "configmaps", ()),
        ("list", "replicasets.apps", ()),
        ("patch", "services", ()),
        ("create", "deployments.apps", ()),
        ("patch", "deployments.apps", ("--subresource=scale",)),
        ("list", "pods", ()),
        ("patch", "pods", ()),  # the pool pods' model labels (batchfill.controller.pool_loop)
        ("create", "events", ()),
        ("create", "events.events.k8s.io", ()),
    ]
    for verb, resource, extra in allowed:
        assert install.can_i(verb, resource, *extra, "-n", namespace), f"may not {verb} {resource} in {namespace}"
    # prometheus-operator's CRD may not be installed: ask the API server directly.
    for verb in ("get", "create", "patch"):
        assert install.review(verb, "monitoring.coreos.com", "servicemonitors", namespace), f"may not {verb} SMs"
    assert not install.review("delete", "monitoring.coreos.com", "servicemonitors", namespace)
    # GPUPools: read only (platform teams create them); asked directly, as the CRD may be applied moments ago
    for verb in ("get", "list", "watch"):
        assert install.review(verb, "batchfill.io", "gpupools", namespace), f"may not {verb} GPUPools"
    for verb in ("create", "patch", "delete"):
        assert not install.review(verb, "batchfill.io", "gpupools", namespace), f"may {verb} GPUPools"
    assert install.review("patch", "batchfill.io", "gpupools", namespace, "status"), "may not patch GPUPool status"


def _check_leader_election(install: Install, own: str, others: list[str]) -> None:
    """get/create/update on leases in the operator's own namespace ``own``; nothing more, nowhere else."""
    for verb in ("get", "create", "update"):
        assert install.can_i(verb, "leases.coordination.k8s.io", "-n", own), f"may not {verb} leases in {own}"
        for ns in others:
            assert not install.can_i(verb, "leases.coordination.k8s.io", "-n", ns), f"may {verb} leases in {ns}"
    for verb in ("list", "watch", "patch", "delete"):
        assert not install.can_i(verb, "leases.coordination.k8s.io", "-n", own), f"may {verb} leases in {own}"
    assert not install.can_i("get", "leases.coordination.k8s.io", "--all-namespaces")


def _uid() -> str:
    return uuid.uuid4().hex[:6]


@pytest.mark.parametrize("mode", ["all", "names", "globs"])
def test_helm_template_applies_and_grants_exactly_the_documented_rules(
    kube: Kube, helm: str, tmp_path: Path, mode: str
) -> None:
    release = f"bf-it-{_uid()}"
    with ExitStack() as stack:
        ns = stack.enter_context(_restricted_namespace(kube))
        watched = [stack.enter_context(temp_namespace(kube, prefix="bf-watched-")) for _ in range(2)]
        values: tuple[str, ...] = ()
        if mode == "names":
            values = ("--set", f"watchNamespaces={{{','.join(watched)}}}")
        elif mode == "globs":
            values = ("--set", "watchNamespaces={bf-watched-*}")
        objs = _helm_objs(helm, release, ns, *values)
        install = stack.enter_context(_installed(kube, objs, tmp_path, ns))
        deployment = next(o["metadata"]["name"] for o in objs if o["kind"] == "Deployment")
        _assert_operator_pod_admitted(kube, ns, deployment)

        everywhere = _triples(CLUSTER_READ_RULES + NAMESPACED_RULES)
        lease = _triples(LEADER_ELECTION_RULES)
        if mode == "names":
            for w in watched:
                wait_for(f"RBAC in {w}", lambda w=w: install.rules_in(w) == everywhere or None, 30)
                _check_operator_allowed(install, w)
                _check_common_denials(install, w)
            # Not watched: only the cluster-scoped read, and in the operator's own namespace its Lease.
            wait_for(f"RBAC in {ns}", lambda: install.rules_in(ns) == _triples(CLUSTER_READ_RULES) | lease or None, 30)
            assert install.rules_in("default") == _triples(CLUSTER_READ_RULES)
            assert not install.can_i("list", CRD_NAME, "--all-namespaces")
            assert not install.can_i("get", "configmaps", "-n", ns)
            assert not install.can_i("list", "namespaces")
        else:
            expected = everywhere | (_triples(NAMESPACE_GLOB_RULES) if mode == "globs" else set())
            wait_for("RBAC", lambda: install.rules_in(watched[0]) == expected or None, 30)
            assert install.rules_in("default") == expected
            wait_for(f"RBAC in {ns}", lambda: install.rules_in(ns) == expected | lease or None, 30)
            for verb in ("list", "watch"):
                assert install.can_i(verb, CRD_NAME, "--all-namespaces")
            _check_operator_allowed(install, watched[0])
            _check_common_denials(install, watched[0])
            assert install.can_i("list", "namespaces") is (mode == "globs")
        _check_leader_election(install, ns, [*watched, "default"])
        assert install.can_i("watch", "customresourcedefinitions.apiextensions.k8s.io")
        assert not install.can_i("get", "customresourcedefinitions.apiextensions.k8s.io")


def test_kustomize_base_applies_and_grants_exactly_the_documented_rules(kube: Kube, tmp_path: Path) -> None:
    """deploy/base through an overlay that only renames (namespace, name prefix) and points at an unpullable image."""
    prefix = f"bf-it-{_uid()}-"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    with _restricted_namespace(kube) as ns:
        (overlay / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "namespace": ns,
                    "namePrefix": prefix,
                    "resources": [os.path.relpath(ROOT / "deploy" / "base", overlay)],
                    "images": [{"name": "batchfill", "newName": NO_PULL_IMAGE}],
                }
            )
        )
        r = subprocess.run(
            [shutil.which("kubectl") or "kubectl", "kustomize", str(overlay)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        objs = [d for d in yaml.safe_load_all(r.stdout) if d]
        # The overlay renames the base's Namespace to ns (and keeps its Pod Security labels).
        assert {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] == "Namespace"} == {("Namespace", ns)}
        with _installed(kube, objs, tmp_path, ns) as install:
            _assert_operator_pod_admitted(kube, ns, f"{prefix}batchfill")
            expected = _triples(CLUSTER_READ_RULES + NAMESPACED_RULES)
            wait_for("RBAC", lambda: install.rules_in("default") == expected or None, 30)
            lease = _triples(LEADER_ELECTION_RULES)
            wait_for(f"RBAC in {ns}", lambda: install.rules_in(ns) == expected | lease or None, 30)
            _check_leader_election(install, ns, ["default"])
            for verb in ("list", "watch"):
                assert install.can_i(verb, CRD_NAME, "--all-namespaces")
            _check_operator_allowed(install, "default")
            _check_common_denials(install, "default")
            assert not install.can_i("list", "namespaces")
