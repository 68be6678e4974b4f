"""Execution latency per batch size from Triton's model statistics extension (``/v2/models/<m>/stats``).

Triton keeps, per model version, cumulative ``batch_stats``: for every batch size the backend has executed,
the number of executions and the total nanoseconds spent in ``compute_input``, ``compute_infer`` and
``compute_output``. Their sum divided by the count is the mean execution latency of that batch size, the
quantity ``spec.profile`` holds. Counters are cumulative since the model loaded, so measurements take the
:func:`delta` of two snapshots (the first taken after warm-up).

:func:`parse_model_stats` is pure (it takes the JSON the HTTP client returns); :func:`read_model_stats` and
:func:`measure_profile` talk to a server.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Duration:
    """A Triton ``StatisticDuration``: how many times, and total nanoseconds."""

    count: int = 0
    ns: int = 0

    def __sub__(self, other: Duration) -> Duration:
        return Duration(self.count - other.count, self.ns - other.ns)

    @property
    def mean_ms(self) -> float | None:
        return self.ns / self.count / 1e6 if self.count > 0 else None


@dataclass(frozen=True)
class BatchStat:
    """Cumulative statistics of the executions of one batch size."""

    batch_size: int
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()

    @property
    def executions(self) -> int:
        return self.compute_infer.count

    @property
    def total_ns(self) -> int:
        return self.compute_input.ns + self.compute_infer.ns + self.compute_output.ns

    @property
    def mean_ms(self) -> float | None:
        """Mean execution latency (input + infer + output) of one batch of this size, in ms."""
        return self.total_ns / self.executions / 1e6 if self.executions > 0 else None

    def __sub__(self, other: BatchStat) -> BatchStat:
        if other.batch_size != self.batch_size:
            raise ValueError(f"batch sizes differ: {self.batch_size} vs {other.batch_size}")
        return BatchStat(
            self.batch_size,
            self.compute_input - other.compute_input,
            self.compute_infer - other.compute_infer,
            self.compute_output - other.compute_output,
        )


@dataclass(frozen=True)
class ModelStats:
    """One snapshot (or the difference of two) of a model version's statistics."""

    model: str
    version: str
    inference_count: int = 0  # samples
    execution_count: int = 0  # batches executed
    success: Duration = Duration()  # requests: end-to-end server time
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    batches: Mapping[int, BatchStat] = field(default_factory=dict)

    @property
    def avg_batch_size(self) -> float | None:
        return self.inference_count / self.execution_count if self.execution_count > 0 else None

    def exec_latency_ms(self, min_executions: int = 1) -> dict[int, float]:
        """Mean execution latency per batch size in ms, for batch sizes with ``>= min_executions`` runs."""
        out: dict[int, float] = {}
        for b in sorted(self.batches):
            s = self.batches[b]
            if s.executions >= max(1, min_executions) and s.mean_ms is not None:
                out[b] = s.mean_ms
        return out


def _dur(d: Mapping[str, Any] | None) -> Duration:
    if not d:
        return Duration()
    return Duration(int(d.get("count", 0)), int(d.get("ns", 0)))  # gRPC JSON spells uint64 as strings


def parse_model_stats(stats: Mapping[str, Any], model: str, version: str = "") -> ModelStats:
    """The :class:`ModelStats` of ``model`` in a ``/v2/models/<m>/stats`` JSON answer.

    ``version`` "" means the only (or the highest) version present.
    """
    entries = [e for e in stats.get("model_stats", []) if e.get("name") == model]
    if version:
        entries = [e for e in entries if str(e.get("version")) == str(version)]
    if not entries:
        raise KeyError(f"no statistics for model {model!r} version {version or '(any)'}")
    e = max(entries, key=lambda x: int(x.get("version") or 0))
    inf = e.get("inference_stats", {})
    batches: dict[int, BatchStat] = {}
    for bs in e.get("batch_stats", []) or []:
        b = int(bs["batch_size"])
        batches[b] = BatchStat(
            b, _dur(bs.get("compute_input")), _dur(bs.get("compute_infer")), _dur(bs.get("compute_output"))
        )
    return ModelStats(
        model=model,
        version=str(e.get("version", "")),
        inference_count=int(e.get("inference_count", 0)),
        execution_count=int(e.get("execution_count", 0)),
        success=_dur(inf.get("success")),
        fail=_dur(inf.get("fail")),
        queue=_dur(inf.get("queue")),
        compute_input=_dur(inf.get("compute_input")),
        compute_infer=_dur(inf.get("compute_infer")),
        compute_output=_dur(inf.get("compute_output")),
        batches=batches,
    )


def delta(before: ModelStats, after: ModelStats) -> ModelStats:
    """``after - before``: the statistics of what happened between two snapshots (e.g. without warm-up).

    Raises ValueError when a counter went backwards (the model was reloaded between the snapshots).
    """
    if (before.model, before.version) != (after.model, after.version):
        raise ValueError(
            f"snapshots of different models: {before.model}/{before.version} vs {after.model}/{after.version}"
        )
    batches: dict[int, BatchStat] = {}
    for b, s in after.batches.items():
        d = s - before.batches.get(b, BatchStat(b))
        if d.executions > 0:
            batches[b] = d
    out = replace(
        after,
        inference_count=after.inference_count - before.inference_count,
        execution_count=after.execution_count - before.execution_count,
        success=after.success - before.success,
        fail=after.fail - before.fail,
        queue=after.queue - before.queue,
        compute_input=after.compute_input - before.compute_input,
        compute_infer=after.compute_infer - before.compute_infer,
        compute_output=after.compute_output - before.compute_output,
        batches=batches,
    )
    counters = [out.inference_count, out.execution_count, out.success.count, out.queue.count]
    counters += [x for s in batches.values() for x in (s.executions, s.total_ns)]
    if any(c < 0 for c in counters):
        raise ValueError(f"statistics of {after.model} went backwards: was the model reloaded?")
    return out


def read_model_stats(client: Any, model: str, version: str = "") -> ModelStats:
    """Snapshot of ``model``'s statistics through a ``tritonclient.http.InferenceServerClient``.

    A ``tritonclient.grpc`` client works too (its answer is converted with ``as_json=True``).
    """
    if type(client).__module__.startswith("tritonclient.grpc"):
        raw = client.get_inference_statistics(model, version, as_json=True)
    else:
        raw = client.get_inference_statistics(model, version)  # http client: already a dict
    return parse_model_stats(raw, model, version)


@dataclass(frozen=True)
class ProfileMeasurement:
    """Execution latency per batch size measured on a server, from the statistics deltas after warm-up."""

    model: str
    mean_ms: dict[int, float]  # server-side mean execution latency per batch size
    executions: dict[int, int]
    client_p50_ms: dict[int, float]  # client-side request latency, for comparison (includes transport)
    client_p99_ms: dict[int, float]


def wait_for_counts(
    client: Any,
    model: str,
    *,
    executions: int = 0,
    inferences: int = 0,
    version: str = "",
    timeout_s: float = 2.0,
) -> ModelStats:
    """Poll the statistics until ``execution_count >= executions`` and ``inference_count >= inferences``.

    Triton records an execution's statistics just after it has sent the responses, so a snapshot taken
    right after the last response may miss the last execution. Returns the first snapshot that has the
    counts; raises TimeoutError with the counts seen.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        snap = read_model_stats(client, model, version)
        if snap.execution_count >= executions and snap.inference_count >= inferences:
            return snap
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{model}: statistics show {snap.execution_count} executions and {snap.inference_count} "
                f"inferences, expected at least {executions} and {inferences}"
            )
        time.sleep(0.005)


def measure_profile(
    client: Any,
    model: str,
    make_inputs: Callable[[int], list[Any]],
    batch_sizes: Iterable[int],
    *,
    warmup: int = 3,
    repeats: int = 20,
    version: str = "",
    settle_timeout_s: float = 2.0,
) -> ProfileMeasurement:
    """Send ``repeats`` sequential requests of each batch size and read the execution latency from the stats.

    ``make_inputs(b)`` builds the ``InferInput`` list of one request of b samples. Requests are sent one at a
    time, so with any scheduler each execution holds exactly one request of b samples. The first ``warmup``
    requests of each size are excluded by taking the statistics delta after them. Nobody else may send
    requests to the model meanwhile (the execution counts are checked).
    """
    mean: dict[int, float] = {}
    execs: dict[int, int] = {}
    p50: dict[int, float] = {}
    p99: dict[int, float] = {}
    expected = read_model_stats(client, model, version).execution_count
    for b in batch_sizes:
        inputs = make_inputs(b)
        for _ in range(warmup):
            client.infer(model, inputs, model_version=version)
        expected += warmup
        before = wait_for_counts(client, model, executions=expected, version=version, timeout_s=settle_timeout_s)
        lat = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            client.infer(model, inputs, model_version=version)
            lat.append((time.perf_counter() - t0) * 1e3)
        expected += repeats
        after = wait_for_counts(client, model, executions=expected, version=version, timeout_s=settle_timeout_s)
        d = delta(before, after)
        stat = d.batches.get(b)
        if stat is None or stat.executions != repeats or d.execution_count != repeats or stat.mean_ms is None:
            got = {k: v.executions for k, v in d.batches.items()}
            raise RuntimeError(f"{model}: expected {repeats} executions of batch size {b}, statistics show {got}")
        mean[b], execs[b] = stat.mean_ms, stat.executions
        p50[b], p99[b] = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
    return ProfileMeasurement(model, mean, execs, p50, p99)


def summary_quantile_ms(
    metrics_text: str,
    model: str,
    quantile: float = 0.99,
    metric: str = "nv_inference_request_summary_us",
    version: str | None = None,
) -> float | None:
    """A quantile of one of Triton's latency summaries (``--metrics-config summary_latencies=true``) in ms.

    Parses the Prometheus text of Triton's metrics endpoint. Triton's summaries cover a sliding window of
    recent requests, not the whole lifetime. None when the series is absent or has no observations (NaN).
    """
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(metrics_text):
        if fam.name != metric:
            continue
        for s in fam.samples:
            if s.name != metric or s.labels.get("model") != model:
                continue
            if version is not None and s.labels.get("version") != version:
                continue
            q = s.labels.get("quantile")
            if q is not None and abs(float(q) - quantile) < 1e-9:
                v = float(s.value)
                return v / 1000.0 if math.isfinite(v) else None
    return None
