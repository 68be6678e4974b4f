"""The scaling lab's harness: real tritonservers as the Deployment's replicas, a real Prometheus, the seeded load
and the control loop on one event loop (the package docstring says how they play together)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchfill.adapters.metrics import PrometheusSignals, SignalTarget
from batchfill.policy.plan import plan_batching
from batchfill.policy.scaling import Decision, PlanNumbers, Recommendation, Replicas, Saturation, ScalingInput, decide
from batchfill.policy.signals import ModelSignals
from batchfill.testbed.loadgen import grpc_fp32_input
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.process import LOOPBACK, free_ports
from batchfill.testbed.prometheus_local import LocalPrometheus, ScrapeTarget
from batchfill.testbed.scaling_lab.config import SLEEP_DIMS, SLEEP_INPUT, LabConfig, sleep_model_config, sleep_spec
from batchfill.testbed.scaling_lab.records import LabResult, ServerRecord, TickRecord
from batchfill.testbed.scaling_lab.schedule import LoadSchedule
from batchfill.testbed.triton_local import LocalTriton


@dataclass
class _Replica(ServerRecord):
    """A :class:`ServerRecord` while the lab runs it: its server, its gRPC client, its requests in flight."""

    triton: LocalTriton | None = field(default=None, repr=False, compare=False)
    client: Any = field(default=None, repr=False, compare=False)
    inflight: int = field(default=0, repr=False, compare=False)


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
        self._servers: list[_Replica] = []
        self._balancer: list[_Replica] = []  # Ready servers, in order of readiness
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

    def _live(self) -> list[_Replica]:
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

    async def _start_server(self, rec: _Replica) -> None:
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

    async def _stop_server(self, rec: _Replica) -> None:
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
                rec = _Replica(k, f"{self.config.name}-{k}", now)
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
        saturation: Saturation | None = None
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
            decision = self._decide(ScalingInput(now, sig, plan_numbers, cfg.scaling, reps, history, saturation))
            history, saturation = decision.history, decision.saturation
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
