"""The dev cluster's component processes: their command lines, starting one, health checks, and stopping them.

* **etcd** (``--unsafe-no-fsync`` when the binary has it);
* **kube-apiserver** with RBAC, a service-account issuer and signing key, and the default admission plugins,
  including ``ServiceAccount`` (unlike envtest, which disables it): pods get a projected token and a
  ServiceAccount's token (TokenRequest API) authenticates, so the operator can run as a ServiceAccount;
* **kube-scheduler** (real scheduling: ``Insufficient nvidia.com/gpu`` is the real scheduler's verdict);
* **kube-controller-manager** (Deployments/ReplicaSets, garbage collection, namespace deletion, the ``default``
  ServiceAccount of every namespace, ``kube-root-ca.crt``, node lifecycle);
* **kwok** with the node/pod "fast" stages, managing fake nodes annotated ``kwok.x-k8s.io/node=fake``.

Every component authenticates with the admin client certificate (``O=system:masters``) and listens on
127.0.0.1 only. Each is a :class:`~batchfill.testbed.process.Process` logging to ``<run dir>/logs/<name>.log``.
"""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from batchfill.testbed.devcluster.state import KUBECONFIG_NAME, log_path
from batchfill.testbed.process import LOOPBACK, Process, stop_all

# Start order; stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok")
#: The ports ``cluster_up`` picks, by the name :func:`commands` reads them with.
PORT_NAMES = ("etcd", "etcd-peer", "apiserver", "scheduler", "controller-manager")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
# Clients first, so the API server's graceful shutdown has no watches to drain; etcd last.
STOP_STAGES = (("kwok", "kube-controller-manager", "kube-scheduler"), ("kube-apiserver",), ("etcd",))
#: Seconds a stage waits after SIGTERM before SIGKILL to the process groups, and after SIGKILL.
STOP_GRACE_S = 15.0
KILL_WAIT_S = 10.0
#: The longest :func:`stop_components` (``cluster_down``, a failed ``cluster_up``) takes, in seconds: components
#: outside the stages, then each stage.
STOP_TIMEOUT_S = (len(STOP_STAGES) + 1) * (STOP_GRACE_S + KILL_WAIT_S)


def _help_has(binary: Path, flag: str) -> bool:
    r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, check=False, timeout=30)
    return flag in (r.stdout + r.stderr)


def _etcd(bins: Path, run_dir: Path, ports: Mapping[str, int]) -> list[str]:
    client_url, peer_url = f"http://{LOOPBACK}:{ports['etcd']}", f"http://{LOOPBACK}:{ports['etcd-peer']}"
    argv = [
        str(bins / "etcd"), "--name=dev", f"--data-dir={run_dir / 'etcd-data'}",
        f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=dev={peer_url}", "--log-level=warn",
    ]  # fmt: skip
    if _help_has(bins / "etcd", "--unsafe-no-fsync"):  # a throwaway cluster needs no durability
        argv.append("--unsafe-no-fsync=true")
    return argv


def _apiserver(bins: Path, run_dir: Path, ports: Mapping[str, int]) -> list[str]:
    pki = run_dir / "pki"
    return [
        str(bins / "kube-apiserver"),
        f"--etcd-servers=http://{LOOPBACK}:{ports['etcd']}",
        f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}", f"--secure-port={ports['apiserver']}",
        f"--cert-dir={pki}", f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}", f"--client-ca-file={pki / 'ca.crt'}",
        f"--service-account-issuer=https://{LOOPBACK}:{ports['apiserver']}",
        f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        # Node: a kubelet (real nodes) may only read and write what its own pods need (NodeRestriction too).
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        # Real nodes: reach the kubelet at its node IP (no DNS name resolves) with a client certificate.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--allow-privileged=true",
        # 127.0.0.1 is not a valid endpoint of the `kubernetes` Service; nothing in the cluster dials it.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
    ]  # fmt: skip


def _delegated(run_dir: Path) -> list[str]:
    """Flags of the components that authenticate and authorize their own clients through the API server."""
    kc = str(run_dir / KUBECONFIG_NAME)
    return [
        f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--leader-elect=false", f"--bind-address={LOOPBACK}",
    ]  # fmt: skip


def _kwok(bins: Path, run_dir: Path, stages: Path) -> list[str]:
    return [
        str(bins / "kwok"), f"--kubeconfig={run_dir / KUBECONFIG_NAME}", "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-lease-duration-seconds=40", f"--cidr={POD_CIDR}",
        f"--config={stages / 'node' / 'fast' / 'node-initialize.yaml'}",
        f"--config={stages / 'node' / 'heartbeat-with-lease' / 'node-heartbeat-with-lease.yaml'}",
        f"--config={stages / 'pod' / 'fast' / 'pod-ready.yaml'}",
        f"--config={stages / 'pod' / 'fast' / 'pod-complete.yaml'}",
        f"--config={stages / 'pod' / 'fast' / 'pod-delete.yaml'}",
    ]  # fmt: skip


def commands(bins: Path, run_dir: Path, ports: Mapping[str, int], stages: Path) -> dict[str, list[str]]:
    """The command line of every component of :data:`COMPONENTS` (``ports`` by :data:`PORT_NAMES`)."""
    pki = run_dir / "pki"
    scheduler = [
        str(bins / "kube-scheduler"), *_delegated(run_dir), f"--secure-port={ports['scheduler']}",
        f"--cert-dir={pki / 'kube-scheduler'}",
    ]  # fmt: skip
    kcm = [
        str(bins / "kube-controller-manager"), *_delegated(run_dir), f"--secure-port={ports['controller-manager']}",
        f"--cert-dir={pki / 'kube-controller-manager'}",
        f"--root-ca-file={pki / 'ca.crt'}", f"--service-account-private-key-file={pki / 'sa.key'}",
        "--use-service-account-credentials=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--node-monitor-period=2s",
    ]  # fmt: skip
    return {"etcd": _etcd(bins, run_dir, ports), "kube-apiserver": _apiserver(bins, run_dir, ports),
            "kube-scheduler": scheduler, "kube-controller-manager": kcm,
            "kwok": _kwok(bins, run_dir, stages)}  # fmt: skip


def start_component(name: str, argv: list[str], run_dir: Path, die_with_parent: bool) -> Process:
    """Start one component in ``run_dir`` (its own process group, so it survives the terminal's Ctrl-C after
    ``up``; ``die_with_parent``: it gets SIGTERM when the calling thread exits)."""
    return Process.start(argv, log_path(run_dir, name), name=name, cwd=run_dir, die_with_parent=die_with_parent)


def stop_components(processes: Mapping[str, Process]) -> list[str]:
    """Stop the components in ``processes`` stage by stage (:data:`STOP_STAGES`); returns the survivors' names."""
    staged = {n for stage in STOP_STAGES for n in stage}
    unstaged = [n for n in processes if n not in staged]
    survivors: list[str] = []
    for names in (unstaged, *([n for n in stage if n in processes] for stage in STOP_STAGES)):
        left = stop_all([processes[n] for n in names], STOP_GRACE_S, kill_wait_s=KILL_WAIT_S)
        survivors += [n for n in names if processes[n] in left]
    return survivors


def http_get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 3.0) -> tuple[int, str]:
    """(HTTP status, body) of a GET; (0, "") when the server cannot be reached."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except (OSError, ssl.SSLError):
        return 0, ""
