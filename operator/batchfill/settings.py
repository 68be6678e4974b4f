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
| BATCHFILL_PROFILE_INTERVAL_SECONDS | 60 | how often Triton's statistics of the Ready pods are read (profiling) |
| BATCHFILL_TRITON_HTTP_PORT | 8000 | Triton's HTTP port in the pods (statistics extension) |
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, Field

ENV_PREFIX = "BATCHFILL_"


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
    profile_interval_s: float = Field(default=60.0, gt=0, le=86_400)
    triton_http_port: int = Field(default=8000, ge=1, le=65535)

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
        names = {
            "prometheus_url": "PROMETHEUS_URL",
            "namespaces": "NAMESPACES",
            "log_format": "LOG_FORMAT",
            "metrics_port": "METRICS_PORT",
            "reconcile_interval_s": "RECONCILE_INTERVAL_SECONDS",
            "signal_window_s": "SIGNAL_WINDOW_SECONDS",
            "prometheus_timeout_s": "PROMETHEUS_TIMEOUT_SECONDS",
            "max_workers": "MAX_WORKERS",
            "request_timeout_s": "REQUEST_TIMEOUT_SECONDS",
            "profile_interval_s": "PROFILE_INTERVAL_SECONDS",
            "triton_http_port": "TRITON_HTTP_PORT",
        }
        for field, suffix in names.items():
            value = env.get(ENV_PREFIX + suffix)
            if value is not None and value != "":
                raw[field] = value
        if isinstance(raw.get("namespaces"), str):
            raw["namespaces"] = tuple(n.strip() for n in str(raw["namespaces"]).split(",") if n.strip())
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(raw)
