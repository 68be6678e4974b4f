"""A real local Kubernetes control plane on 127.0.0.1 for the cluster tests and the demo (no Docker, no kind).

``cluster_up`` starts, each as a plain process with its own PID recorded in the run directory:

* **etcd** (``--unsafe-no-fsync`` when the binary has it);
* **kube-apiserver** with RBAC, a service-account issuer and signing key, and the default admission plugins,
  including ``ServiceAccount`` (unlike envtest, which disables it): pods get a projected token and a
  ServiceAccount's token (TokenRequest API) authenticates, so the operator can run as a ServiceAccount;
* **kube-scheduler** (real scheduling: ``Insufficient nvidia.com/gpu`` is the real scheduler's verdict);
* **kube-controller-manager** (Deployments/ReplicaSets, garbage collection, namespace deletion, the ``default``
  ServiceAccount of every namespace, ``kube-root-ca.crt``, node lifecycle);
* **kwok** with the node/pod "fast" stages, managing fake nodes annotated ``kwok.x-k8s.io/node=fake``;

then creates ``gpu_nodes`` fake GPU nodes (``nvidia.com/gpu`` capacity, GPU-feature-discovery style labels)
and waits until they are Ready and schedulable. Pods bound to them become Running without a process (kwok).

The binaries come from ``scripts/build-k8s.sh`` (built from Go modules through the module proxy) in
``${BATCHFILL_K8S_CACHE:-~/.cache/batchfill/k8s}/<k8s version>/bin``; :func:`ensure_binaries` runs it when
one is missing. Every component authenticates with an admin client certificate (``O=system:masters``); the
operator should not: :func:`service_account_kubeconfig` writes a token kubeconfig for a ServiceAccount.

Run directory layout (``down`` removes it; ``up`` refuses a non-empty directory it did not create)::

    .batchfill-dev-cluster   marker
    cluster.json             ports, PIDs (with their /proc start times, so a reused PID is never killed)
    admin.kubeconfig         system:masters client certificate, embedded
    pki/ etcd-data/ logs/<component>.log
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

LOOPBACK = "127.0.0.1"
K8S_VERSION = "v1.36.5"  # keep in step with scripts/build-k8s.sh (a cluster test checks it)
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
_VERSION_OF = {
    "etcd": ETCD_VERSION,
    "kwok": KWOK_VERSION,
    "kube-apiserver": K8S_VERSION,
    "kube-controller-manager": K8S_VERSION,
    "kube-scheduler": K8S_VERSION,
    "kubectl": K8S_VERSION,
}
# Start order; stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok")

SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
NODE_IP_PREFIX = "10.240.0."
#: Pod CIDR of fake node i: 127.1.<i>.0/24. kwok gives pods addresses from their node's podCIDR, and loopback
#: addresses let a real tritonserver listen on its pod's IP with Triton's standard ports, so the operator reaches
#: pods at <pod IP>:8000 exactly as in a real cluster.
POD_CIDR_TEMPLATE = "127.1.{index}.0/24"
FAKE_NODE_LABEL = "batchfill.io/dev-cluster-node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
MARKER = ".batchfill-dev-cluster"
STATE_FILE = "cluster.json"
KUBECONFIG_NAME = "admin.kubeconfig"


class DevClusterError(RuntimeError):
    """The local cluster could not be started, reached or stopped; the message names the log to read."""


class BinariesUnavailableError(DevClusterError):
    """The control-plane binaries are missing and could not be built (no Go, no proxy, build failure)."""


# ---------------------------------------------------------------------------------------------------------
# Where things are
# ---------------------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """``$BATCHFILL_K8S_CACHE``, else ``~/.cache/batchfill/k8s`` (the same rule as scripts/build-k8s.sh)."""
    env = os.environ.get("BATCHFILL_K8S_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "batchfill" / "k8s"


def bin_dir() -> Path:
    return cache_root() / K8S_VERSION / "bin"


def kwok_stages_dir() -> Path:
    return cache_root() / K8S_VERSION / "kwok-stages"


def kubectl_path() -> Path:
    """The kubectl built with the cluster (the machine's own kubectl may be older)."""
    return bin_dir() / "kubectl"


def build_script() -> Path:
    """``$BATCHFILL_BUILD_K8S_SCRIPT``, else ``scripts/build-k8s.sh`` of the source checkout."""
    env = os.environ.get("BATCHFILL_BUILD_K8S_SCRIPT")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "scripts" / "build-k8s.sh"


def default_run_dir() -> Path:
    """``$BATCHFILL_DEV_CLUSTER_DIR``, else ``$XDG_STATE_HOME/batchfill/dev-cluster`` (``~/.local/state``)."""
    env = os.environ.get("BATCHFILL_DEV_CLUSTER_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "batchfill" / "dev-cluster"


def missing_binaries() -> list[str]:
    """Binaries that are absent from :func:`bin_dir` or were built for another version."""
    d = bin_dir()
    missing = []
    for name in BINARIES:
        stamp = d / f".{name}.version"
        ok = (d / name).is_file() and stamp.is_file() and stamp.read_text().strip() == _VERSION_OF[name]
        if not ok:
            missing.append(name)
    if not (kwok_stages_dir() / "node" / "fast" / "node-initialize.yaml").is_file():
        missing.append("kwok-stages")
    return missing


def _console(console: Console | None, quiet: bool = False) -> Console:
    return console if console is not None else Console(stderr=True, quiet=quiet, log_path=False)


def ensure_binaries(
    console: Console | None = None,
    *,
    build: bool = True,
    log_path: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Return :func:`bin_dir`, running scripts/build-k8s.sh first when something is missing.

    The build (about 25 min cold on 2 cores, about 35 s with a warm Go build cache) writes its output to
    ``log_path`` (default ``<cache>/<version>/build.log``). Every progress line of the script (which
    component, the elapsed time, the log path; one at least every 30 s) is passed to ``progress`` (default:
    logged on ``console``), so a build is never silent, on a terminal or not. Raises
    :class:`BinariesUnavailableError` with the log's last lines and what to do.
    """
    missing = missing_binaries()
    if not missing:
        return bin_dir()
    con = _console(console)
    if not build:
        raise BinariesUnavailableError(f"missing in {bin_dir()}: {', '.join(missing)}; run scripts/build-k8s.sh")
    script = build_script()
    if not script.is_file():
        raise BinariesUnavailableError(
            f"missing in {bin_dir()}: {', '.join(missing)}, and the build script {script} is not there "
            "(set BATCHFILL_BUILD_K8S_SCRIPT or run from a source checkout)"
        )
    log = log_path or cache_root() / K8S_VERSION / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        K8S_VERSION=K8S_VERSION, ETCD_VERSION=ETCD_VERSION, KWOK_VERSION=KWOK_VERSION,
        BATCHFILL_K8S_CACHE=str(cache_root()), BATCHFILL_BUILD_LOG=str(log),
    )  # fmt: skip
    say = progress if progress is not None else con.log
    t0 = time.monotonic()
    say(f"building {', '.join(missing)} from Go modules (cold: ~25 min on 2 cores, once); log: {log}")
    with open(log, "ab") as out:
        start = out.tell()
        proc = subprocess.Popen(
            ["bash", str(script)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
        lines = _LogFollower(log, start)
        while proc.poll() is None:
            time.sleep(1.0)
            for line in lines.new_lines():
                say(line)
        for line in lines.new_lines():
            say(line)
    if proc.returncode != 0:
        what = {3: "no usable Go toolchain (Go >= 1.26 needed)"}.get(proc.returncode, "the build failed")
        raise BinariesUnavailableError(
            f"scripts/build-k8s.sh exited with {proc.returncode}: {what}; log {log}\n{_tail(log, 25)}\n"
            "Fix the cause above and run the command again: finished components and Go's caches are kept."
        )
    still = missing_binaries()
    if still:
        raise BinariesUnavailableError(f"build finished but {', '.join(still)} still missing; log {log}")
    con.log(f"built the control plane in {time.monotonic() - t0:.0f} s: {bin_dir()}")
    return bin_dir()


# ---------------------------------------------------------------------------------------------------------
# Cluster state
# ---------------------------------------------------------------------------------------------------------
@dataclass
class ClusterInfo:
    """What ``cluster_up`` started. ``pids`` maps component name to PID."""

    kubeconfig: Path
    server: str
    run_dir: Path
    pids: dict[str, int]
    bin_dir: Path = field(default_factory=bin_dir)
    reused: bool = False
    startup_s: float = 0.0

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with ``KUBECONFIG`` and the cluster's kubectl on PATH."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = os.pathsep.join(p for p in (str(self.bin_dir), env.get("PATH", "")) if p)
        return env


@dataclass
class _Proc:
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: tells a reused PID apart
    exe: str


@dataclass
class _State:
    server: str
    kubeconfig: str
    bin_dir: str
    ports: dict[str, int]
    processes: dict[str, _Proc] = field(default_factory=dict)
    gpu_nodes: int = 0
    gpus_per_node: int = 0
    cpu_nodes: int = 0

    def save(self, run_dir: Path) -> None:
        tmp = run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(run_dir / STATE_FILE)

    @classmethod
    def load(cls, run_dir: Path) -> _State | None:
        try:
            raw = json.loads((run_dir / STATE_FILE).read_text())
            raw["processes"] = {k: _Proc(**v) for k, v in raw.get("processes", {}).items()}
            return cls(**raw)
        except (OSError, ValueError, TypeError):
            return None

    def info(self, run_dir: Path, **kw: Any) -> ClusterInfo:
        return ClusterInfo(
            kubeconfig=Path(self.kubeconfig),
            server=self.server,
            run_dir=run_dir,
            pids={k: p.pid for k, p in self.processes.items()},
            bin_dir=Path(self.bin_dir),
            **kw,
        )


# ---------------------------------------------------------------------------------------------------------
# Processes (by PID only)
# ---------------------------------------------------------------------------------------------------------
_children: dict[int, subprocess.Popen[bytes]] = {}


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 = state, 2 = pgrp, 19 = starttime)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def _alive(p: _Proc) -> bool:
    """Whether ``p`` is still the process we started (same PID, same start time, same executable)."""
    fields = _proc_stat(p.pid)
    if fields is None or fields[0] in ("Z", "X") or int(fields[19]) != p.start_ticks:
        return False
    try:
        argv0 = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return argv0 == p.exe


def _gone(p: _Proc) -> bool:
    """Exited, and for a child of this process also reaped, so ``/proc/<pid>`` is gone when this says so.

    A child is judged by ``Popen.poll()`` only: after SIGKILL a multi-threaded Go process shows state ``Z``
    while its other threads are still exiting, and cannot be reaped until they have. (Its PID cannot be
    reused before we reap it, so the /proc identity check is only needed for processes of an earlier run.)
    """
    child = _children.get(p.pid)
    if child is not None:
        if child.poll() is None:
            return False
        _children.pop(p.pid, None)
        return True
    return not _alive(p)


#: Seconds `_stop` waits after SIGTERM before SIGKILL to the process group, and after SIGKILL.
STOP_GRACE_S = 15.0
KILL_WAIT_S = 5.0


def _stop(procs: Mapping[str, _Proc], grace_s: float = STOP_GRACE_S) -> list[str]:
    """SIGTERM each live process, wait, then SIGKILL its process group. Returns the names that survived."""
    live = {n: p for n, p in procs.items() if _alive(p)}
    for p in live.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not all(_gone(p) for p in live.values()):
        time.sleep(0.1)
    for p in live.values():
        if not _gone(p):
            fields = _proc_stat(p.pid)
            # Started with start_new_session=True, so the group is its own: kill it only if that is still so.
            if fields is not None and int(fields[2]) == p.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and not all(_gone(p) for p in live.values()):
        time.sleep(0.1)
    return [n for n, p in live.items() if not _gone(p)]


# Clients first, so the API server's graceful shutdown has no watches to drain; etcd last.
_STOP_STAGES = (("kwok", "kube-controller-manager", "kube-scheduler"), ("kube-apiserver",), ("etcd",))
#: The longest `cluster_down` (or a failed `cluster_up`) waits for the components to stop, in seconds.
STOP_TIMEOUT_S = len(_STOP_STAGES) * (STOP_GRACE_S + KILL_WAIT_S)


def _stop_cluster(procs: Mapping[str, _Proc]) -> list[str]:
    """Stop the components in ``procs`` stage by stage (:data:`_STOP_STAGES`); returns the survivors."""
    staged = {n for stage in _STOP_STAGES for n in stage}
    survivors = _stop({n: p for n, p in procs.items() if n not in staged})
    for stage in _STOP_STAGES:
        survivors += _stop({n: p for n, p in procs.items() if n in stage})
    return survivors


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """preexec_fn: SIGTERM this child when the thread that started it exits (Linux PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def _spawn(name: str, argv: Sequence[str], run_dir: Path, die_with_parent: bool) -> _Proc:
    log = run_dir / "logs" / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=str(run_dir),
            start_new_session=True,  # own process group; survives the terminal's Ctrl-C after `up`
            preexec_fn=_die_with_parent if die_with_parent and sys.platform == "linux" else None,
        )
    _children[proc.pid] = proc
    fields = _proc_stat(proc.pid)
    ticks = int(fields[19]) if fields else 0
    return _Proc(pid=proc.pid, start_ticks=ticks, exe=str(argv[0]))


def _free_ports(n: int) -> list[int]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 32 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class _LogFollower:
    """The build script's own progress lines (``[build-...] ...``) appended to a log since ``start`` (bytes)."""

    def __init__(self, path: Path, start: int) -> None:
        self._path, self._offset, self._partial = path, start, b""

    def new_lines(self) -> list[str]:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(1 << 20)
        except OSError:
            return []
        self._offset += len(chunk)
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        text = (raw.decode(errors="replace").rstrip() for raw in whole)
        return [line for line in text if line.startswith("[build-")]


# ---------------------------------------------------------------------------------------------------------
# PKI (openssl; the venv has no `cryptography`) and kubeconfigs
# ---------------------------------------------------------------------------------------------------------
def _openssl(pki: Path, *args: str) -> None:
    r = subprocess.run(["openssl", *args], cwd=pki, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise DevClusterError(f"openssl {' '.join(args)} failed: {r.stderr.strip()}")


def make_pki(pki: Path, days: int = 365) -> None:
    """ECDSA P-256 CA, apiserver serving cert, admin client cert (system:masters) and SA signing key pair."""
    if shutil.which("openssl") is None:
        raise DevClusterError("openssl is needed to make the cluster's certificates (apt-get install openssl)")
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "ca.cnf").write_text(
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = batchfill-dev-ca\n"
        "[v3_ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign,digitalSignature\n"
        "subjectKeyIdentifier = hash\n"
    )
    # Cluster CA (serving and client certs) and, as kubeadm does, a separate front-proxy CA for the
    # request-header authentication of aggregated API servers (metrics-server, prometheus-adapter).
    for ca, cn in (("ca", "batchfill-dev-ca"), ("front-proxy-ca", "batchfill-dev-front-proxy-ca")):
        _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{ca}.key")
        _openssl(pki, "req", "-x509", "-new", "-key", f"{ca}.key", "-config", "ca.cnf", "-extensions", "v3_ca",
                 "-subj", f"/CN={cn}", "-days", str(days), "-out", f"{ca}.crt")  # fmt: skip
    sans = ",".join(
        ["IP:127.0.0.1", "DNS:localhost", "IP:10.96.0.1", "DNS:kubernetes", "DNS:kubernetes.default",
         "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"]
    )  # fmt: skip
    leaf_ku = "keyUsage = critical,digitalSignature,keyEncipherment\n"
    _sign(pki, "apiserver", "/CN=kube-apiserver", f"subjectAltName = {sans}\nextendedKeyUsage = serverAuth\n" + leaf_ku,
          days)  # fmt: skip
    _sign(pki, "admin", "/O=system:masters/CN=batchfill-admin", "extendedKeyUsage = clientAuth\n" + leaf_ku, days)
    _sign(pki, "front-proxy-client", "/CN=front-proxy-client", "extendedKeyUsage = clientAuth\n" + leaf_ku, days,
          ca="front-proxy-ca")  # fmt: skip
    _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
    _openssl(pki, "ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    for key in pki.glob("*.key"):
        key.chmod(0o600)


def _sign(pki: Path, name: str, subject: str, ext: str, days: int, ca: str = "ca") -> None:
    (pki / f"{name}.ext").write_text(ext + "authorityKeyIdentifier = keyid\n")
    _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key")
    _openssl(pki, "req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr")
    _openssl(pki, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", str(days), "-extfile", f"{name}.ext", "-out", f"{name}.crt")  # fmt: skip


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


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


def _cluster_of(kubeconfig: Path) -> tuple[str, str, str]:
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
        ca = _b64(ca_path)
    return str(cluster["server"]), str(ca or ""), str(ctx_name)


# ---------------------------------------------------------------------------------------------------------
# Health checks
# ---------------------------------------------------------------------------------------------------------
def _get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except (OSError, ssl.SSLError):
        return 0, ""


def _admin_ssl(pki: Path, verify: bool = True) -> ssl.SSLContext:
    if verify:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    else:  # kube-scheduler and KCM serve /healthz with self-signed certificates
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def _api_ready(run_dir: Path, server: str) -> bool:
    status, _ = _get(f"{server}/readyz", _admin_ssl(run_dir / "pki"))
    return status == 200


# ---------------------------------------------------------------------------------------------------------
# up / down
# ---------------------------------------------------------------------------------------------------------
def _help_has(binary: Path, flag: str) -> bool:
    r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, check=False, timeout=30)
    return flag in (r.stdout + r.stderr)


def _commands(bins: Path, run_dir: Path, ports: Mapping[str, int], stages: Path) -> dict[str, list[str]]:
    pki, kc = run_dir / "pki", str(run_dir / KUBECONFIG_NAME)
    server = f"https://{LOOPBACK}:{ports['apiserver']}"
    etcd_url, peer_url = f"http://{LOOPBACK}:{ports['etcd']}", f"http://{LOOPBACK}:{ports['etcd-peer']}"
    etcd = [
        str(bins / "etcd"), "--name=dev", f"--data-dir={run_dir / 'etcd-data'}",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=dev={peer_url}", "--log-level=warn",
    ]  # fmt: skip
    if _help_has(bins / "etcd", "--unsafe-no-fsync"):
        etcd.append("--unsafe-no-fsync=true")
    apiserver = [
        str(bins / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}", f"--secure-port={ports['apiserver']}",
        f"--cert-dir={pki}", f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}", f"--client-ca-file={pki / 'ca.crt'}",
        f"--service-account-issuer={server}", f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        # 127.0.0.1 is not a valid endpoint of the `kubernetes` Service; nothing in the cluster dials it.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
    ]  # fmt: skip
    delegated = [
        f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--leader-elect=false", f"--bind-address={LOOPBACK}",
    ]  # fmt: skip
    scheduler = [
        str(bins / "kube-scheduler"), *delegated, f"--secure-port={ports['scheduler']}",
        f"--cert-dir={run_dir / 'pki' / 'kube-scheduler'}",
    ]  # fmt: skip
    kcm = [
        str(bins / "kube-controller-manager"), *delegated, f"--secure-port={ports['controller-manager']}",
        f"--cert-dir={run_dir / 'pki' / 'kube-controller-manager'}",
        f"--root-ca-file={pki / 'ca.crt'}", f"--service-account-private-key-file={pki / 'sa.key'}",
        "--use-service-account-credentials=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--node-monitor-period=2s",
    ]  # fmt: skip
    kwok = [
        str(bins / "kwok"), f"--kubeconfig={kc}", "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-lease-duration-seconds=40", f"--cidr={POD_CIDR}",
        f"--config={stages / 'node' / 'fast' / 'node-initialize.yaml'}",
        f"--config={stages / 'node' / 'heartbeat-with-lease' / 'node-heartbeat-with-lease.yaml'}",
        f"--config={stages / 'pod' / 'fast' / 'pod-ready.yaml'}",
        f"--config={stages / 'pod' / 'fast' / 'pod-complete.yaml'}",
        f"--config={stages / 'pod' / 'fast' / 'pod-delete.yaml'}",
    ]  # fmt: skip
    return {"etcd": etcd, "kube-apiserver": apiserver, "kube-scheduler": scheduler,
            "kube-controller-manager": kcm, "kwok": kwok}  # fmt: skip


def _wait(
    what: str,
    check: Callable[[], bool],
    timeout_s: float,
    run_dir: Path,
    state: _State,
    watch: Sequence[str],
) -> float:
    """Poll ``check`` until true; fail early when a watched component exits. Returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        for name in watch:
            p = state.processes.get(name)
            if p is not None and _gone(p):
                log = run_dir / "logs" / f"{name}.log"
                raise DevClusterError(f"{name} exited while waiting for {what}; log {log}\n{_tail(log, 25)}")
        with contextlib.suppress(Exception):
            if check():
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            logs = "\n".join(f"--- {n} ({run_dir / 'logs' / f'{n}.log'})\n{_tail(run_dir / 'logs' / f'{n}.log', 12)}"
                             for n in watch)  # fmt: skip
            raise DevClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs}")
        time.sleep(0.25)


def api_client(kubeconfig: str | os.PathLike[str]) -> Any:
    """A ``kubernetes.client.ApiClient`` for ``kubeconfig`` (its current context)."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


def fake_node(name: str, index: int, gpus: int) -> dict[str, Any]:
    """A kwok-managed Node; with ``gpus > 0`` it advertises ``nvidia.com/gpu`` and GPU-feature-discovery labels."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        FAKE_NODE_LABEL: "true",
    }
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    if gpus > 0:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.product": GPU_PRODUCT,
            "nvidia.com/gpu.memory": "81920",
            "node.kubernetes.io/instance-type": f"fake-{gpus}x-a100",
        }
        capacity[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": POD_CIDR_TEMPLATE.format(index=index), "podCIDRs": [POD_CIDR_TEMPLATE.format(index=index)]},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "addresses": [
                {"type": "InternalIP", "address": f"{NODE_IP_PREFIX}{index + 1}"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def desired_nodes(gpu_nodes: int, gpus_per_node: int, cpu_nodes: int = 0) -> list[dict[str, Any]]:
    nodes = [fake_node(f"gpu-node-{i}", i, gpus_per_node) for i in range(gpu_nodes)]
    nodes += [fake_node(f"cpu-node-{i}", gpu_nodes + i, 0) for i in range(cpu_nodes)]
    return nodes


def ensure_fake_nodes(kubeconfig: Path, nodes: Sequence[Mapping[str, Any]]) -> None:
    """Create the fake nodes that are missing, fix the capacity of existing ones, delete other fake nodes."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with api_client(kubeconfig) as api:
        core: Any = client.CoreV1Api(api)
        wanted = {n["metadata"]["name"]: n for n in nodes}
        existing = {n.metadata.name: n for n in core.list_node(label_selector=f"{FAKE_NODE_LABEL}=true").items}
        for name, node in wanted.items():
            if name not in existing:
                try:
                    core.create_node(node)
                    continue
                except ApiException as e:
                    if e.status != 409:
                        raise
            cap = node["status"]["capacity"]
            cur = existing.get(name)
            if cur is None or dict(cur.status.capacity or {}) != cap:
                core.patch_node(name, {"metadata": {"labels": node["metadata"]["labels"]}})
                core.patch_node_status(
                    name, {"status": {"capacity": cap, "allocatable": node["status"]["allocatable"]}}
                )
        for name in set(existing) - set(wanted):
            with contextlib.suppress(ApiException):
                core.delete_node(name)


def _nodes_ready(kubeconfig: Path, names: set[str]) -> bool:
    """Every named node is Ready, has no NoSchedule/NoExecute taint and shows its capacity as allocatable."""
    from kubernetes import client

    with api_client(kubeconfig) as api:
        items: list[Any] = client.CoreV1Api(api).list_node().items
    nodes = {n.metadata.name: n for n in items}
    for name in names:
        n = nodes.get(name)
        if n is None or not n.status or not n.status.conditions:
            return False
        if not any(c.type == "Ready" and c.status == "True" for c in n.status.conditions):
            return False
        if any(t.effect in ("NoSchedule", "NoExecute") for t in (n.spec.taints or [])):
            return False  # node.kubernetes.io/not-ready until the node lifecycle controller sees Ready
    return True


def _default_sa_exists(kubeconfig: Path) -> bool:
    from kubernetes import client

    with api_client(kubeconfig) as api:
        client.CoreV1Api(api).read_namespaced_service_account("default", "default")
    return True


def _check_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise DevClusterError(f"{run_dir} is not a directory")
    if run_dir.exists() and any(run_dir.iterdir()) and not (run_dir / MARKER).exists():
        raise DevClusterError(f"{run_dir} is not empty and is not a dev-cluster run directory; pick another one")


def _prepare_run_dir(run_dir: Path) -> None:
    _check_run_dir(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / MARKER).write_text("batchfill dev cluster run directory; `batchfill dev-cluster down` removes it\n")


def cluster_status(run_dir: Path) -> ClusterInfo | None:
    """The running cluster recorded in ``run_dir`` if every component is alive and the API is ready."""
    state = _State.load(run_dir)
    if state is None or set(state.processes) != set(COMPONENTS):
        return None
    if not all(_alive(p) for p in state.processes.values()) or not _api_ready(run_dir, state.server):
        return None
    return state.info(run_dir, reused=True)


def cluster_up(
    run_dir: str | os.PathLike[str],
    gpu_nodes: int = 2,
    gpus_per_node: int = 4,
    *,
    cpu_nodes: int = 0,
    console: Console | None = None,
    quiet: bool = False,
    build: bool = True,
    die_with_parent: bool = False,
    timeout_s: float = 240.0,
) -> ClusterInfo:
    """Start the local cluster in ``run_dir`` (or reuse the one running there) and return where it is.

    Args:
        gpu_nodes, gpus_per_node: fake GPU nodes ``gpu-node-<i>`` with ``nvidia.com/gpu`` capacity.
        cpu_nodes: fake nodes ``cpu-node-<i>`` without GPUs.
        build: build missing binaries with scripts/build-k8s.sh (else raise :class:`BinariesUnavailableError`).
        die_with_parent: the components get SIGTERM when the calling thread exits (test sessions); the CLI's
            ``up`` leaves them running until ``down``.
        timeout_s: how long to wait for the API server (each later wait gets at most this too).

    A cluster recorded in ``run_dir`` that is fully alive and ready is reused (its fake nodes are brought to
    the requested set); anything else there is stopped by PID and the directory is started afresh. On a
    failure every started component is stopped and the logs stay in ``run_dir/logs``.
    """
    run = Path(run_dir).resolve()
    con = _console(console, quiet)
    t0 = time.monotonic()
    nodes = desired_nodes(gpu_nodes, gpus_per_node, cpu_nodes)
    names = {n["metadata"]["name"] for n in nodes}

    _check_run_dir(run)
    existing = cluster_status(run)
    if existing is not None:
        state = _State.load(run)
        assert state is not None
        with con.status("reusing the running dev cluster; checking its nodes"):
            ensure_fake_nodes(existing.kubeconfig, nodes)
            _wait("fake nodes Ready", lambda: _nodes_ready(existing.kubeconfig, names), timeout_s, run, state,
                  list(COMPONENTS))  # fmt: skip
        state.gpu_nodes, state.gpus_per_node, state.cpu_nodes = gpu_nodes, gpus_per_node, cpu_nodes
        state.save(run)
        existing.startup_s = time.monotonic() - t0
        con.log(f"reusing the dev cluster at {existing.server} ({run})")
        return existing
    old = _State.load(run)
    if old is not None:
        _stop_cluster(old.processes)

    bins = ensure_binaries(con, build=build)
    stages = kwok_stages_dir()
    _prepare_run_dir(run)
    ports = dict(
        zip(("etcd", "etcd-peer", "apiserver", "scheduler", "controller-manager"), _free_ports(5), strict=True)
    )
    server = f"https://{LOOPBACK}:{ports['apiserver']}"
    kubeconfig = run / KUBECONFIG_NAME
    state = _State(server=server, kubeconfig=str(kubeconfig), bin_dir=str(bins), ports=ports,
                   gpu_nodes=gpu_nodes, gpus_per_node=gpus_per_node, cpu_nodes=cpu_nodes)  # fmt: skip
    state.save(run)
    pki = run / "pki"
    try:
        with con.status("creating certificates") as status:
            make_pki(pki)
            write_kubeconfig(kubeconfig, server, _b64(pki / "ca.crt"), "batchfill-admin",
                             {"client-certificate-data": _b64(pki / "admin.crt"),
                              "client-key-data": _b64(pki / "admin.key")})  # fmt: skip
            cmds = _commands(bins, run, ports, stages)

            def start(name: str) -> None:
                state.processes[name] = _spawn(name, cmds[name], run, die_with_parent)
                state.save(run)

            def step(msg: str, what: str, check: Callable[[], bool], watch: Sequence[str]) -> None:
                status.update(msg)
                dt = _wait(what, check, timeout_s, run, state, watch)
                con.log(f"[green]✓[/] {what} ({dt:.1f} s)")

            admin = _admin_ssl(pki)
            loose = _admin_ssl(pki, verify=False)
            start("etcd")
            step("starting etcd", "etcd healthy",
                 lambda: _get(f"http://{LOOPBACK}:{ports['etcd']}/health")[0] == 200, ["etcd"])  # fmt: skip
            start("kube-apiserver")
            step("starting kube-apiserver (15-60 s on 2 cores)", "kube-apiserver ready",
                 lambda: _get(f"{server}/readyz", admin)[0] == 200, ["etcd", "kube-apiserver"])  # fmt: skip
            start("kube-scheduler")
            start("kube-controller-manager")
            start("kwok")
            step("starting kube-scheduler", "kube-scheduler healthy",
                 lambda: _get(f"https://{LOOPBACK}:{ports['scheduler']}/healthz", loose)[0] == 200,
                 list(COMPONENTS))  # fmt: skip
            step("starting kube-controller-manager", "kube-controller-manager healthy",
                 lambda: _get(f"https://{LOOPBACK}:{ports['controller-manager']}/healthz", loose)[0] == 200,
                 list(COMPONENTS))  # fmt: skip
            status.update("creating fake nodes")
            ensure_fake_nodes(kubeconfig, nodes)
            step(f"waiting for {len(names)} fake nodes (kwok) to be Ready and schedulable",
                 f"{len(names)} fake nodes Ready", lambda: _nodes_ready(kubeconfig, names),
                 list(COMPONENTS))  # fmt: skip
            step("waiting for the default ServiceAccount (controller-manager)", "ServiceAccount default/default",
                 lambda: _default_sa_exists(kubeconfig), list(COMPONENTS))  # fmt: skip
    except BaseException:
        survivors = _stop_cluster(state.processes)
        if survivors:
            con.log(f"[red]could not stop {', '.join(survivors)}; PIDs in {run / STATE_FILE}")
        raise
    info = state.info(run, startup_s=time.monotonic() - t0)
    con.log(f"dev cluster up in {info.startup_s:.1f} s at {server}")
    return info


def cluster_down(run_dir: str | os.PathLike[str], *, console: Console | None = None, quiet: bool = False) -> None:
    """Stop every component recorded in ``run_dir`` by its PID and remove the directory.

    Raises :class:`DevClusterError` when a component survives SIGKILL (the directory is then kept), or when
    ``run_dir`` exists but was not made by :func:`cluster_up`.
    """
    run = Path(run_dir).resolve()
    con = _console(console, quiet)
    if not run.exists():
        return
    if not (run / MARKER).exists():
        raise DevClusterError(f"{run} is not a dev-cluster run directory; not touching it")
    state = _State.load(run)
    if state is not None:
        with con.status("stopping the dev cluster"):
            survivors = _stop_cluster(state.processes)
        if survivors:
            raise DevClusterError(f"{', '.join(survivors)} did not stop; PIDs in {run / STATE_FILE}")
    shutil.rmtree(run)
    con.log(f"dev cluster stopped; removed {run}")


def restart_components(
    info: ClusterInfo,
    names: Sequence[str] = ("etcd", "kube-apiserver"),
    *,
    down_s: float = 0.0,
    timeout_s: float = 180.0,
    die_with_parent: bool = True,
) -> float:
    """Kill (SIGKILL) the named components of a running dev cluster and start them again with the same flags,
    ports and data directory, as a crash and a supervisor's restart would. Returns the seconds from the kill
    until the API server answers ``/readyz`` again.

    ``down_s``: seconds to stay down between the kill and the restart. Raises :class:`DevClusterError` when a
    component cannot be stopped or does not come back within ``timeout_s``.
    """
    run = info.run_dir
    state = _State.load(run)
    if state is None:
        raise DevClusterError(f"{run} has no dev-cluster state")
    unknown = [n for n in names if n not in state.processes]
    if unknown:
        raise DevClusterError(f"unknown components {unknown}; known: {sorted(state.processes)}")
    t0 = time.monotonic()
    for n in names:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(state.processes[n].pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and not all(_gone(state.processes[n]) for n in names):
        time.sleep(0.05)
    survivors = [n for n in names if not _gone(state.processes[n])]
    if survivors:
        raise DevClusterError(f"{', '.join(survivors)} survived SIGKILL")
    time.sleep(down_s)
    cmds = _commands(Path(state.bin_dir), run, state.ports, kwok_stages_dir())
    for n in (c for c in COMPONENTS if c in names):  # etcd before the API server
        state.processes[n] = _spawn(n, cmds[n], run, die_with_parent)
        info.pids[n] = state.processes[n].pid
    state.save(run)
    admin = _admin_ssl(run / "pki")
    _wait("kube-apiserver ready after a restart", lambda: _get(f"{state.server}/readyz", admin)[0] == 200,
          timeout_s, run, state, list(names))  # fmt: skip
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------------------
# ServiceAccount kubeconfig (the operator does not run as system:masters)
# ---------------------------------------------------------------------------------------------------------
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
    server, ca, _ = _cluster_of(admin)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_kubeconfig(out, server, ca, f"system:serviceaccount:{namespace}:{name}", {"token": token},
                            name=f"{name}@{namespace}")  # fmt: skip


def kubectl(info_or_kubeconfig: ClusterInfo | str | os.PathLike[str], *args: str, check: bool = True,
            timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run the cluster's kubectl (falls back to the one on PATH) against a kubeconfig."""
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


# ---------------------------------------------------------------------------------------------------------
# CLI-facing entry point (`batchfill dev-cluster up|down|status|build`)
# ---------------------------------------------------------------------------------------------------------
def _print_info(info: ClusterInfo, out: Console) -> None:
    from kubernetes import client

    out.print(f"server:     {info.server}")
    out.print(f"kubeconfig: {info.kubeconfig}")
    out.print(f"kubectl:    {info.kubectl}")
    out.print(f"run dir:    {info.run_dir}   (logs in logs/, PIDs in {STATE_FILE})")
    with api_client(info.kubeconfig) as api:
        items: list[Any] = client.CoreV1Api(api).list_node().items
        for n in items:
            gpus = (n.status.allocatable or {}).get(GPU_RESOURCE, "0")
            out.print(f"node:       {n.metadata.name}  {GPU_RESOURCE}={gpus}")
    out.print("")
    out.print(f"export KUBECONFIG={info.kubeconfig} PATH={info.bin_dir}:$PATH")


def dev_cluster_main(
    action: str,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    gpu_nodes: int = 2,
    gpus_per_node: int = 4,
    cpu_nodes: int = 0,
    build: bool = True,
    console: Console | None = None,
) -> int:
    """``up`` (start or reuse), ``down`` (stop, remove run dir), ``status``, ``build`` (binaries only).

    Progress goes to stderr; the kubeconfig and the ``export`` line to stdout. Returns the exit code:
    0 ok, 1 failure (message printed), 2 unknown action, 3 ``status`` found no running cluster.
    """
    err = console or Console(stderr=True, log_path=False)
    out = Console(highlight=False, soft_wrap=True)
    run = Path(run_dir) if run_dir is not None else default_run_dir()
    try:
        if action == "up":
            info = cluster_up(run, gpu_nodes, gpus_per_node, cpu_nodes=cpu_nodes, console=err, build=build)
            _print_info(info, out)
            err.print(f"stop it with: batchfill dev-cluster down{'' if run_dir is None else f' --run-dir {run}'}")
            return 0
        if action == "down":
            cluster_down(run, console=err)
            return 0
        if action == "status":
            status = cluster_status(run.resolve())
            if status is None:
                err.print(f"no running dev cluster in {run}")
                return 3
            _print_info(status, out)
            return 0
        if action == "build":
            out.print(str(ensure_binaries(err, build=True)))
            return 0
    except DevClusterError as e:
        err.print(f"[red]dev-cluster {action} failed:[/] {e}", markup=True, highlight=False)
        return 1
    err.print(f"unknown dev-cluster action {action!r} (up, down, status, build)")
    return 2


@contextlib.contextmanager
def running_cluster(run_dir: str | os.PathLike[str], **kwargs: Any) -> Iterator[ClusterInfo]:
    """``cluster_up`` ... ``cluster_down`` as a context manager (the demo and tests)."""
    info = cluster_up(run_dir, **kwargs)
    try:
        yield info
    finally:
        cluster_down(run_dir, console=kwargs.get("console"), quiet=bool(kwargs.get("quiet", False)))


if __name__ == "__main__":  # python -m batchfill.testbed.devcluster up|down|status|build [--run-dir DIR]
    import argparse

    ap = argparse.ArgumentParser(prog="python -m batchfill.testbed.devcluster")
    ap.add_argument("action", choices=["up", "down", "status", "build"])
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--gpu-nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--cpu-nodes", type=int, default=0)
    a = ap.parse_args()
    sys.exit(dev_cluster_main(a.action, run_dir=a.run_dir, gpu_nodes=a.gpu_nodes, gpus_per_node=a.gpus_per_node,
                              cpu_nodes=a.cpu_nodes))  # fmt: skip
