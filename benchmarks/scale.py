"""The operator at scale: N BatchedModels in M namespaces on the real local control plane (default 1,000 in 20).

Requirement: the metrics tick stays O(1) Prometheus queries; the operator's memory and tick duration are reported
(targets: tick <= 2 s, RSS <= 300 MB); no API throttling storms (no HTTP 429, client-side rate limits respected).

Setup (deterministic, seed fixed): ``devcluster.cluster_up`` (etcd, kube-apiserver, scheduler, controller-manager,
kwok fake GPU nodes, 100 GPUs each, one more node than needed), the install's CRD and RBAC, a real Prometheus
(``LocalPrometheus``, no scrape targets: kwok pods run no Triton, so every query answers with no series and the
signals are Unknown/NoSeries, which is enough to count queries), and ``batchfill run`` as a subprocess with the
install's ServiceAccount token. The fleet: the seed example's spec with ``--distinct-specs`` variants (default:
every model its own), model ``i`` in namespace ``i * M // N`` with variant ``i mod D``, minReplicas 1,
maxReplicas 2, 1 GPU per replica, a PVC model repository per namespace. A variant has its own Triton model name,
p99 SLA (80-150 ms), networkOverheadMs (5-15 ms) and profile scale (0.8-1.2 x the example's latencies), drawn
with ``--seed``: each is a planning problem of its own, so "time to Planned" includes one plan per variant.

Each size runs with a fresh operator process, the baseline size (``--baseline-models``, default N/10) first and
then N, in the same namespaces, so the two differ only in the model count:

1. **Creation**: ``kubectl apply --server-side`` of every model, in ``--apply-parallelism`` (4) applies at once, as
   a GitOps sync applies; wall time until every model is Planned
   (``status.observedGeneration == generation`` and condition Planned True), then until every Triton pod is Ready.
   Beside it, the same distinct specs planned in this process, one after the other (``plan_batching``: what
   planning alone costs on one core), and about the floor the operator's client-side rate limit puts under the
   time to Planned: its API requests during creation / ``BATCHFILL_API_QPS`` (a little high, since kopf's own
   writes are counted but not limited; ``--api-qps`` raises the limit).
2. **Steady state**: after ``--warmup-passes`` scaling passes, ``--passes`` K passes of the scaling loop
   (``BATCHFILL_RECONCILE_INTERVAL_SECONDS``, default 15 s). Pass durations come from the operator's own
   ``batchfill_loop_last_pass_duration_seconds{loop="scaling"}`` (read after each pass; the histogram
   ``batchfill_loop_pass_duration_seconds`` counts the passes); Prometheus queries from Prometheus' own
   ``prometheus_http_requests_total{handler="/api/v1/query"}`` (and ``query_range``); API requests from
   kube-apiserver's ``apiserver_request_total`` by verb, resource and code (HTTP 429 must stay 0) and
   ``apiserver_flowcontrol_rejected_requests_total``; RSS from ``/proc/<pid>/status`` (VmRSS, VmHWM) and CPU from
   ``/proc/<pid>/stat`` of the operator process. The API counter has no user label: the requests of the kinds only
   the operator makes in steady state are counted as the operator's, and the total is compared with a window with
   the operator stopped (the controllers', scheduler's and kwok's own rate) as a cross-check.

The benchmark's own requests (its polls during creation, the /metrics reads) are subtracted or not counted. Prints
rich tables, writes ``benchmarks/out/scale.json`` and the generated section of ``docs/benchmarks/scale.md``
(between markers; text outside them is kept). Not a pass/fail test. About 11 minutes for 1,000 models on 2 cores.

Run: .venv/bin/python benchmarks/scale.py [--models 1000 --namespaces 20 --passes 4] [--distinct-specs 100]
     [--api-qps 20 --api-burst 30]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import math
import os
import platform
import random
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from batchfill.api.reasons import ConditionType
from batchfill.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from batchfill.api.validate import load_model
from batchfill.cli.shutdown import sigterm_as_interrupt
from batchfill.controller.desired import plan_cache
from batchfill.controller.settings import OperatorSettings
from batchfill.policy.plan import plan_batching
from batchfill.render.kube import CHILDREN_SELECTOR
from batchfill.testbed import devcluster
from batchfill.testbed.install import (
    install_operator_rbac,
    model_volume,
    operator_as_service_account,
)
from batchfill.testbed.process import free_port
from batchfill.testbed.prometheus_local import LocalPrometheus

ROOT = Path(__file__).resolve().parents[1]
OUT_JSON = ROOT / "benchmarks" / "out" / "scale.json"
OUT_DIR = OUT_JSON.parent
DOC = ROOT / "docs" / "benchmarks" / "scale.md"
BEGIN, END = "<!-- benchmarks/scale.py: begin (generated, do not edit by hand) -->", "<!-- benchmarks/scale.py: end -->"

TARGET_TICK_S = 2.0
TARGET_RSS_MB = 300.0  # MB = 10^6 bytes (the stricter reading)
GPUS_PER_NODE = 100  # fake nodes take 110 pods (devcluster.fake_node)
#: Variants' p99 SLA, network overhead (ms) and profile scale: all feasible for the seed profile (l(8) = 50 ms at
#: most 60 ms after scaling, at most 15 ms outside Triton, so T >= 65 ms).
SLA_RANGE_MS = (80.0, 150.0)
NETWORK_RANGE_MS = (5.0, 15.0)
PROFILE_SCALE_RANGE = (0.8, 1.2)
#: Target of the time until every model of a fleet of distinct specs is Planned (at 1,000 models).
TARGET_PLANNED_S = 60.0
POLL_S = 2.0
#: Scaling passes waited for beyond --warmup-passes until one makes at most max(10, models/100) operator requests.
MAX_SETTLING_PASSES = 10
#: kube-apiserver requests of kinds only the operator makes once the fleet is created (the counter has no user
#: label); the applies of children are its too. Events are created by the controllers as well: the operator's are
#: counted as the Events whose source is batchfill (its loops) or kopf (its handlers).
OPERATOR_KINDS = frozenset({
    ("LIST", PLURAL), ("GET", PLURAL), ("PATCH", PLURAL),
    ("PATCH", f"{PLURAL}/status"), ("LIST", "pods"), ("LIST", "deployments"), ("GET", "deployments"),
    ("PATCH", "deployments/scale"), ("APPLY", "configmaps"), ("APPLY", "deployments"),
    ("APPLY", "services"), ("APPLY", "servicemonitors"),
})  # fmt: skip


# -- the fleet ------------------------------------------------------------------------------------------------------


def namespaces(count: int) -> list[str]:
    return [f"scale-{j:02d}" for j in range(count)]


def fleet(models: int, ns_count: int, distinct: int, seed: int) -> list[dict[str, Any]]:
    """``models`` BatchedModels; model i in namespace ``i * ns_count // models``, spec variant ``i % distinct``."""
    base = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())
    rng = random.Random(seed)
    variants = []
    for s in range(distinct):
        spec = yaml.safe_load(yaml.safe_dump(base["spec"]))
        spec["model"]["name"] = f"model-{s:04d}"
        spec["model"]["repository"] = {"pvc": {"claimName": "triton-models"}}
        spec["sla"]["latencyP99Ms"] = round(rng.uniform(*SLA_RANGE_MS), 2)
        spec["sla"]["networkOverheadMs"] = round(rng.uniform(*NETWORK_RANGE_MS), 2)
        scale = rng.uniform(*PROFILE_SCALE_RANGE)
        spec["profile"] = [{**p, "latencyMs": round(p["latencyMs"] * scale, 3)} for p in spec["profile"]]
        spec["scaling"] = {"minReplicas": 1, "maxReplicas": 2}
        spec["triton"] = {"gpusPerReplica": 1}
        variants.append(spec)
    names = namespaces(ns_count)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": f"bm-{i:04d}", "namespace": names[i * ns_count // models]},
            "spec": variants[i % distinct],
        }
        for i in range(models)
    ]


def plan_in_process(docs: list[dict[str, Any]]) -> tuple[int, float]:
    """(distinct specs, seconds) to plan the fleet's distinct specs one after the other in this process, after one
    warm-up plan (the compiled batcher's load): planning alone, on one core, without the operator around it."""
    specs = {json.dumps(d["spec"], sort_keys=True): d for d in docs}
    models = [load_model(d).spec for d in specs.values()]
    plan_batching(models[0])
    t0 = time.perf_counter()
    for spec in models:
        plan_batching(spec)
    return len(models), time.perf_counter() - t0


# -- reading counters -----------------------------------------------------------------------------------------------


def _samples(text: str, prefixes: tuple[str, ...]) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of the exposition lines that start with one of ``prefixes`` (others skipped)."""
    lines = [line for line in text.splitlines() if line.startswith(prefixes)]
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families("\n".join(lines) + "\n")
        for s in family.samples
    ]


#: The operator's series the benchmark reads (pass counts and durations, per-model scale tick durations).
OPERATOR_SERIES = (
    "batchfill_loop_pass_duration_seconds_count",
    "batchfill_loop_pass_duration_seconds_sum",
    "batchfill_loop_last_pass_duration_seconds",
    "batchfill_reconcile_duration_seconds_count",
    "batchfill_reconcile_duration_seconds_sum",
)


def _http(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:  # loopback
        return str(r.read().decode())


ApiKey = tuple[str, str, str]  # verb, resource[/subresource], code


@dataclass
class Snapshot:
    """Every counter at one instant."""

    t: float
    api: collections.Counter[ApiKey] = field(default_factory=collections.Counter)
    apf_rejected: float = 0.0
    queries: float = 0.0  # Prometheus /api/v1/query + /api/v1/query_range requests
    own: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    events: int = 0  # Events the operator created (source batchfill or kopf), all namespaces
    loops: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # loop -> (count, sum, last)
    scale_ticks: tuple[float, float] = (0.0, 0.0)  # per-model scale tick histogram (count, sum)
    cpu_s: float = 0.0
    rss_kb: int = 0
    hwm_kb: int = 0


def proc_anon_kb(pid: int) -> int:
    """RssAnon (kB) of ``pid``: its private memory, what the kernel cannot drop under pressure. VmRSS also counts
    the pages of mapped files (shared libraries' code: llvmlite's LLVM alone is ~67 MB once numba compiles), which
    the kernel reclaims and re-reads (https://www.kernel.org/doc/html/latest/filesystems/proc.html); 0 when gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def proc_status(pid: int) -> tuple[int, int, float]:
    """VmRSS and VmHWM (kB) and user+system CPU seconds of ``pid``; zeros when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0, 0, 0.0
    fields = {
        k: v.split()[0] for k, v in (line.split(":", 1) for line in status.splitlines()) if k in ("VmRSS", "VmHWM")
    }
    ticks = stat.rsplit(")", 1)[1].split()
    cpu = (int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK")
    return int(fields.get("VmRSS", 0)), int(fields.get("VmHWM", 0)), cpu


#: the test bed's processes by their /proc comm (the kernel truncates it to 15 characters) -> the name reported
PROCESS_COMMS = {
    "etcd": "etcd", "kube-apiserver": "kube-apiserver", "kube-controller": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler", "kwok": "kwok", "prometheus": "prometheus",
}  # fmt: skip


def cpu_by_process(operator_pid: int) -> dict[str, float]:
    """User+system CPU seconds so far of each test-bed process (summed by name), the operator, this benchmark
    process (its observer threads: the Planned poll, the counters), and its reaped children (the kubectl applies).

    Differences of two calls say who used the 2 cores in between; a process that exited in between is lost from
    its name's sum (none of the control plane does in a run)."""
    out: dict[str, float] = collections.defaultdict(float)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == operator_pid:
            continue
        try:
            comm = (d / "comm").read_text().strip()
        except OSError:
            continue
        if comm in PROCESS_COMMS:
            out[PROCESS_COMMS[comm]] += proc_status(int(d.name))[2]
    out["operator"] = proc_status(operator_pid)[2]
    t = os.times()
    out["benchmark (observer)"] = t.user + t.system
    out["kubectl applies"] = t.children_user + t.children_system
    return dict(out)


class Counters:
    """Reads kube-apiserver's, Prometheus' and the operator's counters; keeps the benchmark's own API requests."""

    def __init__(self, api: Any, prom_url: str) -> None:
        self.api = api
        self.prom_url = prom_url
        self.own: collections.Counter[tuple[str, str]] = collections.Counter()
        self.operator_url = ""
        self.pid = 0

    def apiserver(self) -> tuple[collections.Counter[ApiKey], float]:
        # kubernetes client >= 35: call_api(method, url, ...); the admin's client certificate authenticates
        resp = self.api.call_api("GET", f"{self.api.configuration.host}/metrics", _request_timeout=60)
        text = resp.read().decode()
        counts: collections.Counter[ApiKey] = collections.Counter()
        rejected = 0.0
        for name, labels, value in _samples(
            text, ("apiserver_request_total{", "apiserver_flowcontrol_rejected_requests_total{")
        ):
            if name == "apiserver_flowcontrol_rejected_requests_total":
                rejected += value
                continue
            resource = labels.get("resource", "")
            if not resource:
                continue  # non-resource URLs: /metrics, /healthz, discovery (the benchmark's and kubectl's)
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            counts[(labels.get("verb", ""), resource, labels.get("code", ""))] += int(value)
        return counts, rejected

    def prometheus_queries(self) -> float:
        return sum(
            v
            for _, labels, v in _samples(_http(f"{self.prom_url}/metrics"), ("prometheus_http_requests_total{",))
            if labels.get("handler") in ("/api/v1/query", "/api/v1/query_range")
        )

    def operator(self) -> tuple[dict[str, tuple[float, float, float]], tuple[float, float]] | None:
        """Per loop (pass count, duration sum, last pass duration) and the per-model scale ticks (count, sum)."""
        # only these series (prometheus_client's name[] filter): the whole exposition has ~15 series per model, and
        # rendering it every POLL_S would take CPU from the passes being measured (Prometheus scrapes it every 30 s)
        only = "&".join(f"name[]={n}" for n in OPERATOR_SERIES)
        try:
            text = _http(f"{self.operator_url}?{only}", timeout_s=20)
        except OSError:
            return None
        loops: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, math.nan])
        ticks = [0.0, 0.0]
        for name, labels, v in _samples(
            text, ("batchfill_loop_pass_duration_seconds_", "batchfill_loop_last_pass", "batchfill_reconcile_duration")
        ):
            loop = labels.get("loop", "")
            if name == "batchfill_loop_pass_duration_seconds_count":
                loops[loop][0] = v
            elif name == "batchfill_loop_pass_duration_seconds_sum":
                loops[loop][1] = v
            elif name == "batchfill_loop_last_pass_duration_seconds":
                loops[loop][2] = v
            elif labels.get("handler") == "scale" and name.endswith("_count"):
                ticks[0] = v
            elif labels.get("handler") == "scale" and name.endswith("_sum"):
                ticks[1] = v
        return {k: (a, b, c) for k, (a, b, c) in loops.items()}, (ticks[0], ticks[1])

    def operator_events(self) -> int:
        core: Any = client.CoreV1Api(self.api)
        n = 0
        for source in ("batchfill", "kopf"):
            # the JSON only: the client's V1Event models cost ~1 ms each to build, seconds per snapshot at scale
            resp = core.list_event_for_all_namespaces(field_selector=f"source={source}", _preload_content=False)
            n += len(json.loads(resp.data)["items"])
            self.own[("LIST", "events")] += 1
        return n

    def snapshot(self, with_api: bool = True) -> Snapshot:
        snap = Snapshot(t=time.monotonic())
        if with_api:
            snap.events = self.operator_events()
            snap.api, snap.apf_rejected = self.apiserver()
        snap.own = collections.Counter(self.own)
        snap.queries = self.prometheus_queries()
        op = self.operator()
        if op is not None:
            snap.loops, snap.scale_ticks = op
        snap.rss_kb, snap.hwm_kb, snap.cpu_s = proc_status(self.pid)
        return snap


def api_delta(a: Snapshot, b: Snapshot) -> collections.Counter[ApiKey]:
    d = collections.Counter(b.api)
    d.subtract(a.api)
    return collections.Counter({k: v for k, v in d.items() if v > 0})


def by_kind(delta: collections.Counter[ApiKey], own: collections.Counter[tuple[str, str]] | None = None
            ) -> collections.Counter[tuple[str, str]]:  # fmt: skip
    """Requests by (verb, resource), the benchmark's own subtracted."""
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for (verb, res, _), v in delta.items():
        out[(verb, res)] += v
    for k, v in (own or {}).items():
        out[k] = max(0, out[k] - v)
    return +out


def kinds_between(a: Snapshot, b: Snapshot) -> collections.Counter[tuple[str, str]]:
    """Requests by (verb, resource) from ``a`` to ``b``, the benchmark's own subtracted."""
    return by_kind(api_delta(a, b), own_delta(a, b))


def operator_requests(a: Snapshot, b: Snapshot) -> int:
    """The operator's requests from ``a`` to ``b``: its kinds, and the Events it created."""
    return sum(v for k, v in kinds_between(a, b).items() if k in OPERATOR_KINDS) + (b.events - a.events)


def own_delta(a: Snapshot, b: Snapshot) -> collections.Counter[tuple[str, str]]:
    d = collections.Counter(b.own)
    d.subtract(a.own)
    return +d


def code_count(delta: collections.Counter[ApiKey], code: str) -> int:
    return sum(v for (_, _, c), v in delta.items() if c == code)


# -- one size -------------------------------------------------------------------------------------------------------


class PlannedWatch:
    """The uids of the BatchedModels that are Planned for their generation (:func:`is_planned`), kept by one watch.

    A watch, not a LIST per POLL_S: a LIST of 1,000 BatchedModels every 2 s loaded the API server whose time to
    Planned is being measured (the benchmark is an observer, like ``kubectl get -w`` or a GitOps controller).
    """

    def __init__(self, api: Any, counters: Counters) -> None:
        self.custom: Any = client.CustomObjectsApi(api)
        self.counters = counters
        self._planned: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Any = None  # kubernetes.watch.Watch (untyped)
        self._thread = threading.Thread(target=self._run, name="planned-watch", daemon=True)

    def __enter__(self) -> PlannedWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout=70)

    @property
    def planned(self) -> int:
        with self._lock:
            return len(self._planned)

    def _see(self, kind: str, bm: dict[str, Any]) -> None:
        uid = bm["metadata"]["uid"]
        with self._lock:
            if kind != "DELETED" and is_planned(bm):
                self._planned.add(uid)
            else:
                self._planned.discard(uid)

    def _run(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
                    self.counters.own[("LIST", PLURAL)] += 1
                    with self._lock:
                        self._planned = {b["metadata"]["uid"] for b in listed["items"] if is_planned(b)}
                    rv = listed["metadata"]["resourceVersion"]
                self._watch = watch.Watch()  # type: ignore[no-untyped-call]
                self.counters.own[("WATCH", PLURAL)] += 1
                for ev in self._watch.stream(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                                             resource_version=rv, timeout_seconds=60):  # fmt: skip
                    obj = ev["object"]
                    if ev["type"] == "ERROR":  # 410 Gone: the resourceVersion is too old, list again
                        rv = None
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    self._see(ev["type"], obj)
                    if self._stop.is_set():
                        break
            except Exception:  # the API server restarting, a dropped stream: list again
                rv = None
                self._stop.wait(1.0)


def is_planned(bm: dict[str, Any]) -> bool:
    status = bm.get("status") or {}
    if status.get("observedGeneration") != bm["metadata"].get("generation"):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == ConditionType.PLANNED and c.get("status") == "True" for c in conditions)


def pod_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


@dataclass
class PassRow:
    """One scaling pass as seen from outside: counter deltas since the previous pass's end."""

    index: int
    at_s: float  # since the apply started
    duration_s: float
    passes: int  # passes completed since the previous row (1 unless the polls missed one)
    queries: float
    operator_requests: int | None
    planned: int | None
    rss_mb: float


class Monitor:
    """Polls the counters every POLL_S and records a :class:`PassRow` whenever the scaling loop completes a pass."""

    def __init__(self, counters: Counters, t0: float, with_api: bool = True) -> None:
        self.c = counters
        self.t0 = t0
        self.with_api = with_api
        self.rows: list[PassRow] = []
        self.last = counters.snapshot(with_api)
        self.rss_max_kb = self.last.rss_kb
        self.anon_max_kb = proc_anon_kb(counters.pid)
        self.planned: int | None = None

    def passes(self, snap: Snapshot | None = None, loop: str = "scaling") -> int:
        return int((snap or self.last).loops.get(loop, (0.0, 0.0, 0.0))[0])

    def poll(self) -> None:
        op = self.c.operator()
        rss, _, _ = proc_status(self.c.pid)
        self.rss_max_kb = max(self.rss_max_kb, rss)
        self.anon_max_kb = max(self.anon_max_kb, proc_anon_kb(self.c.pid))
        if op is None or int(op[0].get("scaling", (0.0, 0.0, 0.0))[0]) == self.passes():
            return
        snap = self.c.snapshot(self.with_api)
        n = self.passes(snap) - self.passes()
        reqs = None
        if self.with_api:
            reqs = operator_requests(self.last, snap)
        self.rows.append(PassRow(
            index=self.passes(snap), at_s=snap.t - self.t0, duration_s=snap.loops["scaling"][2], passes=n,
            queries=snap.queries - self.last.queries, operator_requests=reqs, planned=self.planned,
            rss_mb=snap.rss_kb * 1024 / 1e6,
        ))  # fmt: skip
        self.last = snap

    def wait_passes(self, k: int, timeout_s: float, stop: threading.Event | None = None) -> bool:
        goal = self.passes() + k
        deadline = time.monotonic() + timeout_s
        while self.passes() < goal:
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
            self.poll()
        return True


def wait_for(what: str, fn: Any, timeout_s: float, console: Console, monitor: Monitor | None = None) -> float | None:
    """Poll ``fn() -> (done, progress text)`` every POLL_S; seconds waited, or None after ``timeout_s``."""
    t0 = time.monotonic()
    with console.status(what) as status:
        while time.monotonic() - t0 < timeout_s:
            done, text = fn()
            status.update(f"{what}: {text} ({time.monotonic() - t0:.0f} s)")
            if done:
                return time.monotonic() - t0
            if monitor is not None:
                monitor.poll()
            time.sleep(POLL_S)
    return None


def run_size(
    size: int, args: argparse.Namespace, kubeconfig: Path, work: Path, api: Any, prom: LocalPrometheus,
    console: Console,
) -> dict[str, Any]:  # fmt: skip
    """Creation and steady state of ``size`` models with a fresh operator; the models are left in place."""
    core: Any = client.CoreV1Api(api)
    counters = Counters(api, prom.url)
    port = free_port()
    counters.operator_url = f"http://127.0.0.1:{port}/metrics"
    docs = fleet(size, args.namespaces, min(args.distinct_specs, size), args.seed)
    # the fleet in --apply-parallelism files applied at once, as a GitOps sync does (Argo CD's application controller
    # runs several kubectl applies at the same time: --kubectl-parallelism-limit); one serial apply of 1,000 objects
    # measures kubectl's round trips on a busy API server more than the operator
    parts = max(1, min(args.apply_parallelism, len(docs)))
    fleet_files = [work / f"fleet-{size}-{k}.yaml" for k in range(parts)]
    for k, path in enumerate(fleet_files):
        path.write_text(yaml.safe_dump_all(docs[k::parts]))
    fleet_file = fleet_files[0]
    log_path = OUT_DIR / f"scale-operator-{size}.log"
    env = {
        "BATCHFILL_PROMETHEUS_URL": prom.url,
        "BATCHFILL_RECONCILE_INTERVAL_SECONDS": str(args.interval),
        "BATCHFILL_API_QPS": str(args.api_qps),
        "BATCHFILL_API_BURST": str(args.api_burst),
    }
    result: dict[str, Any] = {
        "models": size,
        "namespaces": args.namespaces,
        "distinct_specs": min(args.distinct_specs, size),
    }
    distinct, planning_s = plan_in_process(docs)
    console.log(f"{size} models: {distinct} distinct specs planned in this process in {planning_s:.1f} s")
    boot = counters.snapshot()  # before the operator starts: its start-up is counted in the whole-run figures
    with operator_as_service_account(kubeconfig, work, log_path, env=env, args=("--metrics-port", str(port))) as op:
        counters.pid = op.pid
        ok = wait_for("operator /metrics", lambda: (counters.operator() is not None, ""), 120, console)
        if ok is None or op.poll() is not None:
            raise RuntimeError(f"the operator did not start; log {log_path}:\n{log_path.read_text()[-3000:]}")
        time.sleep(3.0)  # kopf's startup scan, before the clock starts
        result["rss_idle_mb"] = proc_status(op.pid)[0] * 1024 / 1e6

        # 1. creation
        t0 = time.monotonic()
        start = counters.snapshot()
        cpu0 = cpu_by_process(op.pid)
        monitor = Monitor(counters, t0)
        windows: list[float] = []  # operator requests per second, per window between pass/peak samples
        last_peak = start
        console.log(f"{size} models: applying {len(fleet_files)} files like {fleet_file.name} at once ...")
        appliers = [subprocess.Popen(
            [str(devcluster.kubectl_path()), f"--kubeconfig={kubeconfig}", "apply", "--server-side",
             "-f", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        ) for path in fleet_files]  # fmt: skip
        applied_s = None
        planned_s = ready_s = None

        def progress() -> tuple[bool, str]:
            nonlocal applied_s, last_peak
            if applied_s is None and all(a.poll() is not None for a in appliers):
                applied_s = time.monotonic() - t0
                for applier in appliers:
                    if applier.returncode != 0:
                        err = applier.stderr.read().decode() if applier.stderr else ""
                        raise RuntimeError(f"kubectl apply failed: {err[-2000:]}")
            monitor.planned = planned_watch.planned
            if time.monotonic() - last_peak.t >= 5.0:
                snap = counters.snapshot()
                n = operator_requests(last_peak, snap)
                windows.append(n / (snap.t - last_peak.t))
                last_peak = snap
            if op.poll() is not None:
                raise RuntimeError(f"the operator exited; log {log_path}")
            return applied_s is not None and monitor.planned == size, f"{monitor.planned}/{size} Planned"

        with PlannedWatch(api, counters) as planned_watch:
            planned_s = wait_for(f"{size} models: waiting until every one is Planned", progress, args.timeout,
                                 console, monitor)  # fmt: skip
        for applier in appliers:
            if applier.poll() is None:
                applier.kill()
                applier.wait()
        cpu1 = cpu_by_process(op.pid)
        until_planned_s = time.monotonic() - t0

        def pods() -> tuple[bool, str]:
            listed = core.list_pod_for_all_namespaces(label_selector=CHILDREN_SELECTOR).items
            counters.own[("LIST", "pods")] += 1
            ready = sum(pod_ready(p) for p in listed)
            return ready >= size, f"{ready}/{size} Triton pods Ready"

        remaining = max(60.0, args.timeout - (time.monotonic() - t0))
        waited = wait_for(f"{size} models: waiting for the Triton pods", pods, remaining, console, monitor)
        ready_s = None if waited is None else time.monotonic() - t0
        created = counters.snapshot()
        monitor.poll()
        create_delta = api_delta(start, created)
        create_kinds = kinds_between(start, created)
        result["create"] = {
            "apply_s": applied_s,
            "all_planned_s": planned_s,
            "planned_after_apply_s": None if planned_s is None or applied_s is None else planned_s - applied_s,
            "all_pods_ready_s": ready_s,
            "distinct_plans": distinct,
            "planning_in_process_s": planning_s,
            "rate_limit_floor_s": operator_requests(start, created) / args.api_qps,
            "prometheus_queries": created.queries - start.queries,
            "operator_requests": operator_requests(start, created),
            "operator_requests_per_model": operator_requests(start, created) / size,
            "operator_events": created.events - start.events,
            "peak_operator_rps_5s": max(windows, default=0.0),
            "http_429": code_count(create_delta, "429"),
            "apf_rejected": created.apf_rejected - start.apf_rejected,
            "requests": {f"{v} {r}": n for (v, r), n in sorted(create_kinds.items())},
            "rss_hwm_mb": created.hwm_kb * 1024 / 1e6,
            "scaling_passes": monitor.passes(created) - monitor.passes(start),
            # CPU seconds by process from the apply to every model Planned, and that span: who held the cores
            "cpu_until_planned_s": {k: round(v - cpu0.get(k, 0.0), 2) for k, v in cpu1.items()},
            "until_planned_wall_s": until_planned_s,
        }
        console.log(f"{size} models: all Planned after {planned_s} s, all pods Ready after {ready_s} s")

        # 2. steady state: the pass under way now, then the warm-up passes, then more until one is quiet (the
        # models whose pods turned Ready last still write status, and the first profiling pass after that posts an
        # Event per model: the tail of creation, not steady state), then the measured passes
        pass_wait = args.interval + args.pass_timeout
        warm = monitor.wait_passes(args.warmup_passes + 1, pass_wait * (args.warmup_passes + 1))
        extra = 0
        quiet = max(10, size // 100)
        while warm and extra < MAX_SETTLING_PASSES and (monitor.rows[-1].operator_requests or 0) > quiet:
            warm = monitor.wait_passes(1, pass_wait)
            extra += 1
        result["settling_passes"] = extra
        s0 = counters.snapshot()
        monitor.last = s0
        monitor.rss_max_kb = s0.rss_kb
        monitor.anon_max_kb = proc_anon_kb(counters.pid)
        first_row = len(monitor.rows)
        complete = warm and monitor.wait_passes(args.passes, pass_wait * args.passes)
        s1 = counters.snapshot()
        steady_rows = monitor.rows[first_row:]
        span = s1.t - s0.t
        passes = monitor.passes(s1) - monitor.passes(s0)
        prof_passes = monitor.passes(s1, "profiling") - monitor.passes(s0, "profiling")
        delta = api_delta(s0, s1)
        kinds = kinds_between(s0, s1)
        op_requests = operator_requests(s0, s1)
        durations = [r.duration_s for r in steady_rows]
        ticks = (s1.scale_ticks[0] - s0.scale_ticks[0], s1.scale_ticks[1] - s0.scale_ticks[1])
        prof_last = s1.loops.get("profiling", (0.0, 0.0, math.nan))
        prof_sum = prof_last[1] - s0.loops.get("profiling", (0.0, 0.0, 0.0))[1]
        result["steady"] = {
            "complete": complete,
            "window_s": span,
            "scaling_passes": passes,
            "profiling_passes": prof_passes,
            "pass_durations_s": durations,
            "pass_p50_s": statistics.median(durations) if durations else None,
            "pass_max_s": max(durations) if durations else None,
            "profiling_pass_mean_s": prof_sum / prof_passes if prof_passes else None,
            "profiling_last_pass_s": None if math.isnan(prof_last[2]) else prof_last[2],
            "scale_tick_mean_ms": 1000 * ticks[1] / ticks[0] if ticks[0] else None,
            "prometheus_queries": s1.queries - s0.queries,
            "queries_per_pass": (s1.queries - s0.queries) / passes if passes else None,
            "operator_requests": op_requests,
            "operator_requests_per_pass": op_requests / passes if passes else None,
            "operator_rps": op_requests / span if span else None,
            "operator_events": s1.events - s0.events,
            "all_requests_rps": sum(kinds.values()) / span if span else None,
            "http_429": code_count(delta, "429"),
            "apf_rejected": s1.apf_rejected - s0.apf_rejected,
            "requests": {f"{v} {r}": n for (v, r), n in sorted(kinds.items())},
            "rss_max_mb": monitor.rss_max_kb * 1024 / 1e6,
            "rss_anon_max_mb": monitor.anon_max_kb * 1024 / 1e6,
            "rss_end_mb": s1.rss_kb * 1024 / 1e6,
            "rss_hwm_mb": s1.hwm_kb * 1024 / 1e6,
            "operator_cpu_cores": (s1.cpu_s - s0.cpu_s) / span if span else None,
        }
        result["passes"] = [vars(r) for r in monitor.rows]
        result["warmup_complete"] = warm
        whole = api_delta(boot, s1)
        result["whole_run"] = {
            "http_429": code_count(whole, "429"),
            "apf_rejected": s1.apf_rejected - boot.apf_rejected,
        }
    lines = log_path.read_text(errors="replace").splitlines()
    errors = [line for line in lines if "[ERROR" in line]
    result["operator_log"] = {
        "path": str(log_path.relative_to(ROOT)),
        "errors": len(errors),
        "handler_retries": sum("will try again" in line for line in errors),
        "warnings": sum("[WARNING" in line for line in lines),
        "lines_with_429": sum(" 429" in line or "TooManyRequests" in line for line in lines),
        "first_errors": [line[:400] for line in errors[:5]],
    }
    # 3. the same window with the operator stopped: the controllers', scheduler's and kwok's own rate
    time.sleep(2.0)
    b0 = counters.snapshot()
    time.sleep(args.baseline_seconds)
    b1 = counters.snapshot()
    others = by_kind(api_delta(b0, b1))
    result["without_operator"] = {
        "window_s": b1.t - b0.t,
        "all_requests_rps": sum(others.values()) / (b1.t - b0.t),
        "requests": {f"{v} {r}": n for (v, r), n in sorted(others.items())},
    }
    st = result["steady"]
    if st["all_requests_rps"] is not None:
        st["attributed_rps"] = st["all_requests_rps"] - result["without_operator"]["all_requests_rps"]
        st["attributed_per_pass"] = st["attributed_rps"] * span / passes if passes else None
    return result


def delete_fleet(kubeconfig: Path, api: Any, console: Console, timeout_s: float = 600.0) -> float | None:
    devcluster.kubectl(kubeconfig, "delete", f"{PLURAL}.{GROUP}", "--all", "--all-namespaces", "--wait=false",
                       timeout_s=300)  # fmt: skip
    core = client.CoreV1Api(api)

    def gone() -> tuple[bool, str]:
        left = len(core.list_pod_for_all_namespaces(label_selector=CHILDREN_SELECTOR).items)
        return left == 0, f"{left} Triton pods left"

    return wait_for("deleting the fleet (garbage collection)", gone, timeout_s, console)


# -- report ---------------------------------------------------------------------------------------------------------


def _f(x: Any, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return ""
    return f"{a / b:.2f}"


ROWS: tuple[tuple[str, str, str, int], ...] = (
    ("kubectl apply of every model (parallel applies), s", "create", "apply_s", 1),
    ("created -> every model Planned, s", "create", "all_planned_s", 1),
    ("kubectl apply done -> every model Planned, s", "create", "planned_after_apply_s", 1),
    ("creation: the distinct specs planned in-process, one core, s", "create", "planning_in_process_s", 1),
    ("creation: operator API requests / BATCHFILL_API_QPS (~rate-limit floor), s", "create", "rate_limit_floor_s", 1),
    ("created -> every Triton pod Ready, s", "create", "all_pods_ready_s", 1),
    ("creation: Prometheus queries", "create", "prometheus_queries", 0),
    ("creation: operator API requests per model", "create", "operator_requests_per_model", 1),
    ("creation: Events created by the operator", "create", "operator_events", 0),
    ("creation: operator API requests/s, peak 5 s window", "create", "peak_operator_rps_5s", 1),
    ("creation: HTTP 429 / APF rejections", "create", "_429", 0),
    ("steady: scaling passes measured (profiling passes)", "steady", "_passes", 0),
    ("steady: scaling pass p50, s", "steady", "pass_p50_s", 3),
    ("steady: scaling pass max, s", "steady", "pass_max_s", 3),
    ("steady: per-model scale tick mean, ms", "steady", "scale_tick_mean_ms", 2),
    ("steady: profiling pass (last), s", "steady", "profiling_last_pass_s", 2),
    ("steady: Prometheus queries per pass", "steady", "queries_per_pass", 1),
    ("steady: operator API requests per pass", "steady", "operator_requests_per_pass", 1),
    ("steady: operator API requests per pass, Events excluded", "steady", "_no_events", 1),
    ("steady: operator API requests/s", "steady", "operator_rps", 2),
    ("steady: of them Events created by the operator", "steady", "operator_events", 0),
    ("steady: HTTP 429 / APF rejections", "steady", "_429", 0),
    ("whole run incl. operator start-up: HTTP 429 / APF rejections", "whole_run", "_429", 0),
    ("operator log: ERROR lines (handler failures retried)", "operator_log", "_errors", 0),
    ("steady: operator CPU, cores", "steady", "operator_cpu_cores", 2),
    ("operator RSS idle (before the fleet), MB", "", "rss_idle_mb", 0),
    ("steady: operator RSS max, MB", "steady", "rss_max_mb", 0),
    ("operator peak RSS (VmHWM, whole run), MB", "steady", "rss_hwm_mb", 0),
    ("steady: operator private memory max (RssAnon), MB", "steady", "rss_anon_max_mb", 0),
)


def cell(run: dict[str, Any], section: str, key: str, digits: int) -> tuple[str, float | None]:
    src = run.get(section, {}) if section else run
    if key == "_429":
        return f"{src.get('http_429')} / {int(src.get('apf_rejected') or 0)}", None
    if key == "_no_events":
        passes = src.get("scaling_passes") or 0
        v = (src["operator_requests"] - src["operator_events"]) / passes if passes else None
        return _f(v, digits), v
    if key == "_errors":
        return f"{src.get('errors')} ({src.get('handler_retries')})", None
    if key == "_passes":
        return f"{src.get('scaling_passes')} ({src.get('profiling_passes')})", None
    v = src.get(key)
    return _f(v, digits), v if isinstance(v, int | float) else None


def verdicts(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    big = runs[-1]
    small = runs[0] if len(runs) > 1 else None
    st = big["steady"]
    out = []
    pmax, p50 = st["pass_max_s"], st["pass_p50_s"]
    if pmax is None:
        out.append(f"MISSED: tick <= {TARGET_TICK_S:g} s: no scaling pass completed within the wait "
                   f"({big['models']} models)")  # fmt: skip
    else:
        ok = pmax <= TARGET_TICK_S
        out.append(f"{'met' if ok else 'MISSED'}: tick <= {TARGET_TICK_S:g} s at {big['models']} models: p50 "
                   f"{p50:.3f} s, max {pmax:.3f} s over {len(st['pass_durations_s'])} passes")  # fmt: skip
    hwm = st["rss_hwm_mb"]
    out.append(f"{'met' if hwm <= TARGET_RSS_MB else 'MISSED'}: RSS <= {TARGET_RSS_MB:g} MB at {big['models']} "
               f"models: peak (VmHWM) {hwm:.0f} MB, steady-state max {st['rss_max_mb']:.0f} MB, of it private "
               f"(RssAnon) {st.get('rss_anon_max_mb') or 0:.0f} MB")  # fmt: skip
    q = st["queries_per_pass"]
    if small is not None and q is not None and small["steady"]["queries_per_pass"]:
        q0 = small["steady"]["queries_per_pass"]
        ok = q <= q0 * 1.05
        out.append(f"{'met' if ok else 'MISSED'}: O(1) Prometheus queries per scaling pass: {q0:.1f} at "
                   f"{small['models']} models, {q:.1f} at {big['models']} (ratio {q / q0:.2f} for "
                   f"{big['models'] / small['models']:.0f} x the models)")  # fmt: skip
    else:
        out.append(f"not judged: O(1) queries per pass needs two sizes; {q} at {big['models']} models")
    throttled = int(sum(r[s]["http_429"] + r[s]["apf_rejected"] for r in runs for s in ("create", "steady")))
    out.append(f"{'met' if throttled == 0 else 'MISSED'}: no API throttling: {throttled} HTTP 429 responses or "
               f"APF rejections in creation and steady state at every size")  # fmt: skip
    boot = sum(r["whole_run"]["http_429"] for r in runs) - sum(
        r[s]["http_429"] for r in runs for s in ("create", "steady")
    )
    if boot:
        logged = sum(r["operator_log"]["lines_with_429"] for r in runs)
        out.append(f"note: {boot} HTTP 429 outside those windows (operator start-up; {logged} operator log line(s) "
                   "name a 429: see the JSON's operator_log.first_errors)")  # fmt: skip
    peak = max(r["create"]["peak_operator_rps_5s"] for r in runs)
    rps = st["operator_rps"] or 0.0
    defaults = OperatorSettings()
    cfg = report["config"]
    limits = OperatorSettings(
        api_qps=cfg.get("api_qps", defaults.api_qps), api_burst=cfg.get("api_burst", defaults.api_burst)
    )
    # the most a token bucket lets through in a 5 s window: the burst plus 5 s of refill
    ceiling = limits.api_qps + limits.api_burst / 5.0
    within = rps <= limits.api_qps and peak <= ceiling
    out.append(f"{'met' if within else 'MISSED'}: client-side rate: the operator made {rps:.1f} req/s in steady "
               f"state and at most {peak:.1f} req/s in a 5 s window during creation; its client is limited to "
               f"BATCHFILL_API_QPS {limits.api_qps:g} with burst {limits.api_burst} (default {defaults.api_qps:g} and "
               f"{defaults.api_burst}: at most {ceiling:g} req/s over 5 s), and kopf's own writes after each handler "
               "(its progress annotation and the handler's status, not limited) come on top")  # fmt: skip
    cr = big["create"]
    if cr.get("planning_in_process_s") is not None and cr["all_planned_s"] is not None:
        ok = cr["all_planned_s"] <= TARGET_PLANNED_S * big["models"] / 1000
        out.append(f"{'met' if ok else 'MISSED'}: every model Planned within {TARGET_PLANNED_S:g} s per 1,000 "
                   f"models of distinct specs: {cr['all_planned_s']:.1f} s for {big['models']} models "
                   f"({cr['distinct_plans']} distinct specs; {cr['apply_s']:.1f} s of it the kubectl apply of the "
                   f"fleet, the last model Planned {cr['planned_after_apply_s'] or 0:.1f} s after it); planning them "
                   f"alone took {cr['planning_in_process_s']:.1f} s on one core, and the "
                   f"client-side rate limit alone needs about {cr['rate_limit_floor_s']:.1f} s for the operator's "
                   f"creation requests ({cr['operator_requests']} at {limits.api_qps:g} req/s)")  # fmt: skip
    return out


def who(run: dict[str, Any], verb: str, resource: str) -> str:
    if (verb, resource) == ("POST", "events"):
        return f"both (the operator's: {run['steady']['operator_events']})"
    return "operator" if (verb, resource) in OPERATOR_KINDS else "others"


def print_report(report: dict[str, Any], out: Console) -> None:
    runs = report["runs"]
    table = Table(title=f"batchfill operator at scale ({report['config']['namespaces']} namespaces, "
                        f"{report['config']['interval_s']:g} s scaling interval)")  # fmt: skip
    table.add_column("figure")
    for r in runs:
        table.add_column(f"{r['models']} models", justify="right")
    if len(runs) > 1:
        table.add_column("ratio", justify="right")
    for label, section, key, digits in ROWS:
        cells = [cell(r, section, key, digits) for r in runs]
        row = [label, *(c[0] for c in cells)]
        if len(runs) > 1:
            row.append(_ratio(cells[-1][1], cells[0][1]))
        table.add_row(*row)
    out.print(table)
    big = runs[-1]
    st = big["steady"]
    t2 = Table(
        title=f"API requests in steady state, {big['models']} models ({st['scaling_passes']} scaling passes, "
        f"{st['window_s']:.0f} s)"
    )
    for col in ("verb resource", "requests", "per scaling pass", "operator stopped, same span", "by"):
        t2.add_column(col, justify="right")
    base = big["without_operator"]
    scale = big["steady"]["window_s"] / base["window_s"]
    passes = max(1, big["steady"]["scaling_passes"])
    keys = sorted(set(big["steady"]["requests"]) | set(base["requests"]),
                  key=lambda k: -big["steady"]["requests"].get(k, 0))  # fmt: skip
    for k in keys:
        n = big["steady"]["requests"].get(k, 0)
        verb, res = k.split(" ", 1)
        t2.add_row(k, str(n), f"{n / passes:.1f}", f"{base['requests'].get(k, 0) * scale:.0f}", who(big, verb, res))
    out.print(t2)
    t3 = Table(title=f"Scaling passes, {big['models']} models (creation, then steady state)")
    for col in ("pass", "at s", "duration s", "queries", "operator requests", "Planned", "RSS MB"):
        t3.add_column(col, justify="right")
    for p in big["passes"]:
        t3.add_row(str(p["index"]), f"{p['at_s']:.0f}", f"{p['duration_s']:.3f}", f"{p['queries']:.0f}",
                   _f(p["operator_requests"]), _f(p["planned"]), f"{p['rss_mb']:.0f}")  # fmt: skip
    out.print(t3)
    for line in cpu_lines(big):
        out.print(line, markup=False, highlight=False)
    out.print("Targets:")
    for line in report["verdicts"]:
        out.print(f"  - {line}", markup=False, highlight=False)


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    runs = report["runs"]
    big = runs[-1]
    lines = [
        f"## Scale: {big['models']:,} BatchedModels in {cfg['namespaces']} namespaces",
        "",
        f"Generated by `.venv/bin/python benchmarks/scale.py {cfg['argv']}` on {report['date']} "
        f"({report['machine']}); all figures in `benchmarks/out/scale.json`. Do not edit this section by hand.",
        "",
        f"Setup: the local control plane (`devcluster`: etcd, kube-apiserver, scheduler, controller-manager, "
        f"{cfg['nodes']} kwok GPU nodes), a real Prometheus with no scrape targets (kwok pods run no Triton: "
        f"every query answers with no series, signals Unknown/NoSeries), `batchfill run` as the install's "
        f"ServiceAccount with a {cfg['interval_s']:g} s scaling interval and the default 60 s profiling interval. "
        f"Fleet: the seed example with {cfg['distinct_specs']} distinct specs (Triton model name, p99 SLA, network "
        f"overhead and profile scale, seed {cfg['seed']}), minReplicas 1, maxReplicas 2, 1 GPU per replica, "
        f"spread evenly over the namespaces. Each size runs with a fresh operator; steady state is "
        f"{cfg['passes']} scaling passes after {cfg['warmup_passes']} warm-up passes once every model is Planned "
        "and its pod Ready, and after further passes until one made at most max(10, models/100) operator requests "
        + (
            f"({', '.join(str(r['settling_passes']) for r in runs)} at {' and '.join(str(r['models']) for r in runs)} "
            "models)."
            if all("settling_passes" in r for r in runs)
            else "(not recorded: a run from before this rule)."
        ),
        "",
        "| figure | " + " | ".join(f"{r['models']} models" for r in runs) + (" | ratio |" if len(runs) > 1 else " |"),
        "|---|" + "---|" * len(runs) + ("---|" if len(runs) > 1 else ""),
    ]
    for label, section, key, digits in ROWS:
        cells = [cell(r, section, key, digits) for r in runs]
        row = f"| {label} | " + " | ".join(c[0] for c in cells) + " |"
        if len(runs) > 1:
            row += f" {_ratio(cells[-1][1], cells[0][1])} |"
        lines.append(row)
    lines += ["", "Targets:", ""] + [f"- {v}" for v in report["verdicts"]]
    lines += cpu_lines(big)
    st = big["steady"]
    passes = max(1, st["scaling_passes"])
    lines += [
        "",
        f"API requests in steady state at {big['models']} models ({st['scaling_passes']} scaling and "
        f"{st['profiling_passes']} profiling passes in {st['window_s']:.0f} s; `by`: kinds only the operator "
        "makes, or the controllers, scheduler and kwok):",
        "",
        "| verb resource | requests | per scaling pass | by |",
        "|---|---|---|---|",
    ]
    for k, n in sorted(st["requests"].items(), key=lambda kv: -kv[1]):
        verb, res = k.split(" ", 1)
        lines.append(f"| {k} | {n} | {n / passes:.1f} | {who(big, verb, res)} |")
    lines += [
        "",
        f"Scaling passes at {big['models']} models, from the apply on (counters read after each pass; the last "
        f"{st['scaling_passes']} are the steady state):",
        "",
        "| pass | at s | duration s | Prometheus queries | operator API requests | models Planned | RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in big["passes"]:
        lines.append(f"| {row['index']} | {row['at_s']:.0f} | {row['duration_s']:.3f} | {row['queries']:.0f} | "
                     f"{_f(row['operator_requests'])} | {_f(row['planned'])} | {row['rss_mb']:.0f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def cpu_lines(run: dict[str, Any]) -> list[str]:
    """Markdown: who used the cores from the apply to every model Planned (runs before this table have none)."""
    cpu = run["create"].get("cpu_until_planned_s")
    span = run["create"].get("until_planned_wall_s")
    if not cpu or not span:
        return []
    cores = os.cpu_count() or 1
    lines = [
        "",
        f"CPU from the apply to every model Planned at {run['models']} models ({span:.1f} s, so "
        f"{cores * span:.0f} CPU-seconds on {cores} cores):",
        "",
        "| process | CPU s | share of the cores |",
        "|---|---|---|",
    ]
    for name, v in sorted(cpu.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {v:.1f} | {100 * v / (cores * span):.0f} % |")
    used = sum(cpu.values())
    lines.append(f"| all of them | {used:.1f} | {100 * used / (cores * span):.0f} % |")
    return lines


def write_doc(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmark: the operator at scale\n\n"
    block = f"{BEGIN}\n{section}{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


# -- main -----------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--namespaces", type=int, default=20)
    ap.add_argument("--passes", type=int, default=4, help="steady-state scaling passes measured")
    ap.add_argument("--warmup-passes", type=int, default=2, help="scaling passes skipped once all are Ready")
    ap.add_argument("--interval", type=float, default=15.0, help="BATCHFILL_RECONCILE_INTERVAL_SECONDS")
    ap.add_argument(
        "--baseline-models",
        type=int,
        default=None,
        help="the smaller size run first for the O(1) comparison (default models/10; 0: none)",
    )
    cached = plan_cache.cache_info().maxsize
    ap.add_argument("--distinct-specs", type=int, default=None,
                    help="distinct specs (model name, SLA, network overhead, profile scale) in the fleet "
                         f"(default: every model); the operator caches {cached} plans")  # fmt: skip
    defaults = OperatorSettings()
    ap.add_argument(
        "--api-qps",
        type=float,
        default=defaults.api_qps,
        help=f"the operator's BATCHFILL_API_QPS (default {defaults.api_qps:g}, the operator's own)",
    )
    ap.add_argument("--api-burst", type=int, default=defaults.api_burst,
                    help=f"the operator's BATCHFILL_API_BURST (default {defaults.api_burst})")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--apply-parallelism", type=int, default=4, help="kubectl applies of the fleet run at once")
    ap.add_argument("--timeout", type=float, default=1500.0, help="creation: seconds until all Planned and Ready")
    ap.add_argument("--pass-timeout", type=float, default=900.0, help="extra seconds to wait for one pass")
    ap.add_argument("--baseline-seconds", type=float, default=30.0, help="window with the operator stopped")
    ap.add_argument("--json", type=Path, default=OUT_JSON)
    ap.add_argument("--doc", type=Path, default=DOC, help="markdown file to write the section into ('-': none)")
    ap.add_argument("--report-only", action="store_true", help="print and write the report of --json again, no run")
    args = ap.parse_args()
    if args.distinct_specs is None:
        args.distinct_specs = args.models
    out = Console()
    if args.report_only:
        report = json.loads(args.json.read_text())
        report["verdicts"] = verdicts(report)
        print_report(report, out)
        if str(args.doc) != "-":
            write_doc(args.doc, markdown(report))
        return
    if args.models < 1 or args.namespaces < 1 or args.passes < 1 or args.distinct_specs < 1:
        ap.error("--models, --namespaces, --passes and --distinct-specs must be positive")
    small = args.models // 10 if args.baseline_models is None else args.baseline_models
    sizes = [s for s in (small, args.models) if s > 0]
    sizes = sorted(set(sizes))
    console = Console(stderr=True)
    nodes = -(-args.models // GPUS_PER_NODE) + 1
    cache = plan_cache.cache_info().maxsize
    if cache is not None and min(args.distinct_specs, args.models) > cache:
        console.log(f"[yellow]{args.distinct_specs} distinct specs exceed the operator's plan cache ({cache}): "
                    "every scaling and profiling pass re-plans every model (about 0.01-0.03 s each)")  # fmt: skip
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    runs = []
    with contextlib.ExitStack() as stack, sigterm_as_interrupt():
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="batchfill-scale-")))
        devcluster.ensure_binaries(console, build=False)
        info = stack.enter_context(devcluster.running_cluster(
            work / "cluster", gpu_nodes=nodes, gpus_per_node=GPUS_PER_NODE, console=console, die_with_parent=True,
            build=False,
        ))  # fmt: skip
        kubeconfig = Path(info.kubeconfig)
        prom = stack.enter_context(LocalPrometheus(scrape_interval_s=15.0))
        api = stack.enter_context(devcluster.api_client(kubeconfig))
        install_operator_rbac(kubeconfig, work)
        (work / "models").mkdir()
        volumes = [d for ns in namespaces(args.namespaces) for d in model_volume(ns, "scale", work / "models")]
        (work / "volumes.yaml").write_text(yaml.safe_dump_all(volumes))
        devcluster.kubectl(kubeconfig, "apply", "--server-side", "-f", str(work / "volumes.yaml"))
        for i, size in enumerate(sizes):
            if i:
                deleted = delete_fleet(kubeconfig, api, console)
                console.log(f"fleet of {sizes[i - 1]} deleted in {deleted} s")
            runs.append(run_size(size, args, kubeconfig, work, api, prom, console))
            console.log(f"{size} models done ({time.monotonic() - t_start:.0f} s so far)")
    report = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}",
        "config": {
            "argv": f"--models {args.models} --namespaces {args.namespaces} --passes {args.passes} --warmup-passes "
                    f"{args.warmup_passes} --distinct-specs {args.distinct_specs} --interval {args.interval:g} "
                    f"--api-qps {args.api_qps:g} --api-burst {args.api_burst} "
                    f"--apply-parallelism {args.apply_parallelism}",
            "models": args.models, "namespaces": args.namespaces, "passes": args.passes,
            "warmup_passes": args.warmup_passes, "interval_s": args.interval, "sizes": sizes,
            "distinct_specs": min(args.distinct_specs, args.models), "seed": args.seed, "nodes": nodes,
            "operator_plan_cache": cache, "api_qps": args.api_qps, "api_burst": args.api_burst,
            "targets": {"tick_s": TARGET_TICK_S, "rss_mb": TARGET_RSS_MB, "planned_s_per_1000": TARGET_PLANNED_S},
        },
        "wall_s": time.monotonic() - t_start,
        "runs": runs,
    }  # fmt: skip
    report["verdicts"] = verdicts(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print_report(report, out)
    if str(args.doc) != "-":
        write_doc(args.doc, markdown(report))
        out.print(f"wrote {args.json} and {args.doc}")


if __name__ == "__main__":
    main()
