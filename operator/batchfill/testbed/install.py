"""The operator installed on a cluster as a user would, for the demo, the cluster tests and the benchmarks.

* :func:`install_operator_rbac`: the CRD, the operator's namespace, ServiceAccount and least-privilege RBAC from
  ``deploy/base``, by server-side apply (everything but the operator's Deployment);
* :func:`operator_as_service_account`: ``batchfill run`` as a local subprocess authenticated with a token of
  that ServiceAccount, so it has the install's rights and not the admin's;
* :func:`model_volume`: a statically bound hostPath PersistentVolume and claim holding a model repository.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from batchfill.api.crd import CRD_NAME
from batchfill.testbed import devcluster

#: How long :func:`install_operator_rbac` waits for the installed CRDs' storage to answer a LIST, seconds.
CRD_STORAGE_WAIT_S = 60.0

OPERATOR_NS, OPERATOR_SA = "batchfill-system", "batchfill"
#: The operator (kopf's graceful stop) gets this after SIGTERM before SIGKILL, then OPERATOR_KILL_WAIT_S to exit.
OPERATOR_STOP_GRACE_S = 30.0
OPERATOR_KILL_WAIT_S = 10.0
#: deploy/base minus the operator's own Deployment (the operator runs here as a subprocess, as its ServiceAccount).
INSTALL_KINDS = frozenset(
    {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    }
)
#: The PersistentVolumeClaim of :func:`model_volume`.
CLAIM = "triton-models"
FIELD_MANAGER = "batchfill-demo"


def kubectl_stdout(kubeconfig: Path, *args: str, check: bool = True) -> str:
    """The stdout of the cluster's kubectl (:func:`batchfill.testbed.devcluster.kubectl`, 120 s timeout)."""
    return devcluster.kubectl(kubeconfig, *args, check=check, timeout_s=120).stdout


def server_side_apply(kubeconfig: Path, docs: list[dict[str, Any]], path: Path) -> None:
    """Write ``docs`` to ``path`` and ``kubectl apply --server-side --force-conflicts`` it."""
    path.write_text(yaml.safe_dump_all(docs))
    kubectl_stdout(
        kubeconfig, "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", str(path)
    )


def install_operator_rbac(kubeconfig: Path, work: Path) -> None:
    """Server-side apply deploy/base without the operator's Deployment; wait for the CRD to be Established and
    for every installed CRD's storage to answer a LIST (:func:`wait_for_crd_storage`)."""
    rendered = kubectl_stdout(kubeconfig, "kustomize", str(devcluster.SOURCE_ROOT / "deploy" / "base"))
    install = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") in INSTALL_KINDS]
    server_side_apply(kubeconfig, install, work / "install.yaml")
    kubectl_stdout(kubeconfig, "wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    wait_for_crd_storage(
        kubeconfig, [d["metadata"]["name"] for d in install if d["kind"] == "CustomResourceDefinition"]
    )


def wait_for_crd_storage(kubeconfig: Path, crds: list[str], timeout_s: float = CRD_STORAGE_WAIT_S) -> None:
    """Until a LIST of each CRD's resource (``plural.group``, the CRD's name) answers. An Established CRD's storage
    may still be initializing its watch cache: the API server answers HTTP 429 "storage is (re)initializing"
    meanwhile, and an operator started at once met it on its first LIST (benchmarks/scale.py counted it as
    throttling).

    Raises:
        TimeoutError: a LIST still failed after ``timeout_s`` seconds (its last error in the message).
    """
    deadline = time.monotonic() + timeout_s
    for crd in crds:
        while True:
            done = devcluster.kubectl(kubeconfig, "get", crd, "-A", "-o", "name", check=False, timeout_s=30)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"LIST {crd} still failing after {timeout_s:g} s: {done.stderr.strip()[:300]}")
            time.sleep(0.5)


@contextlib.contextmanager
def operator_as_service_account(
    kubeconfig: Path,
    work: Path,
    log_path: Path,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    server: str = "",
) -> Iterator[subprocess.Popen[bytes]]:
    """``batchfill run`` with a token of the install's ServiceAccount (its RBAC, not the admin's); stopped on exit:
    SIGTERM, SIGKILL after :data:`OPERATOR_STOP_GRACE_S`, then :data:`OPERATOR_KILL_WAIT_S` for it to exit
    (``subprocess.TimeoutExpired`` if it does not). ``server``: the API server URL the operator uses instead of
    the admin kubeconfig's (a proxy in front of it, :mod:`batchfill.testbed.api_proxy`)."""
    sa_config = devcluster.service_account_kubeconfig(kubeconfig, OPERATOR_NS, OPERATOR_SA, work / "sa.kubeconfig")
    if server:
        doc = yaml.safe_load(sa_config.read_text())
        for cluster in doc["clusters"]:
            cluster["cluster"]["server"] = server
        sa_config.write_text(yaml.safe_dump(doc))
    full_env = dict(os.environ, KUBECONFIG=str(sa_config), BATCHFILL_METRICS_PORT="0", **(env or {}))
    with log_path.open("wb") as log_file:
        operator: subprocess.Popen[bytes] | None = None
        try:
            operator = subprocess.Popen(
                [sys.executable, "-m", "batchfill.cli", "run", *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=full_env,
            )
            yield operator
        finally:
            if operator is not None:
                operator.terminate()
                try:
                    operator.wait(timeout=OPERATOR_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    operator.kill()
                    operator.wait(timeout=OPERATOR_KILL_WAIT_S)


def model_volume(ns: str, name: str, path: Path) -> list[dict[str, Any]]:
    """A statically bound hostPath PersistentVolume + claim holding the model repository."""
    pv = f"{CLAIM}-{ns}-{name}"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path)},
                "claimRef": {"namespace": ns, "name": CLAIM},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, "namespace": ns},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]
