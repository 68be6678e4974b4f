"""Scaling lab: the replica decision of :mod:`batchfill.policy.scaling` driving real Triton servers, no Kubernetes.

The lab plays "the Deployment" with real parts:

* **Replicas**: one real ``tritonserver`` process per replica (the sleep model: a Python backend that sleeps
  ``alpha + beta·b`` ms per batch of ``b``, ``KIND_CPU``), its ``config.pbtxt`` rendered from the plan with
  :func:`~batchfill.render.render_model_config` plus the sleep parameters. A replica is *starting* from the
  moment it is requested until ``/v2/health/ready`` answers (Triton's readiness, what a pod's readiness probe
  checks), then *Ready*. Pods are named ``<name>-<k>`` with ``k`` counting up, never reused.
* **Prometheus**: a real Prometheus (:class:`~batchfill.testbed.prometheus_local.LocalPrometheus`, scraping
  every ``scrape_s``) whose file_sd targets are the running servers with ``namespace``/``pod`` labels, as a
  ServiceMonitor would give them.
* **Load**: an open-loop Poisson load whose rate follows a schedule (warm, ramp up, hold, ramp down, low),
  drawn once from a seed (:func:`~batchfill.testbed.loadgen.varying_poisson_arrivals`). A client-side
  balancer sends each arrival to the next Ready server round-robin (``tritonclient.grpc.aio``, one channel per
  server, all on one event loop). Latency is measured from the *scheduled* arrival (no coordinated omission).
* **Control loop**: every ``tick_s`` the signals of the Ready pods are read through
  :class:`~batchfill.adapters.metrics.PrometheusSignals` (window ``window_s``), a
  :class:`~batchfill.policy.scaling.ScalingInput` is built (``Replicas(current, ready, starting)``),
  :func:`~batchfill.policy.scaling.decide` runs with the previous decision's history, and if
  ``decision.apply`` servers are started or stopped. Scale-in stops the newest servers first; a server leaves
  the balancer (and the Ready set) *before* it is stopped, its requests in flight drain, then it gets SIGTERM,
  so a scale-in fails no request.

Everything is seeded (arrivals, plan). Every process is stopped by its own PID on exit or on an exception.

Times in :class:`LabResult` are seconds since the load started (``t = 0``; the signal window at the first
ticks reaches back before it). The analysis helpers at the end of the module (:func:`need_steps`,
:func:`reactions`, :func:`replica_seconds`, :func:`latency_windows`, :func:`phase_stats`) are pure functions
of a :class:`LabResult`, shared by ``tests/component/test_autoscaling_ramp.py`` and
``benchmarks/scaling_ramp.py``.

Usage::

    result = ScalingLab(LabConfig()).run()      # about 3.5 minutes with the defaults
    for r in reactions(result): print(r)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchfill.adapters.metrics import PrometheusSignals, SignalTarget
from batchfill.api.spec import BatchedModelSpec, ScalingSpec
from batchfill.api.status import PlanStatus
from batchfill.policy.plan import plan_batching, replicas_for
from batchfill.policy.scaling import Decision, PlanNumbers, Recommendation, Replicas, ScalingInput, decide
from batchfill.policy.signals import ModelSignals
from batchfill.render import config_with_parameters, render_model_config
from batchfill.testbed.loadgen import grpc_fp32_input, varying_poisson_arrivals
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.process import LOOPBACK, free_ports
from batchfill.testbed.prometheus_local import LocalPrometheus, ScrapeTarget
from batchfill.testbed.triton_local import LocalTriton

SLEEP_INPUT = "INPUT0"
SLEEP_OUTPUT = "OUTPUT0"
SLEEP_DIMS = (4,)


# -- configuration ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SleepModel:
    """The sleep model and the profile the plan is computed from.

    The default (50 + 10·b ms, with the default SLA of 360 ms and 20 ms overhead: T = 340 ms) plans
    B = 16 and C ≈ 51 requests/s per replica, so the default ramp peaks near 100 requests/s: cheap enough that
    three Python-backend servers, Prometheus and the load generator share a 2-core machine with other work and
    still measure the servers, not the machine. (10 + 2·b ms with T = 70 ms plans C ≈ 241 requests/s; on a
    shared 2-core machine its 460 requests/s peak showed 100 ms scheduling stalls in client and servers.)

    The profile is nominal, not measured, so the plan is the same on every run: ``l(b) = alpha + overhead +
    (beta + per_request)·b``. ``overhead_ms`` is the Python backend's cost outside ``execute``'s sleep
    (measured in [0, 2] ms by tests/component/test_sleep_model_profile.py) and ``per_request_ms`` the cost of
    each single-sample request in a dynamically formed batch (measured ≈ 0.06 ms there), both rounded up.
    """

    alpha_ms: float = 50.0
    beta_ms: float = 10.0
    overhead_ms: float = 1.0
    per_request_ms: float = 0.1
    profile_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

    def latency_ms(self, b: int) -> float:
        return self.alpha_ms + self.overhead_ms + (self.beta_ms + self.per_request_ms) * b


@dataclass(frozen=True)
class RampShape:
    """The load schedule in units of ``u·C`` (one replica's worth: target utilization × capacity at SLA).

    ``warm_s`` at ``base``, a linear ramp over ``up_s`` to ``peak``, ``hold_s`` at ``peak``, a linear ramp over
    ``down_s`` to ``low``, ``low_s`` at ``low``.
    """

    base: float = 0.5
    peak: float = 2.4
    low: float = 0.4
    warm_s: float = 20.0
    up_s: float = 80.0
    hold_s: float = 40.0
    down_s: float = 15.0
    low_s: float = 60.0


@dataclass(frozen=True)
class LabConfig:
    """Everything a lab run depends on.

    Attributes:
        model: the sleep model and its nominal profile.
        sla_p99_ms, network_overhead_ms: the SLA; ``T = sla_p99_ms - network_overhead_ms``.
        scaling: the BatchedModel's ``spec.scaling`` (short stabilization so a whole ramp fits in minutes).
        ramp: the load schedule in units of ``u·C``.
        window_s: the signals' ``increase`` window.
        tick_s: the control loop's period.
        scrape_s: Prometheus' scrape interval.
        seed: seeds the plan's simulation and the arrivals.
        namespace, name, model_name: the labels and names the signals are read with.
        request_timeout_s: client timeout per request (a timeout counts as a failed request).
        warmup_requests: sequential requests a new server gets before it joins the balancer (0: none, as a
            Kubernetes readiness probe on ``/v2/health/ready`` would do).
        drain_timeout_s: how long a server leaving the balancer may take to finish its requests in flight.
        work_dir: model repository, logs and Prometheus data go here (default: a temporary directory, removed
            after a clean run).
    """

    model: SleepModel = field(default_factory=SleepModel)
    sla_p99_ms: float = 360.0
    network_overhead_ms: float = 20.0
    scaling: ScalingSpec = field(
        default_factory=lambda: ScalingSpec(
            minReplicas=1, maxReplicas=4, targetUtilization=0.8, scaleDownStabilizationSeconds=20
        )
    )
    ramp: RampShape = field(default_factory=RampShape)
    window_s: float = 10.0
    tick_s: float = 2.0
    scrape_s: float = 1.0
    seed: int = 0
    namespace: str = "lab"
    name: str = "ramp"
    model_name: str = "sleep"
    request_timeout_s: float = 10.0
    warmup_requests: int = 0
    drain_timeout_s: float = 15.0
    work_dir: Path | None = None


def sleep_spec(config: LabConfig) -> BatchedModelSpec:
    """The BatchedModel spec of the lab's sleep model (CPU replicas, nominal profile)."""
    m = config.model
    dims = list(SLEEP_DIMS)
    return BatchedModelSpec.model_validate(
        {
            "model": {
                "name": config.model_name,
                "backend": "python",
                "inputs": [{"name": SLEEP_INPUT, "dataType": "TYPE_FP32", "dims": dims}],
                "outputs": [{"name": SLEEP_OUTPUT, "dataType": "TYPE_FP32", "dims": dims}],
            },
            "sla": {"latencyP99Ms": config.sla_p99_ms, "networkOverheadMs": config.network_overhead_ms},
            "profile": [{"batchSize": b, "latencyMs": round(m.latency_ms(b), 3)} for b in m.profile_sizes],
            "scaling": config.scaling.model_dump(),
            "triton": {"gpusPerReplica": 0},
        }
    )


def sleep_model_config(spec: BatchedModelSpec, plan: PlanStatus, model: SleepModel) -> str:
    """``config.pbtxt`` rendered from the plan (KIND_CPU) plus the sleep model's ``alpha_ms``/``beta_ms``."""
    config = render_model_config(spec, plan, instance_kind="KIND_CPU")
    return config_with_parameters(config, {"alpha_ms": str(model.alpha_ms), "beta_ms": str(model.beta_ms)})


@dataclass(frozen=True)
class Phase:
    """One segment of the schedule: the rate goes linearly from ``rate_from`` to ``rate_to`` (requests/s)."""

    name: str
    start_s: float
    end_s: float
    rate_from: float
    rate_to: float

    def rate_at(self, t: float) -> float:
        span = self.end_s - self.start_s
        x = 0.0 if span <= 0 else min(1.0, max(0.0, (t - self.start_s) / span))
        return self.rate_from + (self.rate_to - self.rate_from) * x


@dataclass(frozen=True)
class LoadSchedule:
    """A piecewise-linear offered rate over consecutive phases (requests/s; one sample per request)."""

    phases: tuple[Phase, ...]

    @classmethod
    def from_ramp(cls, shape: RampShape, unit_rps: float) -> LoadSchedule:
        """The schedule of ``shape`` with one unit = ``unit_rps`` requests/s (normally ``u·C``)."""
        segments = [
            ("warm", shape.warm_s, shape.base, shape.base),
            ("ramp-up", shape.up_s, shape.base, shape.peak),
            ("hold", shape.hold_s, shape.peak, shape.peak),
            ("ramp-down", shape.down_s, shape.peak, shape.low),
            ("low", shape.low_s, shape.low, shape.low),
        ]
        phases, t = [], 0.0
        for name, span, a, b in segments:
            if span > 0:
                phases.append(Phase(name, t, t + span, a * unit_rps, b * unit_rps))
                t += span
        return cls(tuple(phases))

    @property
    def duration_s(self) -> float:
        return self.phases[-1].end_s if self.phases else 0.0

    @property
    def peak_rps(self) -> float:
        return max((max(p.rate_from, p.rate_to) for p in self.phases), default=0.0)

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)

    def phase_at(self, t: float) -> Phase | None:
        for p in self.phases:
            if p.start_s <= t < p.end_s:
                return p
        return None

    def rate_at(self, t: float) -> float:
        p = self.phase_at(t)
        return 0.0 if p is None else p.rate_at(t)

    def arrivals(self, seed: int) -> npt.NDArray[np.float64]:
        """The Poisson arrival times of the whole schedule (seeded)."""
        peak = self.peak_rps
        if peak <= 0:
            return np.zeros(0)
        return varying_poisson_arrivals(self.rate_at, self.duration_s, rate_max_rps=peak, seed=seed)

    def integral(
        self, f: Callable[[float], float], t0: float = 0.0, t1: float | None = None, dt: float = 0.05
    ) -> float:
        """∫ f(rate(t)) dt over [t0, t1] (midpoint rule on a ``dt`` grid)."""
        end = self.duration_s if t1 is None else t1
        n = max(1, math.ceil((end - t0) / dt))
        h = (end - t0) / n
        return sum(f(self.rate_at(t0 + (i + 0.5) * h)) for i in range(n)) * h


# -- records ------------------------------------------------------------------------------------------------------


@dataclass
class ServerRecord:
    """One replica's life (lab times, s). ``removed``: left the Deployment (balancer, Ready set) at that time."""

    index: int
    pod: str
    requested_s: float
    ready_s: float | None = None
    removed_s: float | None = None
    stopped_s: float | None = None
    pid: int | None = None
    grpc_url: str = ""
    metrics_url: str = ""
    log_path: str = ""
    served: int = 0
    # runtime only
    triton: LocalTriton | None = field(default=None, repr=False, compare=False)
    client: Any = field(default=None, repr=False, compare=False)
    inflight: int = field(default=0, repr=False, compare=False)

    def alive_at(self, t: float) -> bool:
        """Part of the Deployment at ``t`` (requested and not yet removed): counts towards spec.replicas."""
        return self.requested_s <= t and (self.removed_s is None or t < self.removed_s)

    def ready_at(self, t: float) -> bool:
        return self.ready_s is not None and self.ready_s <= t and (self.removed_s is None or t < self.removed_s)


@dataclass(frozen=True)
class TickRecord:
    """One control-loop tick: what the lab saw, what the policy decided, what it measured."""

    t: float
    offered_rps: float  # the schedule's rate at t
    sent_rps: float  # arrivals in (t - window, t] / window
    current: int
    ready: int
    starting: int
    desired: int
    recommendation: int | None
    reason: str
    apply: bool
    message: str
    saturated: bool
    sla_at_risk: bool
    state: str
    pods: int
    request_rate_rps: float | None
    inference_rate_rps: float | None
    avg_batch_size: float | None
    batch_fill: float | None
    queue_time_ms: float | None
    p99_ms: float | None
    pending_requests: float | None
    fetch_s: float


@dataclass
class LabResult:
    """What a lab run recorded. Request arrays are indexed by arrival; ``latency_ms`` is NaN for failures."""

    config: LabConfig
    spec: BatchedModelSpec
    plan: PlanStatus
    schedule: LoadSchedule
    ticks: list[TickRecord]
    servers: list[ServerRecord]
    sent_s: npt.NDArray[np.float64]  # scheduled send time
    latency_ms: npt.NDArray[np.float64]  # response - scheduled send; NaN: failed (or never sent)
    send_lag_ms: npt.NDArray[np.float64]  # actual - scheduled send
    server_index: npt.NDArray[np.int64]  # ServerRecord.index the request went to (-1: none)
    failed: int
    errors: list[str]
    wall_s: float
    setup_s: float

    # -- derived numbers ---------------------------------------------------------------------------------------
    @property
    def capacity_rps(self) -> float:
        return self.plan.capacityPerReplicaRps

    @property
    def per_replica_rps(self) -> float:
        """``u·C``: the load one replica is meant to carry."""
        return self.config.scaling.targetUtilization * self.plan.capacityPerReplicaRps

    @property
    def server_budget_ms(self) -> float:
        return self.plan.serverBudgetMs

    @property
    def sla_ms(self) -> float:
        return self.config.sla_p99_ms

    @property
    def duration_s(self) -> float:
        return self.schedule.duration_s

    def need_at(self, t: float) -> int:
        """``ceil(λ(t) / (u·C))`` of the *offered* rate, bounded by min/max (DESIGN §3)."""
        return need_for(self.schedule.rate_at(t), self.capacity_rps, self.config.scaling)

    @property
    def peak_need(self) -> int:
        return need_for(self.schedule.peak_rps, self.capacity_rps, self.config.scaling)

    def current_at(self, t: float) -> int:
        return sum(1 for s in self.servers if s.alive_at(t))

    def ready_at(self, t: float) -> int:
        return sum(1 for s in self.servers if s.ready_at(t))

    @property
    def ok(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.latency_ms)))

    def latencies_between(self, t0: float, t1: float) -> npt.NDArray[np.float64]:
        """Latencies (ms) of the successful requests sent in [t0, t1)."""
        sel = (self.sent_s >= t0) & (self.sent_s < t1) & ~np.isnan(self.latency_ms)
        out: npt.NDArray[np.float64] = self.latency_ms[sel]
        return out

    @property
    def send_lag_p99_ms(self) -> float:
        lag = self.send_lag_ms[~np.isnan(self.send_lag_ms)]
        return float(np.percentile(lag, 99)) if lag.size else math.nan

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready: NaN and Inf become None) for archiving a run next to its plot."""

        def clean(x: Any) -> Any:
            if isinstance(x, float):
                return x if math.isfinite(x) else None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, list | tuple):
                return [clean(v) for v in x]
            if isinstance(x, Path):
                return str(x)
            return x

        servers = [
            {k: getattr(s, k) for k in ("index", "pod", "requested_s", "ready_s", "removed_s", "stopped_s", "served")}
            for s in self.servers
        ]
        out: dict[str, Any] = clean(
            {
                "config": dataclasses.asdict(self.config) | {"scaling": self.config.scaling.model_dump(mode="json")},
                "plan": self.plan.model_dump(mode="json", exclude_none=True),
                "phases": [dataclasses.asdict(p) for p in self.schedule.phases],
                "ticks": [dataclasses.asdict(k) for k in self.ticks],
                "servers": servers,
                "requests": {
                    "sent_s": self.sent_s.round(4).tolist(),
                    "latency_ms": self.latency_ms.round(3).tolist(),
                    "server_index": self.server_index.tolist(),
                },
                "failed": self.failed,
                "errors": self.errors,
                "wall_s": self.wall_s,
                "setup_s": self.setup_s,
            }
        )
        return out


def need_for(rate_rps: float, capacity_rps: float, scaling: ScalingSpec) -> int:
    """The load-proportional count for ``rate_rps`` (:func:`batchfill.policy.plan.replicas_for`)."""
    return replicas_for(rate_rps, capacity_rps, scaling.targetUtilization, scaling.minReplicas, scaling.maxReplicas)


# -- the lab ------------------------------------------------------------------------------------------------------


class LabError(RuntimeError):
    """A lab run could not complete (a server did not start, the event loop failed...)."""


class ScalingLab:
    """One scaling run with real servers; :meth:`run` blocks for the schedule's duration plus setup.

    Args:
        config: the run's settings (defaults: :class:`LabConfig`).
        progress: called with every :class:`TickRecord` as it is recorded (on the event loop: keep it short).
        decide_fn: the replica decision (default :func:`batchfill.policy.scaling.decide`); another function of
            the same signature compares a policy variant on the same real parts.

    Attributes (after construction): ``spec``, ``plan`` (``PlanStatus``), ``schedule`` (rates resolved from the
    plan: one unit of :class:`RampShape` is ``u·C``), ``arrivals`` (seconds, seeded).
    """

    def __init__(
        self,
        config: LabConfig | None = None,
        *,
        progress: Callable[[TickRecord], None] | None = None,
        decide_fn: Callable[[ScalingInput], Decision] = decide,
    ):
        self.config = config = config or LabConfig()
        self._decide = decide_fn
        self.spec = sleep_spec(config)
        self.plan = plan_batching(self.spec, seed=config.seed).to_status()
        if self.plan.capacityPerReplicaRps <= 0:
            raise LabError(f"the plan has no capacity: {self.plan}")
        unit = config.scaling.targetUtilization * self.plan.capacityPerReplicaRps
        self.schedule = LoadSchedule.from_ramp(config.ramp, unit)
        self.arrivals = self.schedule.arrivals(config.seed)
        self.config_pbtxt = sleep_model_config(self.spec, self.plan, config.model)
        self._progress = progress
        self._servers: list[ServerRecord] = []
        self._balancer: list[ServerRecord] = []  # Ready servers, in order of readiness
        self._ticks: list[TickRecord] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._rr = 0
        self._t0 = 0.0
        self._prom: LocalPrometheus | None = None
        self._dir: Path | None = None
        self._failure: BaseException | None = None
        self._failed = 0
        self._errors: list[str] = []
        self._inputs: list[Any] = []

    # -- public ----------------------------------------------------------------------------------------------
    def run(self) -> LabResult:
        """Start Prometheus and ``minReplicas`` servers, play the schedule, stop everything; return the record."""
        own_dir = self.config.work_dir is None
        self._dir = Path(tempfile.mkdtemp(prefix="batchfill-scaling-lab-")) if own_dir else self.config.work_dir
        assert self._dir is not None
        self._dir.mkdir(parents=True, exist_ok=True)
        clean = False
        try:
            result = asyncio.run(self._main())
            clean = result.failed == 0
            return result
        finally:
            self._stop_everything()
            if own_dir and clean and self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    # -- parts -----------------------------------------------------------------------------------------------
    @property
    def repo(self) -> Path:
        assert self._dir is not None
        return self._dir / "models"

    def _now(self) -> float:
        return asyncio.get_running_loop().time() - self._t0

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    def _live(self) -> list[ServerRecord]:
        """Servers in the Deployment (requested, not removed), oldest first."""
        return [s for s in self._servers if s.removed_s is None]

    def _update_targets(self) -> None:
        """Scrape every server whose process runs (starting, Ready or draining), as Prometheus sees pods."""
        assert self._prom is not None
        targets = [
            ScrapeTarget.from_url(s.metrics_url, self.config.namespace, s.pod)
            for s in self._servers
            if s.metrics_url and s.stopped_s is None
        ]
        self._prom.set_targets(targets)

    async def _start_server(self, rec: ServerRecord) -> None:
        assert self._dir is not None
        log = self._dir / f"{rec.pod}.log"
        http, grpc, metrics = free_ports(3)
        triton = LocalTriton(
            self.repo, http_port=http, grpc_port=grpc, metrics_port=metrics, log_path=log, startup_timeout_s=120.0
        )
        rec.triton, rec.log_path = triton, str(log)
        # Scraped from process start, as Prometheus scrapes a Running pod before it is Ready: its counters are
        # already in Prometheus (at 0) when it joins the balancer, so no early traffic is lost to increase().
        rec.metrics_url = f"http://{LOOPBACK}:{metrics}/metrics"
        self._update_targets()
        try:
            await asyncio.to_thread(triton.start)
        except Exception as e:
            raise LabError(f"{rec.pod} did not start: {e}") from e
        rec.pid, rec.grpc_url = triton.pid, triton.grpc_url
        if rec.removed_s is not None:  # scaled in while it was starting
            await asyncio.to_thread(triton.stop)
            rec.stopped_s = self._now()
            self._update_targets()
            return
        import tritonclient.grpc.aio as grpcaio

        rec.client = grpcaio.InferenceServerClient(rec.grpc_url)
        inputs = self._inputs
        for _ in range(self.config.warmup_requests):
            await rec.client.infer(self.config.model_name, inputs, client_timeout=self.config.request_timeout_s)
        if rec.removed_s is not None:
            self._spawn(self._stop_server(rec))
            return
        rec.ready_s = self._now()
        self._balancer.append(rec)

    async def _stop_server(self, rec: ServerRecord) -> None:
        """Drain (the server already left the balancer), then stop it by its PID."""
        deadline = self._now() + self.config.drain_timeout_s
        while rec.inflight > 0 and self._now() < deadline:
            await asyncio.sleep(0.02)
        if rec.client is not None:
            with contextlib.suppress(Exception):
                await rec.client.close()
            rec.client = None
        if rec.triton is not None and rec.triton.is_running():
            await asyncio.to_thread(rec.triton.stop)
        rec.stopped_s = self._now()
        self._update_targets()

    def _scale_to(self, desired: int) -> None:
        live = self._live()
        now = self._now()
        if desired > len(live):
            for _ in range(desired - len(live)):
                k = len(self._servers)
                rec = ServerRecord(k, f"{self.config.name}-{k}", now)
                self._servers.append(rec)
                self._spawn(self._start_server(rec))
        elif desired < len(live):
            for rec in sorted(live, key=lambda s: -s.index)[: len(live) - desired]:  # newest first
                rec.removed_s = now
                if rec in self._balancer:
                    self._balancer.remove(rec)  # no new requests from here on
                if rec.triton is not None and rec.ready_s is not None:
                    self._spawn(self._stop_server(rec))
                # a server still starting is stopped by _start_server when its start returns

    # -- load ------------------------------------------------------------------------------------------------
    async def _load(self, lat: npt.NDArray[np.float64], lag: npt.NDArray[np.float64], where: Any) -> None:
        loop = asyncio.get_running_loop()
        inputs = self._inputs
        pending: set[asyncio.Task[None]] = set()

        async def one(i: int, scheduled: float) -> None:
            lag[i] = (loop.time() - scheduled) * 1e3
            if not self._balancer:
                self._fail(f"no Ready server at t={scheduled - self._t0:.2f} s")
                return
            rec = self._balancer[self._rr % len(self._balancer)]
            self._rr += 1
            where[i] = rec.index
            rec.inflight += 1
            try:
                await rec.client.infer(self.config.model_name, inputs, client_timeout=self.config.request_timeout_s)
            except Exception as e:  # every failure is counted, the run goes on
                self._fail(f"{rec.pod}: {type(e).__name__}: {e}")
                return
            finally:
                rec.inflight -= 1
            lat[i] = (loop.time() - scheduled) * 1e3
            rec.served += 1

        for i, a in enumerate(self.arrivals):
            scheduled = self._t0 + float(a)
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(one(i, scheduled))
            pending.add(task)
            task.add_done_callback(pending.discard)
            if self._failure is not None:
                raise LabError("the lab failed during the load") from self._failure
        if pending:
            await asyncio.gather(*pending)

    def _fail(self, msg: str) -> None:
        self._failed += 1
        if len(self._errors) < 10 and msg[:300] not in self._errors:
            self._errors.append(msg[:300])

    # -- control ---------------------------------------------------------------------------------------------
    async def _control(self, signals: PrometheusSignals) -> None:
        cfg = self.config
        plan_numbers = PlanNumbers.from_status(self.plan)
        history: tuple[Recommendation, ...] = ()
        k = 1
        end = self.schedule.duration_s
        while True:
            t_tick = k * cfg.tick_s
            if t_tick > end:
                return
            await asyncio.sleep(max(0.0, t_tick - self._now()))
            now = self._now()
            live = self._live()
            ready = [s for s in live if s.ready_s is not None]
            target = SignalTarget(
                cfg.namespace, cfg.name, cfg.model_name, self.plan.maxBatchSize, frozenset(s.pod for s in ready)
            )
            t_fetch = time.monotonic()
            sig: ModelSignals = (await asyncio.to_thread(signals.fetch, [target]))[target.key]
            fetch_s = time.monotonic() - t_fetch
            reps = Replicas(current=len(live), ready=len(ready), starting=len(live) - len(ready))
            decision = self._decide(ScalingInput(now, sig, plan_numbers, cfg.scaling, reps, history))
            history = decision.history
            if decision.apply:
                self._scale_to(decision.desired_replicas)
            sent = np.count_nonzero((self.arrivals > now - sig.window_s) & (self.arrivals <= now))
            tick = TickRecord(
                t=round(now, 3),
                offered_rps=self.schedule.rate_at(now),
                sent_rps=float(sent) / sig.window_s,
                current=reps.current,
                ready=reps.ready,
                starting=reps.starting,
                desired=decision.desired_replicas,
                recommendation=decision.recommendation,
                reason=decision.reason,
                apply=decision.apply,
                message=decision.message,
                saturated=decision.saturated,
                sla_at_risk=decision.sla_at_risk,
                state=str(sig.state),
                pods=sig.pods,
                request_rate_rps=sig.request_rate_rps,
                inference_rate_rps=sig.inference_rate_rps,
                avg_batch_size=sig.avg_batch_size,
                batch_fill=sig.batch_fill,
                queue_time_ms=sig.queue_time_ms,
                p99_ms=sig.p99_ms,
                pending_requests=sig.pending_requests,
                fetch_s=fetch_s,
            )
            self._ticks.append(tick)
            if self._progress is not None:
                self._progress(tick)
            k = max(k + 1, math.floor(self._now() / cfg.tick_s) + 1)  # skip ticks a slow fetch overran

    # -- main ------------------------------------------------------------------------------------------------
    async def _main(self) -> LabResult:
        cfg = self.config
        loop = asyncio.get_running_loop()
        t_setup = loop.time()
        self._t0 = t_setup
        self._failed = 0
        self._errors = []
        self._inputs = grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS, seed=cfg.seed)()
        write_model(self.repo, cfg.model_name, self.config_pbtxt, "sleep_model")
        assert self._dir is not None
        self._prom = LocalPrometheus(scrape_interval_s=cfg.scrape_s, work_dir=self._dir / "prometheus")
        await asyncio.to_thread(self._prom.start)
        self._scale_to(cfg.scaling.minReplicas)
        while len(self._balancer) < cfg.scaling.minReplicas:
            if self._failure is not None:
                raise LabError("a server did not start") from self._failure
            await asyncio.sleep(0.05)
        await asyncio.to_thread(self._prom.wait_for_targets, 30.0)
        n = len(self.arrivals)
        lat = np.full(n, np.nan)
        lag = np.full(n, np.nan)
        where = np.full(n, -1, dtype=np.int64)
        signals = PrometheusSignals(self._prom.url, window_s=cfg.window_s, timeout_s=max(1.0, cfg.tick_s))
        self._t0 = loop.time() + 0.05
        for s in self._servers:  # the initial servers were there from the start
            s.requested_s = s.ready_s = 0.0
        setup_s = self._t0 - t_setup
        control = loop.create_task(self._control(signals))
        try:
            await self._load(lat, lag, where)
            await control
        finally:
            if not control.done():
                control.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await control
            signals.close()
        if self._failure is not None:
            raise LabError("the lab failed") from self._failure
        wall = self._now()
        # let scale-ins in flight finish, then stop the rest here (still in the loop: gRPC clients close cleanly)
        while self._tasks:
            await asyncio.sleep(0.05)
        for s in self._servers:
            if s.client is not None:
                with contextlib.suppress(Exception):
                    await s.client.close()
                s.client = None
        return LabResult(
            config=cfg,
            spec=self.spec,
            plan=self.plan,
            schedule=self.schedule,
            ticks=list(self._ticks),
            servers=list(self._servers),
            sent_s=self.arrivals.copy(),
            latency_ms=lat,
            send_lag_ms=lag,
            server_index=where,
            failed=self._failed,
            errors=list(self._errors),
            wall_s=wall,
            setup_s=setup_s,
        )

    def _stop_everything(self) -> None:
        """Stop every server and Prometheus by PID (also after an exception)."""
        for s in self._servers:
            if s.triton is not None:
                with contextlib.suppress(Exception):
                    if s.triton.is_running():
                        s.triton.stop()
                        if s.stopped_s is None:
                            s.stopped_s = math.inf  # stopped after the run
            s.triton = None
            s.client = None
        if self._prom is not None:
            with contextlib.suppress(Exception):
                self._prom.close()
            self._prom = None


# -- analysis (pure) ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NeedStep:
    """The load-proportional need ``ceil(λ/(u·C))`` of the offered rate changes at ``t`` from ``old`` to ``new``."""

    t: float
    old: int
    new: int

    @property
    def up(self) -> bool:
        return self.new > self.old


@dataclass(frozen=True)
class Reaction:
    """How the loop followed one :class:`NeedStep`.

    ``decision_s``: the first tick whose decision reached the new need: for a step up, desired ≥ new at any tick
    after the previous step (a step anticipated by the saturation signal gives a negative delay); for a step
    down, desired ≤ new at a tick after the step. ``capacity_s``: when that many replicas were Ready (step up)
    or the surplus ones were stopped (step down). Either is None if it never happened. ``trigger`` is the
    deciding tick.
    """

    step: NeedStep
    decision_s: float | None
    capacity_s: float | None
    trigger: TickRecord | None

    @property
    def to_decision_s(self) -> float | None:
        return None if self.decision_s is None else self.decision_s - self.step.t

    @property
    def to_capacity_s(self) -> float | None:
        return None if self.capacity_s is None else self.capacity_s - self.step.t


def need_steps(result: LabResult, dt: float = 0.05) -> list[NeedStep]:
    """Every change of the offered load's need over the schedule (sampled every ``dt`` s)."""
    steps: list[NeedStep] = []
    prev = result.need_at(0.0)
    for i in range(1, math.ceil(result.duration_s / dt)):
        t = i * dt
        n = result.need_at(t)
        if n != prev:
            steps.append(NeedStep(round(t, 3), prev, n))
            prev = n
    return steps


def reactions(result: LabResult) -> list[Reaction]:
    """One :class:`Reaction` per :func:`need_steps` entry."""
    steps = need_steps(result)
    out: list[Reaction] = []
    for i, st in enumerate(steps):
        since = steps[i - 1].t if i else -math.inf
        until = steps[i + 1].t if i + 1 < len(steps) else math.inf
        # a step up may have been anticipated (any tick after the previous step); a step down is followed only
        # after it happened (before it, the count may equal the new need on the way up)
        start = since if st.up else st.t
        hit = next(
            (
                k
                for k in result.ticks
                if start < k.t < until + 60.0 and (k.desired >= st.new if st.up else k.desired <= st.new)
            ),
            None,
        )
        capacity: float | None = None
        if hit is not None:
            if st.up:
                times = sorted(s.ready_s for s in result.servers if s.ready_s is not None and s.ready_s >= since)
                counts = [(t, result.ready_at(t)) for t in times]
                capacity = next((t for t, c in counts if t >= hit.t and c >= st.new), None)
            else:
                stops = sorted(s.stopped_s for s in result.servers if s.stopped_s is not None and s.stopped_s >= hit.t)
                alive = [
                    t
                    for t in stops
                    if sum(1 for s in result.servers if s.requested_s <= t and (s.stopped_s is None or s.stopped_s > t))
                    <= st.new
                ]
                capacity = alive[0] if alive and math.isfinite(alive[0]) else None
        out.append(Reaction(st, None if hit is None else hit.t, capacity, hit))
    return out


def replica_seconds(result: LabResult) -> float:
    """∫ replicas dt over the schedule: every server from its request until it was stopped (what a GPU costs:
    a starting pod holds its GPU, a draining one too)."""
    total = 0.0
    end = result.duration_s
    for s in result.servers:
        stop = end if s.stopped_s is None or not math.isfinite(s.stopped_s) else min(s.stopped_s, end)
        total += max(0.0, stop - max(0.0, s.requested_s))
    return total


def lower_bound_replica_seconds(result: LabResult) -> float:
    """∫ λ(t) / C dt: the replica-seconds no autoscaler can beat on the same hardware (DESIGN §3)."""
    c = result.capacity_rps
    return result.schedule.integral(lambda r: r / c)


def ideal_replica_seconds(result: LabResult) -> float:
    """∫ need(t) dt: an autoscaler at ``u·C`` per replica that reacted instantly (bounded by min/max)."""
    return result.schedule.integral(lambda r: float(need_for(r, result.capacity_rps, result.config.scaling)))


@dataclass(frozen=True)
class LatencyWindow:
    t0: float
    t1: float
    requests: int
    p99_ms: float
    max_ms: float


def latency_windows(result: LabResult, width_s: float = 5.0) -> list[LatencyWindow]:
    """Client-side p99 of the requests sent in consecutive ``width_s`` windows (NaN for an empty window)."""
    out: list[LatencyWindow] = []
    t = 0.0
    while t < result.duration_s:
        lat = result.latencies_between(t, t + width_s)
        p99 = float(np.percentile(lat, 99)) if lat.size else math.nan
        out.append(LatencyWindow(t, t + width_s, int(lat.size), p99, float(lat.max()) if lat.size else math.nan))
        t += width_s
    return out


@dataclass(frozen=True)
class PhaseStats:
    name: str
    t0: float
    t1: float
    requests: int
    failed: int
    client_p50_ms: float
    client_p99_ms: float
    client_max_ms: float
    server_p99_ms: float | None  # Triton's summary p99 at the phase's last tick (its own sliding window)
    mean_replicas: float
    mean_need: float


def phase_stats(result: LabResult, phases: Sequence[Phase] | None = None) -> list[PhaseStats]:
    out: list[PhaseStats] = []
    for p in phases if phases is not None else result.schedule.phases:
        sel = (result.sent_s >= p.start_s) & (result.sent_s < p.end_s)
        lat = result.latency_ms[sel]
        ok = lat[~np.isnan(lat)]
        ticks = [k for k in result.ticks if p.start_s <= k.t <= p.end_s]
        span = max(p.end_s - p.start_s, 1e-9)
        grid = np.linspace(p.start_s, p.end_s, max(2, int(span * 10)), endpoint=False)
        out.append(
            PhaseStats(
                name=p.name,
                t0=p.start_s,
                t1=p.end_s,
                requests=int(lat.size),
                failed=int(np.count_nonzero(np.isnan(lat))),
                client_p50_ms=float(np.percentile(ok, 50)) if ok.size else math.nan,
                client_p99_ms=float(np.percentile(ok, 99)) if ok.size else math.nan,
                client_max_ms=float(ok.max()) if ok.size else math.nan,
                server_p99_ms=ticks[-1].p99_ms if ticks else None,
                mean_replicas=float(np.mean([result.current_at(float(t)) for t in grid])),
                mean_need=float(np.mean([result.need_at(float(t)) for t in grid])),
            )
        )
    return out
