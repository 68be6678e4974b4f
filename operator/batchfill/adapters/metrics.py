"""Load signals of every BatchedModel from Triton's Prometheus metrics.

Per tick, one instant PromQL query per signal for **all** BatchedModels, each grouped ``by (namespace, pod,
model)`` (``namespace`` and ``pod`` are the target labels a ServiceMonitor puts on a Triton pod's series;
``model`` is Triton's own label). ``W`` is the window, e.g. ``60s``; ``SEL`` restricts the series to the
models and namespaces of the targets (``{model=~"m1|m2",namespace=~"ns1|ns2"}``)::

    success     sum by (namespace, pod, model) (increase(nv_inference_request_success SEL [W]))       requests
    inferences  sum by (namespace, pod, model) (increase(nv_inference_count SEL [W]))                 samples
    executions  sum by (namespace, pod, model) (increase(nv_inference_exec_count SEL [W]))            batches
    queue_us    sum by (namespace, pod, model) (increase(nv_inference_queue_duration_us SEL [W]))     µs
    p99_us      max by (namespace, pod, model) (nv_inference_request_summary_us{quantile="0.99",...}) µs
    pending     sum by (namespace, pod, model) (nv_inference_pending_request_count SEL)               requests
    failures    sum by (namespace, pod, model) (increase(nv_inference_request_failure SEL [W]))       requests

and two queries per model, not per pod, for the rate variability (policy/headroom.py): ``X`` is the squared
natural-log change over 60 s of the model's request rate summed over every pod it had in the window (demand
outlives pods, so a replaced pod's series still count), evaluated every 15 s over the last 30 min by a
subquery::

    T(o)                 sum by (namespace, model) (increase(nv_inference_request_success SEL [60s] o))
    X                    (ln(T() > 0) - ln(T(offset 60s) > 0)) ^ 2
    rate_change_ms       avg_over_time((X)[1800s:15s])                                   dimensionless
    rate_change_count    count_over_time((X)[1800s:15s])                                 changes

``increase`` is taken per series (per Triton version, per scrape target) and *then* summed, so a counter reset
when one pod restarts is detected by Prometheus on that series alone (docs/field-cases.md#counter-resets);
``increase(sum(...))`` would lose it. Rates are ``Σ increase / W``: Prometheus defines ``increase(v[W])`` as
exactly ``rate(v[W]) * W`` (same extrapolation), so one query gives both the request rate and the divisor of the
queue time.

The aggregation (:func:`aggregate`) is pure: it takes the parsed query results and, for each
:class:`SignalTarget` (one BatchedModel: namespace, Triton model name, plan ``max_batch_size``, its Ready pods),
returns a :class:`~batchfill.policy.signals.ModelSignals`. Only series of the target's namespace, model and Ready
pods count. Increases are summed over those pods before any division (docs/field-cases.md#average-batch-size):

* ``request_rate_rps   = Σ Δnv_inference_request_success / W``
* ``inference_rate_rps = Σ Δnv_inference_count / W``
* ``avg_batch_size     = Σ Δnv_inference_count / Σ Δnv_inference_exec_count`` (samples per executed batch)
* ``batch_fill         = avg_batch_size / max_batch_size``, clipped to [0, 1]
* ``queue_time_ms      = Σ Δnv_inference_queue_duration_us / Σ Δnv_inference_request_success / 1000``
* ``p99_ms             = max over pods of nv_inference_request_summary_us{quantile="0.99"} / 1000``
* ``pending_requests   = Σ nv_inference_pending_request_count`` (now, not over the window)
* ``failure_rate_rps   = Σ Δnv_inference_request_failure / W`` (Triton labels its failures by ``reason``; the
  sum covers them all)
* ``rate_change_rms    = sqrt(rate_change_ms)`` of the target's namespace and model, in Ok and Idle states

States (decisions on edge cases):

* A pod *counts* when all four counter series (success, inferences, executions, queue) are present for it.
  ``increase`` needs two samples in the window, so a pod scraped once so far does not count yet.
* ``Unknown/NoReadyPods``: the target has no Ready pod (checked first: no query result can help).
* ``Unknown/PrometheusUnavailable|PrometheusTimeout|PrometheusError``: any of the eight queries failed (connection
  refused or HTTP 503 / timeout, client- or server-side / any other HTTP error or malformed answer). Every target
  gets it: one Prometheus answers all queries, so partial answers are not mixed.
* ``Unknown/NoSeries``: no Ready pod of the target has the four counter series (not scraped, wrong labels,
  another namespace). Missing data is never zero load (docs/field-cases.md#missing-metrics).
* ``Unknown/InvalidValue``: NaN, ±Inf or a negative value in a counted pod's counter increase, or ±Inf or a
  negative value in its p99 or pending sample. Series of pods that do not count are not inspected.
* ``Unknown/Stalled``: no request succeeded or failed in the window while requests were pending all of it
  (``min_over_time`` of the pending gauge > 0): the server completes nothing, which is neither idle nor a
  measurable load; the policy holds.
* ``Unknown/RequestsInFlight``: requests pending now, none completed in the window, and not pending all of it:
  the first requests of a load that just started (a first execution can take seconds); the policy holds and it
  is no outage (no Warning).
* The rate variability is ``None`` when its series is missing (no rate > 0 at both ends of a change: a new or
  idle model, a scrape interval above 30 s), when fewer than half of the horizon's changes exist
  (``MIN_RATE_CHANGES``), when either value is NaN, ±Inf or negative, or when either of its two queries failed
  (a heavy subquery timing out): it is a refinement whose absence keeps the user's targetUtilization, so it never
  makes the other signals Unknown. Two BatchedModels of one namespace that serve the same Triton model name
  share one variability (the series cannot tell their pods apart).
* ``Idle``: series present, Σ Δsuccess = Σ Δfailure = 0 and nothing pending (docs/field-cases.md#no-traffic).
  Rates are 0;
  average batch size, batch fill, queue time and p99 are ``None`` (no request was served in the window, so
  nothing to average; never NaN); pending is reported.
* ``Ok``: Σ Δsuccess > 0 or Σ Δfailure > 0: requests that fail are traffic, not idleness (a model whose
  execution fails stops the success counter only; Triton 2.51 counts requests it refuses before the model, of
  the wrong shape or data type, in neither counter, so those look like no traffic). Without a success,
  ``queue_time_ms``, ``avg_batch_size`` and ``batch_fill`` are ``None`` (failed executions hold no samples).
  ``avg_batch_size``/``batch_fill`` are ``None`` if Σ Δexec is 0 (an extrapolation corner at the window edge,
  or nothing executed), ``batch_fill`` is ``None`` if ``max_batch_size`` < 1 (no batching).
  ``p99_ms`` is ``None`` when no counted pod has a finite summary: a NaN quantile is Triton's "no observation in
  the summary's sliding window", and a missing summary means Triton runs without
  ``--metrics-config summary_latencies=true``; neither makes the other signals unknown. Triton's summary covers
  its own sliding window of recent requests (prometheus-cpp's ``max_age``), not ``W``. ``pending_requests`` is
  ``None`` if no counted pod has the gauge, ``failure_rate_rps`` if none has the failure counter (it is not
  needed for a pod to count).

:class:`PrometheusSignals` is the thin HTTP part (``prometheus-api-client``'s ``PrometheusConnect``, without its
pandas features): it evaluates the ten queries at one instant and hands the results to :func:`aggregate`.

Long because the queries, the states they lead to and the HTTP part belong together: each empty, NaN and
multi-series case of every query is spelled out beside the query, as KEDA's Prometheus scaler does.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from batchfill.api.reasons import SignalsReason
from batchfill.policy.headroom import MIN_RATE_CHANGES, RATE_CHANGE_HORIZON_S, RATE_CHANGE_LAG_S, RATE_CHANGE_STEP_S
from batchfill.policy.signals import ModelSignals, SignalState

#: (namespace, pod, Triton model name): the grouping of every query.
SeriesKey = tuple[str, str, str]
#: (namespace, BatchedModel name): the key of :func:`aggregate`'s and :meth:`PrometheusSignals.fetch`'s answer.
TargetKey = tuple[str, str]

GROUP_BY = "namespace, pod, model"

#: Signal name -> Triton counter. Each goes through ``increase`` per series, then ``sum``.
COUNTERS: dict[str, str] = {
    "success": "nv_inference_request_success",  # requests
    "inferences": "nv_inference_count",  # samples
    "executions": "nv_inference_exec_count",  # batches
    "queue_us": "nv_inference_queue_duration_us",  # µs, summed over requests
}
P99_METRIC = "nv_inference_request_summary_us"  # µs, quantile label
PENDING_METRIC = "nv_inference_pending_request_count"  # gauge, requests
FAILURE_METRIC = "nv_inference_request_failure"  # counter, requests (one series per failure reason)
SIGNALS = (*COUNTERS, "p99_us", "pending", "pending_min", "failures")
#: The rate variability's two queries (module docstring): optional, their failure leaves it unknown.
RATE_CHANGE_SIGNALS = ("rate_change_ms", "rate_change_count")
#: Their grouping: the model's total over its pods.
RATE_CHANGE_GROUP_BY = "namespace, model"


@dataclass(frozen=True)
class SignalTarget:
    """One BatchedModel as the signal aggregation sees it.

    Attributes:
        namespace: the BatchedModel's namespace (the ``namespace`` label of its pods' series).
        name: the BatchedModel's name (second part of the answer's key; not a label).
        model: the Triton model name (``spec.model.name``; Triton's ``model`` label).
        max_batch_size: the plan's ``max_batch_size`` (Triton does not export it); batch fill's denominator.
        ready_pods: names of the pods that currently belong to the BatchedModel and are Ready.
    """

    namespace: str
    name: str
    model: str
    max_batch_size: int
    ready_pods: frozenset[str] = field(default_factory=frozenset)

    @property
    def key(self) -> TargetKey:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class QueryResults:
    """Parsed answers of the queries, each ``{(namespace, pod, model): value}``.

    Counter values are increases over the window (``success``/``executions``/``inferences``/``failures`` in counts,
    ``queue_us`` in µs); ``p99_us`` is in µs; ``pending`` in requests. Values may be NaN or ±Inf as Prometheus
    sent them; :func:`aggregate` decides what they mean.
    """

    success: Mapping[SeriesKey, float] = field(default_factory=dict)
    inferences: Mapping[SeriesKey, float] = field(default_factory=dict)
    executions: Mapping[SeriesKey, float] = field(default_factory=dict)
    queue_us: Mapping[SeriesKey, float] = field(default_factory=dict)
    p99_us: Mapping[SeriesKey, float] = field(default_factory=dict)
    pending: Mapping[SeriesKey, float] = field(default_factory=dict)
    #: the least each series pending count was over the window (``min_over_time``), requests
    pending_min: Mapping[SeriesKey, float] = field(default_factory=dict)
    failures: Mapping[SeriesKey, float] = field(default_factory=dict)
    #: the rate variability's mean square and count of changes, keyed ``(namespace, "", model)``
    rate_change_ms: Mapping[SeriesKey, float] = field(default_factory=dict)
    rate_change_count: Mapping[SeriesKey, float] = field(default_factory=dict)


@dataclass(frozen=True)
class QueryFailure:
    """A query that did not answer: every target becomes Unknown with ``reason``."""

    reason: SignalsReason  # PROMETHEUS_UNAVAILABLE | PROMETHEUS_TIMEOUT | PROMETHEUS_ERROR
    message: str


class PrometheusResponseError(ValueError):
    """Prometheus answered, but not with an instant vector of ``namespace``/``pod``/``model`` samples."""


# -- PromQL --------------------------------------------------------------------------------------------------------


def promql_duration(seconds: float) -> str:
    """A PromQL duration for ``seconds`` (whole seconds as ``60s``, else milliseconds; PromQL has no ``1.5s``)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"window must be a positive finite number of seconds, got {seconds!r}")
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"window {seconds!r} s is shorter than 1 ms")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _promql_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


_RE2_META = frozenset("\\.+*?()|[]{}^$-")


def _regex_alternatives(values: Iterable[str]) -> str:
    """``a|b|c`` matching exactly the given strings (RE2 metacharacters escaped; Prometheus anchors the regex)."""
    return "|".join("".join("\\" + c if c in _RE2_META else c for c in v) for v in sorted(set(values)))


def series_selector(targets: Iterable[SignalTarget], extra: str = "") -> str:
    """``{model=~"…",namespace=~"…"}`` matching every target's model and namespace (plus ``extra`` matchers)."""
    ts = list(targets)
    matchers = [
        f"model=~{_promql_string(_regex_alternatives(t.model for t in ts))}",
        f"namespace=~{_promql_string(_regex_alternatives(t.namespace for t in ts))}",
    ]
    if extra:
        matchers.insert(0, extra)
    return "{" + ",".join(matchers) + "}"


def build_queries(targets: Iterable[SignalTarget], window_s: float) -> dict[str, str]:
    """The eight PromQL queries (signal name -> query text) for all ``targets`` over ``window_s`` seconds."""
    ts = list(targets)
    if not ts:
        raise ValueError("no targets")
    w = promql_duration(window_s)
    sel = series_selector(ts)
    queries = {name: f"sum by ({GROUP_BY}) (increase({metric}{sel}[{w}]))" for name, metric in COUNTERS.items()}
    p99_sel = series_selector(ts, 'quantile="0.99"')
    queries["p99_us"] = f"max by ({GROUP_BY}) ({P99_METRIC}{p99_sel})"
    queries["pending"] = f"sum by ({GROUP_BY}) ({PENDING_METRIC}{sel})"
    queries["pending_min"] = f"sum by ({GROUP_BY}) (min_over_time({PENDING_METRIC}{sel}[{w}]))"
    queries["failures"] = f"sum by ({GROUP_BY}) (increase({FAILURE_METRIC}{sel}[{w}]))"
    return queries


def build_rate_change_queries(targets: Iterable[SignalTarget]) -> dict[str, str]:
    """The rate variability's two PromQL queries (module docstring) for all ``targets``."""
    ts = list(targets)
    if not ts:
        raise ValueError("no targets")
    sel, lag = series_selector(ts), promql_duration(RATE_CHANGE_LAG_S)

    def total(offset: str) -> str:
        return f"sum by ({RATE_CHANGE_GROUP_BY}) (increase({COUNTERS['success']}{sel}[{lag}]{offset}))"

    change = f"(ln({total('')} > 0) - ln({total(f' offset {lag}')} > 0)) ^ 2"
    sub = f"[{promql_duration(RATE_CHANGE_HORIZON_S)}:{promql_duration(RATE_CHANGE_STEP_S)}]"
    return {
        "rate_change_ms": f"avg_over_time(({change}){sub})",
        "rate_change_count": f"count_over_time(({change}){sub})",
    }


def parse_vector(result: Any) -> dict[SeriesKey, float]:
    """``{(namespace, pod, model): value}`` from the ``data.result`` list of an instant-vector answer.

    Values are Prometheus' strings (``"12.5"``, ``"NaN"``, ``"+Inf"``) converted to float; NaN and ±Inf are kept.
    A missing label becomes "" (such a series matches no target). Raises :class:`PrometheusResponseError` when
    the answer is not a list of ``{"metric": {...}, "value": [t, "v"]}`` or a key occurs twice.
    """
    if not isinstance(result, list):
        raise PrometheusResponseError(f"expected an instant vector (a list), got {type(result).__name__}")
    out: dict[SeriesKey, float] = {}
    for item in result:
        try:
            labels = item["metric"]
            raw = item["value"][1]
            key = (str(labels.get("namespace", "")), str(labels.get("pod", "")), str(labels.get("model", "")))
            value = float(raw)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise PrometheusResponseError(f"malformed sample {str(item)[:200]}: {e}") from e
        if key in out:
            raise PrometheusResponseError(f"two samples for namespace/pod/model {key}")
        out[key] = value
    return out


# -- aggregation (pure) --------------------------------------------------------------------------------------------


def _bad(value: float) -> bool:
    return not math.isfinite(value) or value < 0


def _overflow(**values: float | None) -> str:
    """Empty if every value is finite (or None), else which are not (sums or ratios of absurd samples)."""
    bad = [f"{k}={v}" for k, v in values.items() if v is not None and not math.isfinite(v)]
    return f"not finite: {', '.join(bad)}" if bad else ""


def _fmt(x: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}{unit}"


def rate_change_rms_of(target: SignalTarget, results: QueryResults) -> float | None:
    """The target's rate variability (module docstring), or None when it is not known."""
    key = (target.namespace, "", target.model)
    mean_square, count = results.rate_change_ms.get(key), results.rate_change_count.get(key)
    if mean_square is None or count is None or _bad(mean_square) or _bad(count) or count < MIN_RATE_CHANGES:
        return None
    return math.sqrt(mean_square)


def aggregate_one(target: SignalTarget, results: QueryResults, window_s: float) -> ModelSignals:
    """The :class:`ModelSignals` of one target from parsed query results (see the module docstring).

    Long because each empty, NaN and multi-series case of the eight queries is spelled out in turn, as KEDA's
    Prometheus scaler does.
    """
    w = window_s
    where = f"model {target.model!r} in namespace {target.namespace!r}"
    if not target.ready_pods:
        return ModelSignals.unknown(SignalsReason.NO_READY_PODS, f"{where}: no Ready pod", w)
    keys = [(target.namespace, pod, target.model) for pod in sorted(target.ready_pods)]
    counters = [results.success, results.inferences, results.executions, results.queue_us]
    counted = [k for k in keys if all(k in c for c in counters)]
    if not counted:
        partial = [k[1] for k in keys if any(k in c for c in counters)]
        detail = f" (incomplete series for {', '.join(partial)})" if partial else ""
        return ModelSignals.unknown(
            SignalsReason.NO_SERIES,
            f"{where}: no Triton counter series over the last {promql_duration(w)} for the "
            f"{len(keys)} Ready pod(s) {', '.join(k[1] for k in keys[:5])}{detail}",
            w,
        )
    for k in counted:
        for name, c in zip(COUNTERS, counters, strict=True):
            if _bad(c[k]):
                return ModelSignals.unknown(
                    SignalsReason.INVALID_VALUE, f"{where}: pod {k[1]}: increase of {name} is {c[k]}", w
                )
        for name, g in (("p99_us", results.p99_us), ("pending", results.pending)):
            v = g.get(k)
            if v is not None and not math.isnan(v) and _bad(v):
                return ModelSignals.unknown(SignalsReason.INVALID_VALUE, f"{where}: pod {k[1]}: {name} is {v}", w)
        if k in results.failures and _bad(results.failures[k]):
            return ModelSignals.unknown(
                SignalsReason.INVALID_VALUE, f"{where}: pod {k[1]}: increase of failures is {results.failures[k]}", w
            )

    # Plain sums: an absurd value overflows to inf (fsum would raise) and is caught below.
    success = sum(results.success[k] for k in counted)
    inferences = sum(results.inferences[k] for k in counted)
    executions = sum(results.executions[k] for k in counted)
    queue_us = sum(results.queue_us[k] for k in counted)
    pendings = [results.pending[k] for k in counted if k in results.pending and math.isfinite(results.pending[k])]
    pending = sum(pendings) if pendings else None
    failed = [results.failures[k] for k in counted if k in results.failures]
    failures = sum(failed) if failed else None
    p99s = [results.p99_us[k] for k in counted if k in results.p99_us and math.isfinite(results.p99_us[k])]
    pods = len(counted)
    of = f"{pods} of {len(keys)} Ready pod(s)"

    overflow = _overflow(success=success, inferences=inferences, executions=executions, queue_us=queue_us)
    overflow = overflow or _overflow(pending=pending, failures=failures)
    if overflow:
        return ModelSignals.unknown(SignalsReason.INVALID_VALUE, f"{where}: {overflow}", w)

    failure_rate = None if failures is None else failures / w
    if success == 0 and not failures:
        if pending:
            lows = [results.pending_min[k] for k in counted if k in results.pending_min]
            if lows and all(math.isfinite(x) for x in lows) and sum(lows) > 0:
                return ModelSignals.unknown(
                    SignalsReason.STALLED,
                    f"{where}: no request completed in {promql_duration(w)} while requests were pending all of it "
                    f"({pending:g} now)",
                    w,
                )
            # a load that just started: its first requests have not completed yet (a first batch can take seconds)
            return ModelSignals.unknown(
                SignalsReason.REQUESTS_IN_FLIGHT,
                f"{where}: {pending:g} requests pending, none completed in {promql_duration(w)} yet, and none pending "
                "all of it: no rate to read yet",
                w,
            )
        return ModelSignals(
            state=SignalState.IDLE,
            message=f"{where}: no traffic in the last {promql_duration(w)} ({of} scraped)",
            window_s=w,
            pods=pods,
            request_rate_rps=0.0,
            inference_rate_rps=inferences / w,
            pending_requests=pending,
            failure_rate_rps=failure_rate,
            rate_change_rms=rate_change_rms_of(target, results),
        )

    avg = inferences / executions if executions > 0 and success > 0 else None
    fill = None if avg is None or target.max_batch_size < 1 else min(1.0, max(0.0, avg / target.max_batch_size))
    queue_ms = queue_us / success / 1000.0 if success > 0 else None
    p99_ms = max(p99s) / 1000.0 if p99s else None
    rate = success / w
    variability = rate_change_rms_of(target, results)
    overflow = _overflow(
        avg_batch_size=avg, queue_time_ms=queue_ms, request_rate_rps=rate, inference_rate_rps=inferences / w
    )
    if overflow:
        return ModelSignals.unknown(SignalsReason.INVALID_VALUE, f"{where}: {overflow}", w)
    return ModelSignals(
        state=SignalState.OK,
        message=(
            f"{where}, {of} over {promql_duration(w)}: {rate:.2f} req/s, average batch {_fmt(avg, '', 2)} "
            f"of {target.max_batch_size} (fill {_fmt(fill, '', 2)}), queue {_fmt(queue_ms, ' ms', 2)}/request, "
            f"p99 {_fmt(p99_ms, ' ms')}, pending {_fmt(pending, '', 0)}, failed {_fmt(failure_rate, ' req/s', 2)}, "
            f"rate variability {_fmt(None if variability is None else 100 * variability, ' %/min')}"
        ),
        window_s=w,
        pods=pods,
        request_rate_rps=rate,
        inference_rate_rps=inferences / w,
        avg_batch_size=avg,
        batch_fill=fill,
        queue_time_ms=queue_ms,
        p99_ms=p99_ms,
        pending_requests=pending,
        failure_rate_rps=failure_rate,
        rate_change_rms=variability,
    )


def aggregate(
    targets: Iterable[SignalTarget], results: QueryResults | QueryFailure, window_s: float
) -> dict[TargetKey, ModelSignals]:
    """``{(namespace, BatchedModel name): ModelSignals}`` for every target; pure (no I/O, no clock).

    ``results`` is what the queries returned, or the :class:`QueryFailure` that stopped them (then every
    target is Unknown with its reason). ``window_s`` is the ``increase`` window the queries used, in seconds.
    """
    out: dict[TargetKey, ModelSignals] = {}
    for t in targets:
        if isinstance(results, QueryFailure):
            if not t.ready_pods:
                out[t.key] = aggregate_one(t, QueryResults(), window_s)
            else:
                out[t.key] = ModelSignals.unknown(results.reason, results.message, window_s)
        else:
            out[t.key] = aggregate_one(t, results, window_s)
    return out


# -- HTTP ----------------------------------------------------------------------------------------------------------

_STATUS = re.compile(r"HTTP Status Code (\d+)")


def classify_error(exc: BaseException, url: str) -> QueryFailure:
    """The :class:`QueryFailure` of an exception raised by ``PrometheusConnect.custom_query``.

    Connection errors and HTTP 503 are *unavailable*; client timeouts and Prometheus' own query timeout
    (``errorType: timeout``) are *timeout*; everything else (other HTTP status, non-JSON, not a vector) is *error*.
    """
    import requests
    import urllib3
    from prometheus_api_client.exceptions import PrometheusApiClientException

    # requests wraps urllib3's MaxRetryError, whose ``reason`` (e.g. "Connection refused") is the useful part.
    inner = getattr(exc.args[0], "reason", None) if exc.args else None
    cause = inner if isinstance(inner, BaseException) else exc
    text = f"{type(cause).__name__}: {cause}"[:300]
    # With retries off, urllib3 wraps a read timeout in MaxRetryError, which requests turns into ConnectionError;
    # NewConnectionError (refused, no route) is a subclass of urllib3's timeout errors but is not a timeout.
    timed_out = isinstance(cause, urllib3.exceptions.TimeoutError) and not isinstance(
        cause, urllib3.exceptions.NewConnectionError
    )
    if isinstance(exc, requests.exceptions.Timeout) or timed_out:
        return QueryFailure(SignalsReason.PROMETHEUS_TIMEOUT, f"Prometheus at {url} did not answer in time: {text}")
    if isinstance(exc, requests.exceptions.ConnectionError):
        return QueryFailure(SignalsReason.PROMETHEUS_UNAVAILABLE, f"cannot reach Prometheus at {url}: {text}")
    if isinstance(exc, PrometheusApiClientException):
        m = _STATUS.search(str(exc))
        status = int(m.group(1)) if m else 0
        if '"errorType":"timeout"' in str(exc).replace(" ", ""):
            return QueryFailure(
                SignalsReason.PROMETHEUS_TIMEOUT, f"Prometheus at {url} timed out evaluating a query: {text}"
            )
        if status == 503:
            return QueryFailure(SignalsReason.PROMETHEUS_UNAVAILABLE, f"Prometheus at {url} is unavailable: {text}")
    return QueryFailure(SignalsReason.PROMETHEUS_ERROR, f"bad answer from Prometheus at {url}: {text}")


class PrometheusSignals:
    """Reads the signals of all BatchedModels from Prometheus; one instance per operator, reused every tick.

    Args:
        url: Prometheus base URL, e.g. ``http://prometheus-operated.monitoring:9090``.
        window_s: the ``increase`` window in seconds; at least 4 scrape intervals is a good choice.
        timeout_s: per-query limit in seconds, both for the HTTP request and Prometheus' own evaluation
            (``timeout`` query parameter). Requests are not retried: the next tick is the retry.
        variability_refresh_s: how long the rate variability's answers are reused, seconds. Its two subqueries
            cost Prometheus about 20 times the eight instant queries (0.7 s each for 1,000 models of 2 pods on
            this project's 2-core machine, against 30 ms), and a 30 min estimate barely moves in a minute.
    """

    def __init__(
        self, url: str, window_s: float = 60.0, timeout_s: float = 5.0, variability_refresh_s: float = 60.0
    ) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        promql_duration(window_s)  # validates
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout must be a positive finite number of seconds, got {timeout_s!r}")
        self.url = url.rstrip("/")
        self.window_s = float(window_s)
        self.timeout_s = float(timeout_s)
        if not (math.isfinite(variability_refresh_s) and variability_refresh_s >= 0):
            raise ValueError(
                f"variability refresh must be 0 or a positive finite number of seconds, got {variability_refresh_s!r}"
            )
        self.variability_refresh_s = float(variability_refresh_s)
        #: (evaluation time, Unix seconds; the parsed answers) of the last successful variability queries
        self._variability: tuple[float, dict[str, dict[SeriesKey, float]]] | None = None
        self._prom = PrometheusConnect(url=self.url, retry=Retry(total=0, redirect=0), timeout=timeout_s)
        # the queries run side by side: a pass waits for the slowest, not for their sum
        self._pool = ThreadPoolExecutor(
            max_workers=len(SIGNALS) + len(RATE_CHANGE_SIGNALS), thread_name_prefix="batchfill-prometheus"
        )

    def query_all(self, targets: Iterable[SignalTarget], at: float | None = None) -> QueryResults | QueryFailure:
        """Run the queries at one instant (``at``, Unix seconds; now by default), concurrently; the first failure
        in :data:`SIGNALS` order is the answer. A failure of the optional :data:`RATE_CHANGE_SIGNALS` leaves
        their results empty; their answers younger than ``variability_refresh_s`` are reused (a model listed
        since has no variability until the next refresh)."""
        ts = list(targets)
        now = time.time() if at is None else at
        cached = self._variability
        fresh = cached is not None and 0 <= now - cached[0] < self.variability_refresh_s
        queries = build_queries(ts, self.window_s) | ({} if fresh else build_rate_change_queries(ts))
        params = {"time": f"{now:.3f}", "timeout": promql_duration(self.timeout_s)}
        pending = {name: self._pool.submit(self._prom.custom_query, q, params=params) for name, q in queries.items()}
        parsed: dict[str, dict[SeriesKey, float]] = {}
        for name in SIGNALS:
            try:
                parsed[name] = parse_vector(pending[name].result())
            except Exception as e:  # every failure becomes a state, never an exception in the timer
                for later in pending.values():
                    later.cancel()
                return classify_error(e, self.url)
        if fresh and cached is not None:
            return QueryResults(**parsed, **cached[1])
        wait([pending[name] for name in RATE_CHANGE_SIGNALS])  # both answered, whatever the first one says
        try:
            optional = {name: parse_vector(pending[name].result()) for name in RATE_CHANGE_SIGNALS}
        except Exception:  # the variability stays unknown (module docstring); the other signals stand
            return QueryResults(**parsed)
        self._variability = (now, optional)
        return QueryResults(**parsed, **optional)

    def fetch(self, targets: Iterable[SignalTarget], at: float | None = None) -> dict[TargetKey, ModelSignals]:
        """``{(namespace, BatchedModel name): ModelSignals}`` for ``targets``; never raises for Prometheus trouble.

        Targets without a Ready pod need no query; if no target has one, Prometheus is not asked at all.
        """
        ts = list(targets)
        live = [t for t in ts if t.ready_pods]
        results: QueryResults | QueryFailure = self.query_all(live, at) if live else QueryResults()
        return aggregate(ts, results, self.window_s)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._prom.close()

    def __enter__(self) -> PrometheusSignals:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
