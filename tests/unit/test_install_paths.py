"""The install paths without a cluster: the Helm chart (charts/batchfill), the kustomize base (deploy/base) and the
deployable examples (deploy/examples), rendered with the real helm (built from its Go module by
scripts/build-helm.sh) and the machine's kubectl, and checked object by object.

What is checked: every rendered object's kind, name and namespace; RBAC is exactly the documented rules (no
wildcards, no Secrets; leases only in the operator's own namespace, for leader election); the operator runs under
the "restricted" Pod Security Standard, two replicas electing one; the chart's and the kustomize base's CRDs are the
generated crds/batchedmodel.yaml and crds/gpupool.yaml; `kubectl kustomize deploy/base` is the chart's default
install; the chart's settings reach `batchfill run` under the names batchfill.controller.settings reads.
Applying them to a real API server is tests/cluster/test_install_paths.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchfill.api.crd import CRD_NAME, POOL_CRD_NAME
from batchfill.api.pool import POOL_PLURAL
from batchfill.api.reasons import ScalingReason
from batchfill.api.spec import GROUP, KIND, PLURAL
from batchfill.api.validate import load_model
from batchfill.cli.main import build_parser
from batchfill.controller.settings import OperatorSettings
from batchfill.render.kube import Owner, build_deployment

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "batchfill"
CRD = ROOT / "crds" / "batchedmodel.yaml"
#: The generated CRDs (crds/, checked against the generator by test_crd.py and test_pool_api.py), each copied into
#: the chart and the kustomize base.
CRD_FILES = ("batchedmodel.yaml", "gpupool.yaml")
CRD_COPIES = [(d / "crds" / f, ROOT / "crds" / f) for f in CRD_FILES for d in (CHART, ROOT / "deploy" / "base")]
BUILD_HELM = "scripts/build-helm.sh"
RELEASE, NAMESPACE = "batchfill", "batchfill-system"
OPERATOR_UID = 10001

# --- the documented RBAC (charts/batchfill/templates/_helpers.tpl): (apiGroups, resources, verbs) ----------------
NAMESPACED_RULES = [
    ([GROUP], [PLURAL], ["get", "list", "watch", "patch"]),
    ([GROUP], [f"{PLURAL}/status"], ["get", "patch"]),
    ([""], ["configmaps", "services"], ["get", "list", "watch", "create", "patch"]),
    (["apps"], ["deployments"], ["get", "list", "watch", "create", "patch"]),
    (["apps"], ["replicasets"], ["list"]),
    (["apps"], ["deployments/scale"], ["get", "patch"]),
    ([""], ["pods"], ["get", "list", "watch", "patch"]),
    ([GROUP], [POOL_PLURAL], ["get", "list", "watch"]),
    ([GROUP], [f"{POOL_PLURAL}/status"], ["get", "patch"]),
    ([""], ["events"], ["create", "patch"]),
    (["events.k8s.io"], ["events"], ["create", "patch"]),
    (["monitoring.coreos.com"], ["servicemonitors"], ["get", "list", "watch", "create", "patch"]),
]
CLUSTER_READ_RULES = [(["apiextensions.k8s.io"], ["customresourcedefinitions"], ["list", "watch"])]
NAMESPACE_GLOB_RULES = [([""], ["namespaces"], ["list", "watch"])]
# Only in a Role in the release namespace (the operator's own), never cluster-wide or in a watched namespace.
LEADER_ELECTION_RULES = [(["coordination.k8s.io"], ["leases"], ["get", "create", "update"])]
LEADER_ELECTION_ROLE = f"{RELEASE}-leader-election"
OPERATOR_ENV = {
    "BATCHFILL_PROMETHEUS_URL",
    "BATCHFILL_NAMESPACES",
    "BATCHFILL_LOG_FORMAT",
    "BATCHFILL_METRICS_PORT",
    "BATCHFILL_RECONCILE_INTERVAL_SECONDS",
    "BATCHFILL_SIGNAL_WINDOW_SECONDS",
    "BATCHFILL_LEADER_ELECTION",
    "BATCHFILL_LEADER_ELECTION_LEASE_NAME",
    "POD_NAMESPACE",
    "POD_NAME",
}
# Set from the downward API: variable -> the pod field.
DOWNWARD_ENV = {
    "POD_NAMESPACE": "metadata.namespace",
    "POD_NAME": "metadata.name",
    "BATCHFILL_LEADER_ELECTION_LEASE_NAME": "spec.serviceAccountName",
}
# Labels only one of the two install paths sets.
TOOL_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by"}


# --- tools ------------------------------------------------------------------------------------------------------
def _tool(path: Path | None, name: str, how: str) -> str:
    found = str(path) if path is not None and path.is_file() and os.access(path, os.X_OK) else shutil.which(name)
    if found:
        return found
    message = f"{name} is missing; {how}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def helm() -> str:
    cache = Path(os.environ.get("BATCHFILL_K8S_CACHE") or Path.home() / ".cache" / "batchfill" / "k8s")
    return _tool(cache / "tools" / "bin" / "helm", "helm", f"build it with: {BUILD_HELM}")


@pytest.fixture(scope="module")
def kubectl() -> str:
    return _tool(None, "kubectl", "install kubectl (any version with kustomize v5)")


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def helm_template(helm: str, *values: str, include_crds: bool = False) -> list[dict[str, Any]]:
    args = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values]
    if include_crds:
        args.append("--include-crds")
    result = _run(*args)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stderr}"
    return _docs(result.stdout)


def kustomize(kubectl: str, path: str) -> list[dict[str, Any]]:
    result = _run(kubectl, "kustomize", path)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return _docs(result.stdout)


def _key(obj: dict[str, Any]) -> tuple[str, str, str | None]:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")


def _only(objs: Iterable[dict[str, Any]], kind: str, namespace: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objs if o["kind"] == kind and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"expected one {kind} in {namespace or 'the output'}, got {[_key(o) for o in found]}"
    return found[0]


def _rules(role: dict[str, Any]) -> list[tuple[list[str], list[str], list[str]]]:
    return [(r.get("apiGroups", []), r.get("resources", []), r.get("verbs", [])) for r in role["rules"]]


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _downward(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container.get("env", []) if "valueFrom" in e}


def _pod_env(deployment: dict[str, Any], pod_name: str = f"{RELEASE}-abc12-xyz34") -> dict[str, str]:
    """The environment the operator's container sees, with the downward API filled in as the kubelet would."""
    fields = {
        "metadata.namespace": deployment["metadata"]["namespace"],
        "metadata.name": pod_name,
        "spec.serviceAccountName": deployment["spec"]["template"]["spec"]["serviceAccountName"],
    }
    return _env(deployment) | {name: fields[path] for name, path in _downward(deployment).items()}


def _assert_leader_election_rbac(objs: list[dict[str, Any]]) -> None:
    """The leases Role and its binding to the operator's ServiceAccount, in the release namespace only."""
    roles = [o for o in objs if o["kind"] == "Role" and _rules(o) == LEADER_ELECTION_RULES]
    assert [_key(r) for r in roles] == [("Role", LEADER_ELECTION_ROLE, NAMESPACE)]
    binding = next(o for o in objs if _key(o) == ("RoleBinding", LEADER_ELECTION_ROLE, NAMESPACE))
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEADER_ELECTION_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    for role in (o for o in objs if o["kind"] in ("Role", "ClusterRole") and o not in roles):
        assert not any("leases" in r.get("resources", []) for r in role["rules"]), _key(role)


# Every values combination the tests render: name -> helm --set/--values arguments.
VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "names": ("--set", "watchNamespaces={ml,ocr}"),
    "globs": ("--set", "watchNamespaces={team-*,!team-sandbox}"),
    "servicemonitor": ("--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=prometheus"),
    "no-leader-election": ("--set", "leaderElection.enabled=false", "--set", "replicaCount=1"),
}


# --- the CRD copies ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("copy", "generated"), CRD_COPIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_crd_copy_is_byte_identical_to_generated_crd(copy: Path, generated: Path) -> None:
    assert copy.read_bytes() == generated.read_bytes(), (
        f"{copy.relative_to(ROOT)} differs from {generated.relative_to(ROOT)}; refresh it with: "
        f"cp {generated.relative_to(ROOT)} {copy.relative_to(ROOT)}"
    )


def test_chart_crds_dir_holds_only_the_crds() -> None:
    for d in (CHART / "crds", ROOT / "deploy" / "base" / "crds", ROOT / "crds"):
        assert sorted(p.name for p in d.iterdir()) == sorted(CRD_FILES), d
    resources = yaml.safe_load((ROOT / "deploy" / "base" / "kustomization.yaml").read_text())["resources"]
    assert [r for r in resources if r.startswith("crds/")] == [f"crds/{f}" for f in CRD_FILES]


# --- helm lint / template ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_strict(helm: str, variant: str) -> None:
    result = _run(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *VARIANTS[variant])
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_render_objects(helm: str) -> None:
    objs = helm_template(helm, include_crds=True)
    assert sorted(map(_key, objs), key=str) == sorted(
        [
            ("CustomResourceDefinition", CRD_NAME, None),
            ("CustomResourceDefinition", POOL_CRD_NAME, None),
            ("ServiceAccount", RELEASE, NAMESPACE),
            ("ClusterRole", RELEASE, None),
            ("ClusterRoleBinding", RELEASE, None),
            ("Role", LEADER_ELECTION_ROLE, NAMESPACE),
            ("RoleBinding", LEADER_ELECTION_ROLE, NAMESPACE),
            ("Deployment", RELEASE, NAMESPACE),
            ("PodDisruptionBudget", RELEASE, NAMESPACE),
        ],
        key=str,
    )
    crds = sorted((o for o in objs if o["kind"] == "CustomResourceDefinition"), key=lambda o: o["metadata"]["name"])
    assert crds == [yaml.safe_load(CRD.read_text()), yaml.safe_load((ROOT / "crds" / "gpupool.yaml").read_text())]
    _assert_leader_election_rbac(objs)
    role = _only(objs, "ClusterRole")
    assert _rules(role) == CLUSTER_READ_RULES + NAMESPACED_RULES
    binding = _only(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": RELEASE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    deployment = _only(objs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == RELEASE
    assert _env(deployment)["BATCHFILL_NAMESPACES"] == ""


def test_watching_named_namespaces_uses_a_role_per_namespace(helm: str) -> None:
    objs = helm_template(helm, *VARIANTS["names"])
    assert sorted(map(_key, objs), key=str) == sorted(
        [
            ("ServiceAccount", RELEASE, NAMESPACE),
            ("ClusterRole", RELEASE, None),
            ("ClusterRoleBinding", RELEASE, None),
            ("Role", RELEASE, "ml"),
            ("RoleBinding", RELEASE, "ml"),
            ("Role", RELEASE, "ocr"),
            ("RoleBinding", RELEASE, "ocr"),
            ("Role", LEADER_ELECTION_ROLE, NAMESPACE),
            ("RoleBinding", LEADER_ELECTION_ROLE, NAMESPACE),
            ("Deployment", RELEASE, NAMESPACE),
            ("PodDisruptionBudget", RELEASE, NAMESPACE),
        ],
        key=str,
    )
    _assert_leader_election_rbac(objs)
    # Cluster-wide, only the read kopf's resource observer needs: nothing namespaced leaks into it.
    assert _rules(_only(objs, "ClusterRole")) == CLUSTER_READ_RULES
    for ns in ("ml", "ocr"):
        assert _rules(_only(objs, "Role", ns)) == NAMESPACED_RULES
        binding = _only(objs, "RoleBinding", ns)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": RELEASE}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    assert _env(_only(objs, "Deployment"))["BATCHFILL_NAMESPACES"] == "ml,ocr"


def test_watching_namespace_globs_grants_cluster_wide_plus_namespace_reads(helm: str) -> None:
    objs = helm_template(helm, *VARIANTS["globs"])
    assert {o["kind"] for o in objs} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment",
        "PodDisruptionBudget",
    }  # fmt: skip
    assert _rules(_only(objs, "ClusterRole")) == CLUSTER_READ_RULES + NAMESPACED_RULES + NAMESPACE_GLOB_RULES
    _assert_leader_election_rbac(objs)
    assert _env(_only(objs, "Deployment"))["BATCHFILL_NAMESPACES"] == "team-*,!team-sandbox"


def test_leader_election_runs_two_replicas_that_elect_one_with_a_lease(helm: str) -> None:
    deployment = _only(helm_template(helm), "Deployment")
    spec = deployment["spec"]
    # Two replicas, one acting: the standby takes over when the leader dies (HA). A rolling update starts the new
    # replica (standing by) before an old one stops and releases the Lease.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert _downward(deployment) == DOWNWARD_ENV
    settings = OperatorSettings.from_env(_pod_env(deployment))
    assert settings.leader_election is True
    assert settings.leader_election_namespace == NAMESPACE  # the Role's namespace
    assert settings.leader_election_lease_name == RELEASE
    # A drain evicts one replica at a time, and the two prefer different nodes (one node going down does not take
    # the leader and its standby together).
    selector = spec["selector"]["matchLabels"]
    budget = _only(helm_template(helm), "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert spec["template"]["spec"]["affinity"] == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": selector},
                    },
                }
            ]
        }
    }
    # The user's affinity replaces the default; the budget can be turned off.
    objs = helm_template(
        helm, "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
        ".matchExpressions[0].key=pool", "--set", "podDisruptionBudget.enabled=false",
    )  # fmt: skip
    affinity = _only(objs, "Deployment")["spec"]["template"]["spec"]["affinity"]
    assert list(affinity) == ["nodeAffinity"]
    assert not [o for o in objs if o["kind"] == "PodDisruptionBudget"]


def test_a_renamed_install_elects_with_a_lease_of_its_own(helm: str, kubectl: str, tmp_path: Path) -> None:
    # The Lease is named after the ServiceAccount through the downward API, so kustomize's namePrefix (which
    # renames the ServiceAccount and the pod's reference to it, but not a literal env value) and a second Helm
    # release each elect with their own Lease instead of sharing one.
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [os.path.relpath(ROOT / "deploy" / "base", tmp_path)], "namePrefix": "team-a-"})
    )
    objs = kustomize(kubectl, str(tmp_path))
    settings = OperatorSettings.from_env(_pod_env(_only(objs, "Deployment")))
    assert settings.leader_election_lease_name == "team-a-batchfill"
    binding = next(o for o in objs if o["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] == "team-a-batchfill"
    other = _only(helm_template(helm, "--set", "fullnameOverride=bf-two"), "Deployment")
    assert OperatorSettings.from_env(_pod_env(other)).leader_election_lease_name == "bf-two"


def test_leader_election_can_be_turned_off_for_a_single_replica(helm: str) -> None:
    objs = helm_template(helm, *VARIANTS["no-leader-election"])
    assert not [o for o in objs if o["kind"] in ("Role", "RoleBinding")]
    assert not [r for o in objs if o["kind"] == "ClusterRole" for r in o["rules"] if "leases" in r["resources"]]
    deployment = _only(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # old and new never overlap
    assert OperatorSettings.from_env(_pod_env(deployment)).leader_election is False
    # More than one replica without leader election would act twice: the chart refuses to render it.
    result = _run(
        helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "leaderElection.enabled=false"
    )
    assert result.returncode != 0
    assert "replicaCount > 1 needs leaderElection.enabled" in result.stderr, result.stderr


def test_service_monitor_for_the_operators_metrics_is_optional(helm: str) -> None:
    assert not [o for o in helm_template(helm) if o["kind"] in ("Service", "ServiceMonitor")]
    objs = helm_template(helm, *VARIANTS["servicemonitor"])
    service, monitor = _only(objs, "Service", NAMESPACE), _only(objs, "ServiceMonitor", NAMESPACE)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    pod_labels = _only(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


@pytest.mark.parametrize(
    "bad",
    [
        ("--set", "watchNamespaces={ml\\,ocr}"),  # one item with a comma: BATCHFILL_NAMESPACES is comma-split
        ("--set", "watchNamespaces={ML}"),
        ("--set", "logFormat=xml"),
        ("--set", "prometheusUrl=prometheus:9090"),
        ("--set", "image.pullPolicy=Sometimes"),
        ("--set", "replicaCount=0"),
        ("--set", "leaderElection.enabled=yes"),
    ],
    ids=[
        "comma-in-namespace",
        "uppercase-namespace",
        "log-format",
        "url-without-scheme",
        "pull-policy",
        "replicas",
        "leader-election",
    ],
)
def test_values_schema_rejects(helm: str, bad: tuple[str, ...]) -> None:
    result = _run(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *bad)
    assert result.returncode != 0, result.stdout
    assert "values don't meet the specifications" in result.stderr, result.stderr


# --- RBAC hygiene over every rendering --------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_rbac_has_no_wildcards_secrets_or_escalation(helm: str, variant: str) -> None:
    roles = [o for o in helm_template(helm, *VARIANTS[variant]) if o["kind"] in ("Role", "ClusterRole")]
    assert roles
    for role in roles:
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            where = f"{role['kind']} {role['metadata']['name']}: {rule}"
            assert set(rule) <= {"apiGroups", "resources", "verbs"}, where  # no nonResourceURLs, no resourceNames
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in v for v in rule[field]), where
            assert not {"secrets", "serviceaccounts/token", "pods/exec", "pods/attach", "nodes"} & set(
                rule["resources"]
            ), where
            assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"]), where
            assert not {"rbac.authorization.k8s.io", "certificates.k8s.io"} & set(rule["apiGroups"]), where
            if "update" in rule["verbs"] or "leases" in rule["resources"]:
                # update only on the leader-election Lease, in a Role of the operator's own namespace
                assert (rule["apiGroups"], rule["resources"], rule["verbs"]) in LEADER_ELECTION_RULES, where
                assert (role["kind"], role["metadata"].get("namespace")) == ("Role", NAMESPACE), where


def test_every_rbac_rule_is_documented() -> None:
    """Each rule in the chart's rule templates is preceded by a comment saying who uses it."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    lines = text.splitlines()
    rule_lines = [i for i, line in enumerate(lines) if line.lstrip().startswith("- apiGroups:")]
    assert len(rule_lines) == (
        len(NAMESPACED_RULES) + len(CLUSTER_READ_RULES) + len(NAMESPACE_GLOB_RULES) + len(LEADER_ELECTION_RULES)
    )
    for i in rule_lines:
        j = i - 1
        while j >= 0 and not lines[j].lstrip().startswith(("#", "{{")):
            j -= 1  # the previous rule of the same comment (core and events.k8s.io events)
        assert lines[j].lstrip().startswith("#"), f"rule at _helpers.tpl:{i + 1} has no comment"
        comment = []
        while j >= 0 and lines[j].lstrip().startswith("#"):
            comment.append(lines[j])
            j -= 1
        assert re.search(r"\b(kopf|batchfill)\b", " ".join(comment)), (
            f"the comment of _helpers.tpl:{i + 1} names no user"
        )


# --- the operator's pod -----------------------------------------------------------------------------------------
def test_operator_pod_is_restricted(helm: str) -> None:
    deployment = _only(helm_template(helm), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == OPERATOR_UID
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    assert all("hostPath" not in v for v in pod.get("volumes", []))
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not sc.get("privileged")
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}  # the only writable path


def test_operator_container_runs_batchfill_run_with_its_settings(helm: str) -> None:
    objs = helm_template(
        helm,
        "--set",
        "prometheusUrl=http://prom.example:9090",
        "--set",
        "logFormat=text",
        "--set",
        "reconcileIntervalSeconds=30",
        "--set",
        "metrics.port=9100",
        "--set",
        "image.repository=registry.example/batchfill",
        "--set",
        "image.tag=1.2.3",
    )
    container = _only(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/batchfill:1.2.3"
    assert container["args"][0] == "run"
    env = _pod_env(_only(objs, "Deployment"))
    assert set(env) == OPERATOR_ENV
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == 9100
    # The same names and values batchfill.controller.settings reads, and flags `batchfill run` accepts.
    settings = OperatorSettings.from_env(env)
    assert settings.prometheus_url == "http://prom.example:9090"
    assert settings.log_format == "text"
    assert settings.metrics_port == 9100
    assert settings.reconcile_interval_s == 30
    assert settings.namespaces == ()
    args = build_parser().parse_args(container["args"])
    assert args.func.__name__ == "cmd_run"
    # The probes hit kopf's liveness endpoint, which --liveness opens.
    health = {p["name"]: p["containerPort"] for p in container["ports"]}["health"]
    assert args.liveness == f"http://0.0.0.0:{health}/healthz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_chart_defaults_match_the_operators_defaults(helm: str) -> None:
    env = _pod_env(_only(helm_template(helm), "Deployment"))
    defaults = OperatorSettings()
    assert env["BATCHFILL_PROMETHEUS_URL"] == defaults.prometheus_url
    assert int(env["BATCHFILL_METRICS_PORT"]) == defaults.metrics_port
    assert float(env["BATCHFILL_RECONCILE_INTERVAL_SECONDS"]) == defaults.reconcile_interval_s
    assert float(env["BATCHFILL_SIGNAL_WINDOW_SECONDS"]) == defaults.signal_window_s
    assert env["BATCHFILL_LEADER_ELECTION_LEASE_NAME"] == defaults.leader_election_lease_name
    # Deliberately different: the operator's default is off (`batchfill run` on a laptop, the demo, the tests),
    # the chart's on (replicas in a cluster), as controller-runtime's --leader-elect and kubebuilder's manifests.
    assert defaults.leader_election is False
    assert env["BATCHFILL_LEADER_ELECTION"] == "true"


def test_dockerfile_matches_the_chart() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(rf"^USER {OPERATOR_UID}(:{OPERATOR_UID})?$", text, re.M), "USER must be the chart's numeric uid"
    assert re.search(r'^ENTRYPOINT \["batchfill"\]$', text, re.M)
    assert re.search(r'^CMD \["run"\]$', text, re.M)


# --- kustomize ----------------------------------------------------------------------------------------------------
def _without_tool_labels(obj: dict[str, Any]) -> dict[str, Any]:
    obj = yaml.safe_load(yaml.safe_dump(obj))
    labels = obj["metadata"].get("labels", {})
    for key in TOOL_LABELS:
        labels.pop(key, None)
    return obj


def test_kustomize_base_is_the_charts_default_install(helm: str, kubectl: str) -> None:
    chart = {_key(o): _without_tool_labels(o) for o in helm_template(helm, include_crds=True)}
    base = {_key(o): _without_tool_labels(o) for o in kustomize(kubectl, "deploy/base")}
    namespace = base.pop(("Namespace", NAMESPACE, None))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert sorted(base, key=str) == sorted(chart, key=str)
    for key, obj in chart.items():
        assert base[key] == obj, f"deploy/base and the chart's defaults differ in {key}"


def test_kustomize_examples_are_the_repository_examples_with_a_model_repository(kubectl: str) -> None:
    objs = kustomize(kubectl, "deploy/examples")
    models = [o for o in objs if o["kind"] == KIND]
    namespaces = {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
    originals = {}
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in _docs(path.read_text()):
            if doc.get("kind") == KIND:  # not examples/shared-rates.yaml, the rates `batchfill plan --rates` reads
                originals[doc["metadata"]["name"]] = doc
    assert sorted(o["metadata"]["name"] for o in models) == sorted(originals)
    for model in models:
        assert model["metadata"]["namespace"] in namespaces
        repository = model["spec"]["model"].pop("repository")
        assert set(repository) == {"pvc"}
        assert model == originals[model["metadata"]["name"]]
        # Deployable: valid, and the operator can build its Triton Deployment from it.
        model["spec"]["model"]["repository"] = repository
        bm = load_model(model)
        owner = Owner(name=bm.metadata.name, namespace=str(bm.metadata.namespace), uid="uid")
        volumes = build_deployment(owner, bm.spec, "hash", 1)["spec"]["template"]["spec"]["volumes"]
        assert {"name": "model-source", "persistentVolumeClaim": {"claimName": "triton-models", "readOnly": True}} in (
            volumes
        )


def test_grafana_dashboard_renders_and_queries_only_exported_metrics(helm: str) -> None:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from batchfill.adapters import operator_metrics

    assert not [o for o in helm_template(helm) if o["kind"] == "ConfigMap"], "the dashboard is opt-in"
    cm = _only(helm_template(helm, "--set", "grafanaDashboard.enabled=true"), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["batchfill.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "batchfill.json").read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Load (requests/s)", "Replicas", "Batch fill", "Queue time per request", "p99 against the SLA"} <= titles
    # every series the dashboard asks for is one the operator exports (after one observed tick)
    from batchfill.policy.scaling import Decision
    from batchfill.policy.signals import ModelSignals, SignalState

    operator_metrics.observe_tick(
        "ns", "m", decision=Decision(2, 1, 2, ScalingReason.SCALE_OUT_SATURATED, "", ()),
        signals=ModelSignals(SignalState.OK, pods=1, request_rate_rps=5.0, batch_fill=0.5, queue_time_ms=1.0,
                             p99_ms=10.0), replicas=2, ready=1, capacity_rps=10.0, server_budget_ms=90.0,
        gpus_per_replica=1, elapsed_s=3600.0, gpu_holding_replicas=2,
    )  # fmt: skip
    operator_metrics.RECONCILE.labels("scale").observe(0.1)
    from batchfill.policy.cost import ExecutionCounters, split_gpu_time

    counters = {"m": ExecutionCounters(0.0, 2.0, 0.0)}
    unknown = split_gpu_time(60.0, counters, {"m": ExecutionCounters(0.0, float("nan"), 0.0)})
    operator_metrics.observe_cost("ns", "pool", [split_gpu_time(60.0, {}, counters), unknown])
    exported = {s.name for f in text_string_to_metric_families(generate_latest(operator_metrics.REGISTRY).decode())
                for s in f.samples}  # fmt: skip
    used = {
        m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"\b(batchfill_[a-z0-9_]+)", t["expr"])
    }
    assert used, "no batchfill metric in the dashboard"
    assert used <= exported, f"dashboard queries metrics the operator does not export: {sorted(used - exported)}"
    text = generate_latest(operator_metrics.REGISTRY).decode()
    ours = {"namespace": "ns", "name": "m"}
    gpu_hours = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "batchfill_gpu_hours_total" and s.labels == ours
    ]
    assert gpu_hours == [2.0]  # 2 replicas x 1 GPU x 1 hour
    operator_metrics.forget("ns", "m")
    assert 'name="m"' not in generate_latest(operator_metrics.REGISTRY).decode()
