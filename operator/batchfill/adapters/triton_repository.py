"""Triton's model repository API on one pool pod: load, unload, the repository index, model readiness.

Thin I/O over tritonclient.http (``load_model``, ``unload_model``, ``get_model_repository_index``,
``is_model_ready``) against ``<pod IP>:<HTTP port>``, every call with a connect timeout and a read timeout. The
requests themselves are built by :mod:`batchfill.render.pool` (pure); the decisions of which to send are
:mod:`batchfill.controller.pool_models` (pure). Protocol:
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md

No call raises for what the pod answers or fails to answer: each returns its value or a :class:`TritonCallError`
naming the pod, the model, the HTTP status (None when no answer came: refused, timed out) and Triton's message on
one line, at most ``SERVER_TEXT_LIMIT`` characters, so no traceback or multi-kilobyte load log reaches an Event.

A load that times out is not known to have failed: Triton carries on loading, and the index says ``LOADING`` until
it ends (the decisions wait for that rather than load again).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from batchfill.adapters.profiler import SERVER_TEXT_LIMIT, one_line
from batchfill.policy.cost import ExecutionCounters
from batchfill.render.pool import TritonRequest

#: Seconds to open a connection to a pod (a pod IP on the cluster network answers in milliseconds or not at all).
CONNECT_TIMEOUT_S = 2.0
#: Seconds to wait for the index, a readiness answer or an unload (Triton answers these from memory).
READ_TIMEOUT_S = 10.0
#: Seconds to wait for a load to finish: Triton answers a load only once the model is ready or has failed, which
#: for a large engine or a cold repository takes minutes; a load still running after this is ``LOADING``.
LOAD_TIMEOUT_S = 120.0

_LOAD_PATH = re.compile(r"^/v2/repository/models/(?P<model>[^/]+)/load$")
_T = TypeVar("_T")


class ModelState(StrEnum):
    """A model's state in Triton's repository index (``state``; a model of the repository never loaded has none,
    which is UNAVAILABLE here: not loaded)."""

    READY = "READY"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True)
class IndexEntry:
    """One model of a pod's repository index: its Triton name, state and Triton's reason (one line, bounded)."""

    model: str
    state: ModelState
    reason: str = ""


@dataclass(frozen=True)
class TritonCallError:
    """A repository call that did not succeed: ``call`` (load, unload, index, ready) on ``pod`` for ``model`` (""
    for the index); ``status`` is the HTTP status, None when no HTTP answer came; ``message`` one bounded line."""

    pod: str
    model: str
    call: str
    status: int | None
    message: str

    def __str__(self) -> str:
        what = f"{self.call} {self.model}" if self.model else self.call
        answer = f"HTTP {self.status}" if self.status is not None else "no answer"
        return f"pod {self.pod}: {what}: {answer}: {self.message}"


def _error(pod: str, model: str, call: str, e: Exception) -> TritonCallError:
    """The :class:`TritonCallError` of an exception from tritonclient or the HTTP stack below it."""
    from tritonclient.utils import InferenceServerException

    if isinstance(e, InferenceServerException):
        status = e.status()
        code = int(status) if status is not None and str(status).isdigit() else None
        return TritonCallError(pod, model, call, code, one_line(e.message() or "", SERVER_TEXT_LIMIT))
    # refused, reset, DNS, timeout (gevent's socket.timeout): the pod did not answer
    text = f"{type(e).__name__}: {e}".rstrip(": ")
    return TritonCallError(pod, model, call, None, one_line(text, SERVER_TEXT_LIMIT))


def _call(
    address: str, pod: str, model: str, call: str, timeout_s: float, fn: Callable[[Any], _T]
) -> _T | TritonCallError:
    """``fn(client)`` with a client for ``address`` (``host:port``) and the timeouts; errors as a result."""
    import tritonclient.http as httpclient

    try:
        client = httpclient.InferenceServerClient(
            address, connection_timeout=min(CONNECT_TIMEOUT_S, timeout_s), network_timeout=timeout_s
        )
    except Exception as e:  # a malformed address raises anything from the HTTP stack
        return _error(pod, model, call, e)
    try:
        return fn(client)
    except Exception as e:  # every failure of the call is the pod's answer (or its silence), never ours to raise
        return _error(pod, model, call, e)
    finally:
        client.close()


def load(
    address: str, pod: str, request: TritonRequest, *, timeout_s: float = LOAD_TIMEOUT_S
) -> TritonCallError | None:
    """Execute ``request`` (:func:`batchfill.render.pool.load_request`) on the Triton at ``address``: None once the
    model is loaded and ready with the request's ``config``, else why not.

    Raises:
        ValueError: ``request`` is not a load request (a bug of the caller, not an answer of the pod).
    """
    m = _LOAD_PATH.match(request.path)
    if request.method != "POST" or m is None:
        raise ValueError(f"not a load request: {request.method} {request.path}")
    model = m["model"]
    config = (request.body.get("parameters") or {}).get("config")
    result = _call(address, pod, model, "load", timeout_s, lambda c: c.load_model(model, config=config))
    return result if isinstance(result, TritonCallError) else None


def unload(address: str, pod: str, model: str, *, timeout_s: float = READ_TIMEOUT_S) -> TritonCallError | None:
    """Unload ``model`` (its dependents stay, as :func:`batchfill.render.pool.unload_request`): None on success."""
    result = _call(address, pod, model, "unload", timeout_s, lambda c: c.unload_model(model, unload_dependents=False))
    return result if isinstance(result, TritonCallError) else None


def parse_index(pod: str, answer: Any) -> dict[str, IndexEntry] | TritonCallError:
    """``{Triton model name: entry}`` of an index answer (a JSON list of ``{name, version?, state?, reason?}``).

    A model with several versions is READY when one is, else LOADING or UNLOADING when one is, else UNAVAILABLE.
    An answer of another shape, or a state this module does not know, is an error: an index that cannot be read
    says nothing about what the pod holds.
    """
    if not isinstance(answer, list):
        return TritonCallError(pod, "", "index", 200, f"not a list: {type(answer).__name__}")
    rank = {ModelState.READY: 0, ModelState.LOADING: 1, ModelState.UNLOADING: 2, ModelState.UNAVAILABLE: 3}
    out: dict[str, IndexEntry] = {}
    for item in answer:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
            return TritonCallError(pod, "", "index", 200, one_line(f"an entry without a name: {item!r}", 200))
        raw = item.get("state") or ModelState.UNAVAILABLE.value
        if raw not in ModelState.__members__:
            return TritonCallError(pod, item["name"], "index", 200, one_line(f"unknown state {raw!r}", 200))
        entry = IndexEntry(item["name"], ModelState(raw), one_line(str(item.get("reason") or ""), SERVER_TEXT_LIMIT))
        seen = out.get(entry.model)
        if seen is None or rank[entry.state] < rank[seen.state]:
            out[entry.model] = entry
    return out


def repository_index(
    address: str, pod: str, *, timeout_s: float = READ_TIMEOUT_S
) -> dict[str, IndexEntry] | TritonCallError:
    """``POST v2/repository/index`` on the pod: every model of its repository with its state (:func:`parse_index`)."""
    answer = _call(address, pod, "", "index", timeout_s, lambda c: c.get_model_repository_index())
    return answer if isinstance(answer, TritonCallError) else parse_index(pod, answer)


def model_ready(address: str, pod: str, model: str, *, timeout_s: float = READ_TIMEOUT_S) -> bool | TritonCallError:
    """``GET v2/models/<m>/ready`` (:func:`batchfill.render.pool.ready_path`): True on 200, False on another answer."""
    return _call(address, pod, model, "ready", timeout_s, lambda c: bool(c.is_model_ready(model)))


def parse_execution_counters(pod: str, answer: Any) -> dict[str, ExecutionCounters] | TritonCallError:
    """``{Triton model name: its cumulative compute input/infer/output time, µs}`` of a ``GET v2/models/stats``
    answer (Triton's statistics extension, every model: ``model_stats[].inference_stats.compute_*.ns``), each
    model's versions summed. An answer of another shape is an error: counters that cannot be read are unknown.
    """
    stats = answer.get("model_stats") if isinstance(answer, Mapping) else None
    if not isinstance(stats, list):
        return TritonCallError(pod, "", "stats", 200, "no model_stats list in the answer")
    out: dict[str, list[float]] = {}
    for entry in stats:
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not name:
            return TritonCallError(pod, "", "stats", 200, one_line(f"an entry without a name: {entry!r}", 200))
        inference = entry.get("inference_stats") or {}
        try:
            parts = [float((inference.get(k) or {}).get("ns", 0)) / 1000.0 for k in _COMPUTE]
        except (TypeError, ValueError, AttributeError):
            return TritonCallError(pod, name, "stats", 200, one_line(f"unreadable durations: {inference!r}", 200))
        total = out.setdefault(name, [0.0, 0.0, 0.0])
        for i, p in enumerate(parts):
            total[i] += p
    return {m: ExecutionCounters(*parts) for m, parts in sorted(out.items())}


_COMPUTE = ("compute_input", "compute_infer", "compute_output")


def execution_counters(
    address: str, pod: str, *, timeout_s: float = READ_TIMEOUT_S
) -> dict[str, ExecutionCounters] | TritonCallError:
    """Every model's execution counters on the pod (:func:`parse_execution_counters`), for the cost split."""
    answer = _call(address, pod, "", "stats", timeout_s, lambda c: c.get_inference_statistics())
    return answer if isinstance(answer, TritonCallError) else parse_execution_counters(pod, answer)
