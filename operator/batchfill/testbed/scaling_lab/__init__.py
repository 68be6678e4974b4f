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
ticks reaches back before it). The analysis helpers (:func:`need_steps`, :func:`reactions`,
:func:`replica_seconds`, :func:`latency_windows`, :func:`phase_stats`) are pure functions of a
:class:`LabResult`, shared by ``tests/component/test_autoscaling_ramp.py`` and ``benchmarks/scaling_ramp.py``.

Modules: ``config`` (the run's settings, the sleep model's spec and config), ``schedule`` (the load),
``records`` (what a run records), ``analysis`` (what it means) are pure (no I/O; every time is passed in);
``harness`` runs the real parts. The names below are the package's API.

Usage::

    result = ScalingLab(LabConfig()).run()      # about 3.5 minutes with the defaults
    for r in reactions(result): print(r)
"""

from batchfill.testbed.scaling_lab.analysis import (
    LatencyWindow,
    NeedStep,
    PhaseStats,
    Reaction,
    ideal_replica_seconds,
    latency_windows,
    lower_bound_replica_seconds,
    need_steps,
    phase_stats,
    reactions,
    replica_seconds,
)
from batchfill.testbed.scaling_lab.config import (
    SLEEP_DIMS,
    SLEEP_INPUT,
    SLEEP_OUTPUT,
    LabConfig,
    SleepModel,
    sleep_model_config,
    sleep_spec,
)
from batchfill.testbed.scaling_lab.harness import LabError, ScalingLab
from batchfill.testbed.scaling_lab.records import LabResult, ServerRecord, TickRecord, need_for
from batchfill.testbed.scaling_lab.schedule import LoadSchedule, Phase, RampShape

__all__ = [
    "SLEEP_DIMS",
    "SLEEP_INPUT",
    "SLEEP_OUTPUT",
    "LabConfig",
    "LabError",
    "LabResult",
    "LatencyWindow",
    "LoadSchedule",
    "NeedStep",
    "Phase",
    "PhaseStats",
    "RampShape",
    "Reaction",
    "ScalingLab",
    "ServerRecord",
    "SleepModel",
    "TickRecord",
    "ideal_replica_seconds",
    "latency_windows",
    "lower_bound_replica_seconds",
    "need_for",
    "need_steps",
    "phase_stats",
    "reactions",
    "replica_seconds",
    "sleep_model_config",
    "sleep_spec",
]
