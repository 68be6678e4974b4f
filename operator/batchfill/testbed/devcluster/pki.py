"""The dev cluster's certificates and keys, made with the openssl command (the venv has no ``cryptography``).

``make_pki`` writes into one directory: ``ca.{key,crt}`` (the cluster CA: serving and client certificates),
``front-proxy-ca.{key,crt}`` and ``front-proxy-client.{key,crt}`` (request-header authentication of aggregated
API servers, a CA of its own as kubeadm makes it), ``apiserver.{key,crt}`` (serving), ``admin.{key,crt}``
(client, ``O=system:masters``), ``apiserver-kubelet-client.{key,crt}`` (the API server's client certificate for
kubelets' logs/exec, ``O=system:masters`` as kubeadm made it) and ``sa.{key,pub}`` (the ServiceAccount token
signing pair). All ECDSA P-256. :func:`sign_client` adds a client certificate (a real node's kubelet).
"""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from pathlib import Path

from batchfill.testbed.devcluster.binaries import DevClusterError

#: The API server's serving certificate names: loopback, and the ``kubernetes`` Service's IP and DNS names.
APISERVER_SANS = (
    "IP:127.0.0.1", "DNS:localhost", "IP:10.96.0.1", "DNS:kubernetes", "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local",
)  # fmt: skip
_LEAF_KEY_USAGE = "keyUsage = critical,digitalSignature,keyEncipherment\n"


def _openssl(pki: Path, *args: str) -> None:
    r = subprocess.run(["openssl", *args], cwd=pki, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise DevClusterError(f"openssl {' '.join(args)} failed: {r.stderr.strip()}")


def make_pki(pki: Path, days: int = 365) -> None:
    """Write the CAs, certificates and keys of the module docstring into ``pki``, valid for ``days`` days.

    Raises :class:`DevClusterError` when openssl is missing or fails.
    """
    if shutil.which("openssl") is None:
        raise DevClusterError("openssl is needed to make the cluster's certificates (apt-get install openssl)")
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "ca.cnf").write_text(
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = batchfill-dev-ca\n"
        "[v3_ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign,digitalSignature\n"
        "subjectKeyIdentifier = hash\n"
    )
    for ca, cn in (("ca", "batchfill-dev-ca"), ("front-proxy-ca", "batchfill-dev-front-proxy-ca")):
        _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{ca}.key")
        _openssl(pki, "req", "-x509", "-new", "-key", f"{ca}.key", "-config", "ca.cnf", "-extensions", "v3_ca",
                 "-subj", f"/CN={cn}", "-days", str(days), "-out", f"{ca}.crt")  # fmt: skip
    sans = ",".join(APISERVER_SANS)
    _sign(pki, "apiserver", "/CN=kube-apiserver",
          f"subjectAltName = {sans}\nextendedKeyUsage = serverAuth\n" + _LEAF_KEY_USAGE, days)  # fmt: skip
    _sign(pki, "admin", "/O=system:masters/CN=batchfill-admin", "extendedKeyUsage = clientAuth\n" + _LEAF_KEY_USAGE,
          days)  # fmt: skip
    _sign(pki, "front-proxy-client", "/CN=front-proxy-client", "extendedKeyUsage = clientAuth\n" + _LEAF_KEY_USAGE,
          days, ca="front-proxy-ca")  # fmt: skip
    sign_client(pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", days)
    _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
    _openssl(pki, "ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    for key in pki.glob("*.key"):
        key.chmod(0o600)


def sign_client(pki: Path, name: str, subject: str, days: int = 365) -> tuple[Path, Path]:
    """A client certificate ``<name>.{crt,key}`` signed by the cluster CA of ``pki``, for ``subject``
    (``/O=<group>/CN=<user>``). Returns (certificate, key). Raises :class:`DevClusterError` when openssl fails."""
    _sign(pki, name, subject, "extendedKeyUsage = clientAuth\n" + _LEAF_KEY_USAGE, days)
    (pki / f"{name}.key").chmod(0o600)
    return pki / f"{name}.crt", pki / f"{name}.key"


def _sign(pki: Path, name: str, subject: str, ext: str, days: int, ca: str = "ca") -> None:
    (pki / f"{name}.ext").write_text(ext + "authorityKeyIdentifier = keyid\n")
    _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key")
    _openssl(pki, "req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr")
    _openssl(pki, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", str(days), "-extfile", f"{name}.ext", "-out", f"{name}.crt")  # fmt: skip


def b64(path: Path) -> str:
    """The file's bytes, base64 (as kubeconfigs embed certificates)."""
    return base64.b64encode(path.read_bytes()).decode()


def admin_ssl_context(pki: Path, verify: bool = True) -> ssl.SSLContext:
    """A TLS client context presenting the admin certificate; ``verify``: check the server against the cluster CA
    (kube-scheduler and kube-controller-manager serve /healthz with self-signed certificates: ``verify=False``)."""
    if verify:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx
