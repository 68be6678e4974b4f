"""What a scaling-lab run depends on: the sleep model and its nominal profile, the SLA, the scaling spec, the load
shape and the control loop's periods; and the BatchedModel spec and ``config.pbtxt`` derived from them (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from batchfill.api.spec import BatchedModelSpec, ScalingSpec
from batchfill.api.status import PlanStatus
from batchfill.render import config_with_parameters, render_model_config
from batchfill.testbed.scaling_lab.schedule import RampShape

SLEEP_INPUT = "INPUT0"
SLEEP_OUTPUT = "OUTPUT0"
SLEEP_DIMS = (4,)


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
