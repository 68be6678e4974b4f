"""Kubeconfigs and clients of a cluster: the admin's, a ServiceAccount's (the operator does not run as
``system:masters``), a ``kubernetes.client.ApiClient`` and the cluster's kubectl."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from batchfill.testbed.devcluster.binaries import DevClusterError, kubectl_path
from batchfill.testbed.devcluster.pki import b64
from batchfill.testbed.devcluster.state import ClusterInfo


def write_kubeconfig(
    path: Path, server: str, ca_data: str, user: str, credentials: Mapping[str, str], name: str = "batchfill-dev"
) -> Path:
    """A one-context kubeconfig; ``credentials`` is the ``user`` stanza (client cert/key data, or ``token``)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": dict(credentials)}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def cluster_of(kubeconfig: Path) -> tuple[str, str, str]:
    """(server, CA data base64, context name) of the current context of ``kubeconfig``."""
    doc = yaml.safe_load(kubeconfig.read_text())
    ctx_name = doc.get("current-context")
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
    ca = cluster.get("certificate-authority-data")
    if not ca and cluster.get("certificate-authority"):
        ca_path = Path(cluster["certificate-authority"])
        if not ca_path.is_absolute():
            ca_path = kubeconfig.parent / ca_path
        ca = b64(ca_path)
    return str(cluster["server"]), str(ca or ""), str(ctx_name)


def api_client(kubeconfig: str | os.PathLike[str]) -> Any:
    """A ``kubernetes.client.ApiClient`` for ``kubeconfig`` (its current context)."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


def kubectl(info_or_kubeconfig: ClusterInfo | str | os.PathLike[str], *args: str, check: bool = True,
            timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run the cluster's kubectl (falls back to the one on PATH) against a kubeconfig.

    Raises :class:`DevClusterError` with kubectl's stderr when ``check`` and it fails.
    """
    if isinstance(info_or_kubeconfig, ClusterInfo):
        exe, kc = info_or_kubeconfig.kubectl, info_or_kubeconfig.kubeconfig
    else:
        exe, kc = kubectl_path(), Path(info_or_kubeconfig)
    cmd = str(exe) if exe.is_file() else (shutil.which("kubectl") or "kubectl")
    r = subprocess.run([cmd, f"--kubeconfig={kc}", *args], capture_output=True, text=True, check=False,
                       timeout=timeout_s)  # fmt: skip
    if check and r.returncode != 0:
        raise DevClusterError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def service_account_token(
    kubeconfig: str | os.PathLike[str],
    namespace: str,
    name: str,
    *,
    expiration_seconds: int = 24 * 3600,
    audiences: Sequence[str] = (),
) -> str:
    """A bound token for ServiceAccount ``namespace/name`` from the TokenRequest API (``kubectl create token``)."""
    from kubernetes import client

    with api_client(kubeconfig) as api:
        spec = client.V1TokenRequestSpec(audiences=list(audiences), expiration_seconds=expiration_seconds)
        core: Any = client.CoreV1Api(api)
        resp = core.create_namespaced_service_account_token(
            name, namespace, client.AuthenticationV1TokenRequest(spec=spec)
        )
    return str(resp.status.token)


def service_account_kubeconfig(
    admin_kubeconfig: str | os.PathLike[str],
    namespace: str,
    name: str,
    path: str | os.PathLike[str],
    *,
    create: bool = False,
    expiration_seconds: int = 24 * 3600,
) -> Path:
    """Write a kubeconfig at ``path`` that authenticates as ServiceAccount ``namespace/name`` with a token.

    The server and CA come from ``admin_kubeconfig``'s current context (works for the dev cluster and for
    kind). With ``create`` the namespace and ServiceAccount are created when missing; the RBAC that grants
    the ServiceAccount its rights is the caller's (the Helm chart's) business.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    admin = Path(admin_kubeconfig)
    if create:
        with api_client(admin) as api:
            core: Any = client.CoreV1Api(api)
            for create_call, args in (
                (core.create_namespace, ({"metadata": {"name": namespace}},)),
                (core.create_namespaced_service_account, (namespace, {"metadata": {"name": name}})),
            ):
                try:
                    create_call(*args)
                except ApiException as e:
                    if e.status != 409:
                        raise
    token = service_account_token(admin, namespace, name, expiration_seconds=expiration_seconds)
    server, ca, _ = cluster_of(admin)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_kubeconfig(out, server, ca, f"system:serviceaccount:{namespace}:{name}", {"token": token},
                            name=f"{name}@{namespace}")  # fmt: skip
