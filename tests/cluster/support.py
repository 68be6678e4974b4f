"""Helpers of the cluster tests: the ``Kube`` handle the ``kube`` fixture yields, waiting, GPU accounting, and the
operator as a subprocess that can be killed and started again."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.api.reasons import ScalingReason
from batchfill.testbed import devcluster
from batchfill.testbed.devcluster import GPU_RESOURCE

T = TypeVar("T")

#: The scale-out reasons that rest on evidence from the running replicas (rule 4 of ``policy.scaling``).
SCALE_OUT_ON_EVIDENCE = frozenset(
    {ScalingReason.SCALE_OUT_SATURATED, ScalingReason.SCALE_OUT_SLA_AT_RISK, ScalingReason.SCALE_OUT_LOW_HEADROOM}
)


def in_ci() -> bool:
    """``CI`` is set (and not to 0/false): missing prerequisites fail instead of skipping."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason`` on a developer machine; fail under CI, where nothing may skip silently."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


@dataclass
class Kube:
    """The cluster under test: the local dev cluster, or an existing one (``BATCHFILL_USE_EXISTING_CLUSTER=1``)."""

    kubeconfig: Path
    existing: bool
    info: devcluster.ClusterInfo | None = None
    _api: Any = field(default=None, repr=False)

    @property
    def api(self) -> Any:
        if self._api is None:
            self._api = devcluster.api_client(self.kubeconfig)
        return self._api

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> Any:
        return client.AppsV1Api(self.api)

    @property
    def rbac(self) -> Any:
        return client.RbacAuthorizationV1Api(self.api)

    def kubectl(self, *args: str, check: bool = True) -> Any:
        return devcluster.kubectl(self.info or self.kubeconfig, *args, check=check)

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None


class Operator:
    """``batchfill run`` with the install's ServiceAccount (its RBAC, not the admin's) as a subprocess that a test can
    kill (SIGKILL) and start again, as a Deployment's kubelet would restart it.

    Each run logs to ``<work>/<log_name>-<run>.log``; :meth:`logs` is all runs' logs. ``env``, ``args`` and
    ``server`` are passed to every run (:func:`batchfill.testbed.install.operator_as_service_account`).
    """

    def __init__(
        self,
        kube: Kube,
        work: Path,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        log_name: str = "operator",
        server: str = "",
    ) -> None:
        self.kube, self.work, self.env, self.args, self.log_name = kube, work, env, args, log_name
        self.server = server  # the API server URL the operator uses (a proxy), "" for the kubeconfig's
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stack = ExitStack()

    def log_path(self, run: int) -> Path:
        return self.work / f"{self.log_name}-{run}.log"

    def start(self) -> None:
        from batchfill.testbed.install import operator_as_service_account

        self.runs += 1
        self._stack = ExitStack()
        self.proc = self._stack.enter_context(
            operator_as_service_account(
                self.kube.kubeconfig,
                self.work,
                self.log_path(self.runs),
                self.env,
                args=self.args,
                server=self.server,
            )
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no cleanup handler runs
        self.proc.wait(timeout=30)
        self._stack.close()

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 30 s) if running; nothing if killed already."""
        self._stack.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self, run: int | None = None) -> str:
        """The log of one run (default: the current one)."""
        path = self.log_path(self.runs if run is None else run)
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(self.log(i) for i in range(1, self.runs + 1))


def wait_for(what: str, fn: Callable[[], T | None], timeout_s: float = 60.0, interval_s: float = 0.5) -> T:
    """Call ``fn`` until it returns something truthy (API errors count as "not yet"); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = fn()
            if value:
                return value
            last = value
        except ApiException as e:
            last = f"API error {e.status}: {e.reason}"
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; last value: {last!r}")
        time.sleep(interval_s)


def node_ready(node: Any) -> bool:
    conds = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


def schedulable(node: Any) -> bool:
    if node.spec.unschedulable:
        return False
    return not any(t.effect in ("NoSchedule", "NoExecute") for t in (node.spec.taints or []))


def gpus_of(node: Any) -> int:
    return int((node.status.allocatable or {}).get(GPU_RESOURCE, "0"))


def pod_gpus(pod: Any) -> int:
    total = 0
    for c in pod.spec.containers or []:
        res = c.resources
        limits = (res.limits if res else None) or {}
        requests = (res.requests if res else None) or {}
        total += int(limits.get(GPU_RESOURCE) or requests.get(GPU_RESOURCE) or 0)
    return total


def pod_holds_resources(pod: Any) -> bool:
    """Bound and not finished: the scheduler still counts its requests against its node."""
    return bool(pod.spec.node_name) and pod.status.phase not in ("Succeeded", "Failed")


def gpu_nodes(kube: Kube) -> list[Any]:
    """Ready, schedulable nodes that advertise ``nvidia.com/gpu``."""
    return [n for n in kube.core.list_node().items if gpus_of(n) > 0 and node_ready(n) and schedulable(n)]


def free_gpus(kube: Kube) -> dict[str, int]:
    """Free ``nvidia.com/gpu`` per schedulable GPU node (allocatable minus what bound, unfinished pods hold)."""
    free = {n.metadata.name: gpus_of(n) for n in gpu_nodes(kube)}
    for pod in kube.core.list_pod_for_all_namespaces().items:
        if pod_holds_resources(pod) and pod.spec.node_name in free:
            free[pod.spec.node_name] -= pod_gpus(pod)
    return free


def terminating_gpu_pods(kube: Kube) -> list[str]:
    return [
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in kube.core.list_pod_for_all_namespaces().items
        if p.metadata.deletion_timestamp and pod_gpus(p) > 0 and pod_holds_resources(p)
    ]


def require_gpus(kube: Kube) -> dict[str, int]:
    """Free GPUs per node, after GPUs held by terminating pods are released; skip/fail when there are none."""
    wait_for("terminating GPU pods to go", lambda: not terminating_gpu_pods(kube) or None, 120)
    free = {k: v for k, v in free_gpus(kube).items() if v > 0}
    if not free:
        skip_or_fail(
            "no schedulable node has a free nvidia.com/gpu; on kind, fake it with "
            "kubectl patch node NODE --subresource=status --type=merge "
            '-p \'{"status":{"capacity":{"nvidia.com/gpu":"4"},"allocatable":{"nvidia.com/gpu":"4"}}}\''
        )
    return free


@contextmanager
def temp_namespace(kube: Kube, prefix: str = "bf-test-", delete_timeout_s: float = 120.0) -> Iterator[str]:
    """A fresh namespace whose ``default`` ServiceAccount exists (pods need it); deleted and waited for after."""
    ns = kube.core.create_namespace({"metadata": {"generateName": prefix, "labels": {"batchfill.io/test": "true"}}})
    name = str(ns.metadata.name)
    try:
        wait_for(f"ServiceAccount {name}/default", lambda: kube.core.read_namespaced_service_account("default", name))
        yield name
    finally:
        with suppress(ApiException):
            kube.core.delete_namespace(name)
        wait_for(f"namespace {name} to be deleted", lambda: namespace_gone(kube, name), delete_timeout_s)


def namespace_gone(kube: Kube, name: str) -> bool:
    try:
        kube.core.read_namespace(name)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def pause_deployment(name: str, replicas: int, gpus: int = 0, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Deployment of pause containers (kwok runs none; kind's nodes already have the image)."""
    labels = labels or {"app": name}
    resources: dict[str, Any] = {"requests": {"cpu": "10m", "memory": "16Mi"}}
    if gpus:
        # Extended resources go in limits (requests default to them; integers only), as Triton pods do.
        resources["limits"] = {GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "imagePullPolicy": "IfNotPresent",
                            "resources": resources,
                        }
                    ],
                },
            },
        },
    }


def pods_of(kube: Kube, namespace: str, selector: str) -> list[Any]:
    return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)


def pod_condition(pod: Any, type_: str) -> Any:
    return next((c for c in (pod.status.conditions or []) if c.type == type_), None)


def model_volume(kube: Kube, ns: str) -> None:
    """A statically bound PersistentVolume + claim `models` (the repository the BatchedModels mount)."""
    pv = f"models-{ns}"
    kube.core.create_persistent_volume(
        {
            "metadata": {"name": pv, "labels": {"batchfill.io/test": "true"}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "",
                "hostPath": {"path": "/tmp/batchfill-models"},
                "claimRef": {"namespace": ns, "name": "models"},
            },
        }
    )
    kube.core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": "models"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    until(
        "the model volume to bind",
        lambda: kube.core.read_namespaced_persistent_volume_claim("models", ns),
        lambda c: c.status.phase == "Bound",
        60,
    )


def until(what: str, fetch: Any, ok: Any, timeout_s: float = 60.0) -> Any:
    """Poll ``fetch()`` until ``ok(value)``; return that value. On timeout the failure shows the last value
    fetched (its repr cut at 3,000 characters), not only that it did not pass."""
    seen: list[Any] = []

    def probe() -> Any:
        value = fetch()
        seen[:] = [value]
        return value if ok(value) else None

    try:
        return wait_for(what, probe, timeout_s)
    except pytest.fail.Exception as e:
        if not seen:
            raise
        pytest.fail(f"{e.msg}; last fetched: {repr(seen[0])[:3000]}")


def rbac_denials(operator_log: str, namespace: str = "batchfill-system", account: str = "batchfill") -> list[str]:
    """Log lines where the API server denied the operator's ServiceAccount (RBAC denials name the user).

    "forbidden ... because it is being terminated" (events posted into a namespace a test is deleting) is the
    namespace lifecycle, not a missing permission, and does not name the user.
    """
    user = f'User "system:serviceaccount:{namespace}:{account}"'
    return [line for line in operator_log.splitlines() if user in line]


class DenyPolicy:
    """A ValidatingAdmissionPolicy and its binding that refuse ``operations`` on ``resources`` (``group/resource``
    or ``group/resource/subresource``) in ``namespace`` with ``message``: the real API server refusing a write, as
    a platform team's policy would. ``remove()`` is idempotent."""

    def __init__(
        self, kube: Kube, namespace: str, name: str, resources: list[str], operations: list[str], message: str
    ):
        self.adm = client.AdmissionregistrationV1Api(kube.api)
        self.name, self.message = name, message
        rules = [
            {"apiGroups": [r.split("/", 1)[0]], "apiVersions": ["v1"], "operations": operations,
             "resources": [r.split("/", 1)[1]]}
            for r in resources
        ]  # fmt: skip
        self.adm.create_validating_admission_policy(
            {
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": rules},
                    "validations": [{"expression": "false", "message": message}],
                },
            }
        )
        self.adm.create_validating_admission_policy_binding(
            {
                "metadata": {"name": name},
                "spec": {
                    "policyName": name,
                    "validationActions": ["Deny"],
                    "matchResources": {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                    },
                },
            }
        )

    def remove(self) -> None:
        for delete in (
            self.adm.delete_validating_admission_policy_binding,
            self.adm.delete_validating_admission_policy,
        ):
            try:
                delete(self.name)
            except ApiException as e:
                if e.status != 404:
                    raise


def require_real_node_tools() -> None:
    """Skip (fail under CI) unless this runs as root with the tools a real node needs."""
    if os.geteuid() != 0:
        skip_or_fail("real nodes need root (network namespaces, mounts, cgroups)")
    missing = [t for t in ("containerd", "runc", "ctr", "umoci", "skopeo", "ip") if shutil.which(t) is None]
    if missing:
        skip_or_fail(f"real nodes need {missing} (the Makefile's DEB_PACKAGES)")


def write_sleep_model(
    repository: Path, name: str, alpha_ms: float, beta_ms: float, gpu_lock: str | None = None
) -> Path:
    """The Python-backend sleep model as ``<repository>/<name>`` sleeping ``alpha_ms + beta_ms * b`` per batch of
    ``b``: the two knobs' defaults are set in its model.py, since a config the operator renders carries no model
    parameters. ``gpu_lock``: a path inside the pod every execution holds an exclusive lock on (the sleep model's
    ``gpu_lock``), so every model loaded in one pod runs one batch at a time: one GPU emulated per pod, the
    execution model of :mod:`batchfill.sim.shared`. Its config.pbtxt is a placeholder (the operator's config
    replaces it). Returns the model.py."""
    from batchfill.testbed.model_repo import write_model

    model_py = write_model(repository, name, "# replaced by the operator's config\n", "sleep_model") / "1" / "model.py"
    source = model_py.read_text()
    for knob, value in (("alpha_ms", alpha_ms), ("beta_ms", beta_ms)):
        assert f'param("{knob}", 0.0)' in source, f"the sleep model no longer reads {knob} with default 0.0"
        source = source.replace(f'param("{knob}", 0.0)', f'param("{knob}", {value})')
    if gpu_lock is not None:
        unset = 'params.get("gpu_lock", {}).get("string_value", "")'
        assert unset in source, "the sleep model no longer reads gpu_lock with default empty"
        source = source.replace(unset, f"({unset} or {gpu_lock!r})")
    model_py.write_text(source)
    return model_py


@dataclass
class RealNodeLab:
    """What :func:`real_node_lab` yields: the cluster's ``Kube``, the real node's name, the operator, Prometheus."""

    kube: Kube
    node: str
    operator: Operator
    prometheus: Any
    work: Path


@contextmanager
def real_node_lab(
    ns: str,
    gpus: int,
    write_files: Callable[[Path], None],
    monitors: list[dict[str, Any]],
    operator_env: dict[str, str],
    prefix: str = "bf-rn-",
) -> Iterator[RealNodeLab]:
    """A cluster of its own with one real node (kubelet + containerd) advertising ``gpus`` fake ``nvidia.com/gpu``,
    the Triton CPU image imported on it, the operator's install (RBAC, CRDs), a hostPath model volume in ``ns``
    holding what ``write_files`` writes, a real Prometheus discovering ``monitors``, and the operator running as its
    ServiceAccount with ``operator_env`` + ``BATCHFILL_PROMETHEUS_URL`` + ``BATCHFILL_TRITON_CPU_IMAGE``. On exit:
    the operator stopped, no RBAC denial in its log, the cluster down."""
    from rich.console import Console

    from batchfill.testbed.gpu_plugin import ensure_fake_gpu_plugin
    from batchfill.testbed.images import ensure_triton_image
    from batchfill.testbed.install import install_operator_rbac, model_volume, server_side_apply
    from batchfill.testbed.node import import_image, real_nodes
    from batchfill.testbed.prometheus_k8s import KubernetesPrometheus

    require_real_node_tools()
    console = Console(stderr=True, quiet=True)
    devcluster.ensure_binaries(console, kubelet=True)
    image = ensure_triton_image(console)
    ensure_fake_gpu_plugin(console)
    # short: the node's unix sockets live under it (at most 104 bytes); world-readable: Triton's uid reads the
    # model files from the hostPath volume
    import tempfile

    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    work.chmod(0o755)
    files = work / "volume"
    files.mkdir()
    write_files(files)
    cluster = work / "cluster"
    try:
        info = devcluster.cluster_up(
            cluster, 0, 0, real_nodes=1, real_node_gpus=gpus, die_with_parent=True, quiet=True, build=False
        )
        node = real_nodes(cluster)[0]
        import_image(node, image.path)
        kube = Kube(kubeconfig=info.kubeconfig, existing=False, info=info)
        install_operator_rbac(info.kubeconfig, work)
        server_side_apply(info.kubeconfig, model_volume(ns, "models", files), work / "volume.yaml")
        prometheus = KubernetesPrometheus(
            monitors, info.kubeconfig, scrape_interval_s=2, work_dir=work / "prom", startup_timeout_s=60
        )
        prometheus.start()
        env = {**operator_env, "BATCHFILL_PROMETHEUS_URL": prometheus.url}
        env["BATCHFILL_TRITON_CPU_IMAGE"] = image.reference
        operator = Operator(kube, work, env=env)
        operator.start()
        try:
            yield RealNodeLab(kube, node.name, operator, prometheus, work)
        finally:
            operator.stop()
            prometheus.stop()
            kube.close()
            denied = rbac_denials(operator.logs())
            assert not denied, denied[:5]
    finally:
        devcluster.cluster_down(cluster, quiet=True)


class Sampler:
    """Calls :meth:`sample` every ``period_s`` in a daemon thread between ``__enter__`` and ``__exit__``; an
    exception in one sample (an API hiccup, the operator restarting) skips that sample only."""

    period_s = 1.0

    def sample(self) -> None:
        raise NotImplementedError

    def _follow(self, stop: threading.Event) -> None:
        while not stop.wait(self.period_s):
            try:
                self.sample()
            except Exception:  # the next sample
                continue

    def __enter__(self) -> Self:
        self._stopping = threading.Event()
        self._sampler = threading.Thread(target=self._follow, args=(self._stopping,), daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._sampler.join(timeout=30)
