"""Operator settings: environment variables, overridable by `batchfill run` flags. Defaults are documented here.

| variable | default | meaning |
|---|---|---|
| BATCHFILL_PROMETHEUS_URL | http://prometheus-operated.monitoring.svc:9090 | Prometheus that scrapes Triton |
| BATCHFILL_NAMESPACES | (empty: all namespaces) | comma-separated namespaces to watch |
| BATCHFILL_LOG_FORMAT | text | text or json |
| BATCHFILL_METRICS_PORT | 8080 | the operator's own /metrics (0: off) |
| BATCHFILL_RECONCILE_INTERVAL_SECONDS | 15 | status/scaling timer period |
| BATCHFILL_SIGNAL_WINDOW_SECONDS | 60 | rate window of the Prometheus signals (>= 4 scrape intervals) |
| BATCHFILL_PROMETHEUS_TIMEOUT_SECONDS | 5 | per-query timeout; a timeout holds replicas (signals unknown) |
| BATCHFILL_MAX_WORKERS | 8 | threads for synchronous handlers |
| BATCHFILL_REQUEST_TIMEOUT_SECONDS | 30 | Kubernetes API request timeout |
| BATCHFILL_WATCH_SERVER_TIMEOUT_SECONDS | 300 | kopf's WATCH requests ask the API server to end them after this |
| BATCHFILL_WATCH_CLIENT_TIMEOUT_SECONDS | 330 | kopf gives up on a WATCH request after this, whatever the server does |
| BATCHFILL_WATCH_CONNECT_TIMEOUT_SECONDS | 10 | kopf's connect and TLS handshake of a WATCH request |
| BATCHFILL_UNHANDLED_GENERATION_SECONDS | 60 | a generation unhandled this long is reconciled by the scaling loop |
| BATCHFILL_API_QPS | 200 | the operator's own API requests per second on average (kopf's own requests aside) |
| BATCHFILL_API_BURST | 300 | requests the client-side limit lets through at once |
| BATCHFILL_PROFILE_INTERVAL_SECONDS | 60 | how often Triton's statistics of the Ready pods are read (profiling) |
| BATCHFILL_TRITON_HTTP_PORT | 8000 | Triton's HTTP port in the pods (statistics extension) |
| BATCHFILL_TRITON_CPU_IMAGE | (empty: production) | no GPUs (dev, test): Triton pods run this image, KIND_CPU |
| BATCHFILL_LEADER_ELECTION | false (chart: true) | act only while holding a coordination.k8s.io/v1 Lease |
| BATCHFILL_LEADER_ELECTION_LEASE_NAME | batchfill | the Lease's name |
| BATCHFILL_LEADER_ELECTION_NAMESPACE | $POD_NAMESPACE | the Lease's namespace (chart: the release's, downward API) |
| BATCHFILL_LEADER_ELECTION_LEASE_DURATION_SECONDS | 15 | a Lease not renewed for this long may be taken over |
| BATCHFILL_LEADER_ELECTION_RENEW_DEADLINE_SECONDS | 10 | the leader exits when it could not renew for this long |
| BATCHFILL_LEADER_ELECTION_RETRY_PERIOD_SECONDS | 2 | standbys read the Lease, a failed renewal is retried this often |

Leader election (batchfill.policy.leader, batchfill.adapters.leader): with it on, ``batchfill run`` waits until it
holds the Lease before kopf and the scaling/profiling loops start, and exits (status 1) as soon as it cannot
renew it; a stopping leader releases the Lease. Takeover after a leader dies comes within the lease duration
plus one retry period of its last renewal (17 s with the defaults), after a graceful stop within one retry period.

A cluster without GPUs (dev and test clusters, ``batchfill.testbed.images`` builds a local Triton image for them):
``BATCHFILL_TRITON_CPU_IMAGE`` makes every Triton pod run that image instead of ``spec.triton.image`` and renders
config.pbtxt's instance groups as ``KIND_CPU``; the rest of the pod, GPU requests included, is what production
renders (batchfill.controller.desired.render_on_cpu). Unset, the operator renders for production.

A watch that goes silent without closing (a load balancer or NAT that dropped the connection's state, an API server
stuck behind a proxy) would leave spec edits unhandled: kopf's WATCH requests carry the server timeout
(``timeoutSeconds``, so a healthy API server ends each one), and the client timeout ends a request whatever the
other side does; kopf then lists or watches again from the last resourceVersion it saw
(https://docs.kopf.dev/en/stable/configuration/#api-timeouts). Whatever else keeps an edit from its handler,
the scaling loop reconciles a generation that status has not observed for ``BATCHFILL_UNHANDLED_GENERATION_SECONDS``
itself, with one ``GenerationUnhandled`` Event (batchfill.policy.conditions.generation_unhandled).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, Field, ValidationError, model_validator

from batchfill.policy.leader import LeaseTiming

ENV_PREFIX = "BATCHFILL_"
#: The namespace the operator's pod runs in, from the downward API (the chart and deploy/base set it).
POD_NAMESPACE_ENV = "POD_NAMESPACE"
#: field -> environment variable (without ENV_PREFIX)
ENV_NAMES = {
    "prometheus_url": "PROMETHEUS_URL",
    "namespaces": "NAMESPACES",
    "log_format": "LOG_FORMAT",
    "metrics_port": "METRICS_PORT",
    "reconcile_interval_s": "RECONCILE_INTERVAL_SECONDS",
    "signal_window_s": "SIGNAL_WINDOW_SECONDS",
    "prometheus_timeout_s": "PROMETHEUS_TIMEOUT_SECONDS",
    "max_workers": "MAX_WORKERS",
    "request_timeout_s": "REQUEST_TIMEOUT_SECONDS",
    "watch_server_timeout_s": "WATCH_SERVER_TIMEOUT_SECONDS",
    "watch_client_timeout_s": "WATCH_CLIENT_TIMEOUT_SECONDS",
    "watch_connect_timeout_s": "WATCH_CONNECT_TIMEOUT_SECONDS",
    "unhandled_generation_s": "UNHANDLED_GENERATION_SECONDS",
    "api_qps": "API_QPS",
    "api_burst": "API_BURST",
    "profile_interval_s": "PROFILE_INTERVAL_SECONDS",
    "triton_http_port": "TRITON_HTTP_PORT",
    "triton_cpu_image": "TRITON_CPU_IMAGE",
    "leader_election": "LEADER_ELECTION",
    "leader_election_lease_name": "LEADER_ELECTION_LEASE_NAME",
    "leader_election_namespace": "LEADER_ELECTION_NAMESPACE",
    "leader_election_lease_duration_s": "LEADER_ELECTION_LEASE_DURATION_SECONDS",
    "leader_election_renew_deadline_s": "LEADER_ELECTION_RENEW_DEADLINE_SECONDS",
    "leader_election_retry_period_s": "LEADER_ELECTION_RETRY_PERIOD_SECONDS",
}
_TIMING_FIELDS = {
    "lease_duration_s": "leader_election_lease_duration_s",
    "renew_deadline_s": "leader_election_renew_deadline_s",
    "retry_period_s": "leader_election_retry_period_s",
}
# DNS-1123 subdomain (a Lease's name) and label (a namespace's name)
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$"


def env_name(field: str) -> str:
    """The environment variable that sets ``field``."""
    return ENV_PREFIX + ENV_NAMES[field] if field in ENV_NAMES else field


class OperatorSettings(BaseModel):
    """Validated operator settings."""

    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    namespaces: tuple[str, ...] = ()
    log_format: str = Field(default="text", pattern="^(text|json)$")
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    reconcile_interval_s: float = Field(default=15.0, gt=0, le=3600)
    signal_window_s: float = Field(default=60.0, ge=1, le=86_400)
    prometheus_timeout_s: float = Field(default=5.0, gt=0, le=300)
    max_workers: int = Field(default=8, ge=1, le=256)
    request_timeout_s: float = Field(default=30.0, gt=0, le=600)
    # below the API server's own default (--min-request-timeout 1800 s, randomized up to 2x), so a watch is renewed
    # often; the client timeout is larger, so a healthy server always ends the request first. Whole seconds: kopf
    # sends it as str(value) in timeoutSeconds, and the API server refuses "300.0" (HTTP 400)
    watch_server_timeout_s: int = Field(default=300, ge=1, le=3600)
    watch_client_timeout_s: float = Field(default=330.0, ge=1, le=7200)
    watch_connect_timeout_s: float = Field(default=10.0, gt=0, le=600)
    unhandled_generation_s: float = Field(default=60.0, gt=0, le=86_400)
    # Not controller-runtime's 20/30: 1,000 new BatchedModels cost the operator about 8,000 requests (children,
    # status writes, Events; docs/benchmarks/scale.md), over 6 minutes at 20 req/s and 80 s at 100. Karpenter's
    # 200/300 (https://github.com/aws/karpenter/pull/723), another controller that creates objects in fleets. The API
    # server protects itself with API Priority and Fairness (HTTP 429, retried: adapters/kube.py); the client-side
    # limit only stops a runaway loop.
    api_qps: float = Field(default=200.0, gt=0, le=10_000)
    api_burst: int = Field(default=300, ge=1, le=100_000)
    profile_interval_s: float = Field(default=60.0, gt=0, le=86_400)
    triton_http_port: int = Field(default=8000, ge=1, le=65535)
    triton_cpu_image: str = Field(default="", max_length=1024, pattern=r"^[!-~]*$")  # an image reference (no spaces)
    leader_election: bool = False
    leader_election_lease_name: str = Field(default="batchfill", max_length=253, pattern=_SUBDOMAIN)
    leader_election_namespace: str = Field(default="", pattern=_LABEL)
    leader_election_lease_duration_s: int = Field(default=15, ge=2, le=3600)
    leader_election_renew_deadline_s: float = Field(default=10.0, gt=0, le=3600)
    leader_election_retry_period_s: float = Field(default=2.0, gt=0, le=600)

    @property
    def lease_timing(self) -> LeaseTiming:
        return LeaseTiming(
            lease_duration_s=self.leader_election_lease_duration_s,
            renew_deadline_s=self.leader_election_renew_deadline_s,
            retry_period_s=self.leader_election_retry_period_s,
        )

    @model_validator(mode="after")
    def _settings_are_usable(self) -> OperatorSettings:
        problems = [f"{env_name(_TIMING_FIELDS[f])}: {msg}" for f, msg in self.lease_timing.problems()]
        if self.watch_client_timeout_s <= self.watch_server_timeout_s:
            problems.append(
                f"{env_name('watch_client_timeout_s')}: must be above {env_name('watch_server_timeout_s')} "
                f"({self.watch_server_timeout_s:g} s), or every healthy watch is cut before the server ends it"
            )
        if self.leader_election and not self.leader_election_namespace:
            problems.append(
                f"{env_name('leader_election_namespace')}: the Lease's namespace is needed when "
                f"{env_name('leader_election')} is on; set it or {POD_NAMESPACE_ENV} (the pod's namespace, "
                "from the downward API)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def exact_namespaces(self) -> tuple[str, ...]:
        """``namespaces`` when every entry is a plain name (no kopf glob ``*``, ``?``, ``!``, ``,``), else ()."""
        exact = all(not any(c in n for c in "*?!,") for n in self.namespaces)
        return self.namespaces if exact else ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> OperatorSettings:
        """Settings from ``BATCHFILL_*`` variables, then ``overrides`` (None values ignored)."""
        env = os.environ if env is None else env
        raw: dict[str, object] = {}
        for field, suffix in ENV_NAMES.items():
            value = env.get(ENV_PREFIX + suffix)
            if value is not None and value != "":
                raw[field] = value
        if "leader_election_namespace" not in raw and env.get(POD_NAMESPACE_ENV):
            raw["leader_election_namespace"] = env[POD_NAMESPACE_ENV]
        if isinstance(raw.get("namespaces"), str):
            raw["namespaces"] = tuple(n.strip() for n in str(raw["namespaces"]).split(",") if n.strip())
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(raw)


def describe_errors(error: ValidationError) -> list[str]:
    """One line per problem of ``OperatorSettings`` validation, naming the environment variable."""
    out = []
    for problem in error.errors(include_url=False):
        loc = ".".join(str(x) for x in problem["loc"])
        msg = str(problem["msg"]).removeprefix("Value error, ")
        out.append(f"{env_name(loc)} ({loc}): {msg}" if loc else msg)
    return out
