"""What a scaling-lab run records: each replica's life, each control-loop tick, and the whole run with the
numbers derived from it (pure; times are seconds since the load started)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchfill.api.spec import BatchedModelSpec, ScalingSpec
from batchfill.api.status import PlanStatus
from batchfill.policy.plan import replicas_for
from batchfill.testbed.scaling_lab.config import LabConfig
from batchfill.testbed.scaling_lab.schedule import LoadSchedule


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
        """``ceil(λ(t) / (u·C))`` of the *offered* rate, bounded by min/max (:func:`need_for`)."""
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
