"""`batchfill profile`: measure a live Triton model's execution latency per batch size.

Reads the model's metadata and configuration through tritonclient (HTTP), synthesizes valid inputs of the
right shapes and data types, and sends one request of ``b`` samples at a time (so every execution holds exactly
that request). Each execution's latency is read from Triton's statistics extension as the delta of
``batch_stats[b]``'s ``compute_input + compute_infer + compute_output`` after the request: what the batcher
waits for, input and output handling included (a Python-backend model that sleeps 13 ms takes about 14.4 ms at
batch 8), without transport and queueing. The profile is thus the distribution of real executions, not of client
round trips. After ``warmup``
requests per size, ``repeats`` executions are measured; the profile value is their ``quantile`` (default p90),
reported with p50 and p99 as the spread.

Sources: Triton statistics extension (docs/protocol/extension_statistics.md: ``batch_stats`` per batch size,
``compute_*`` ns); tritonclient.http ``get_model_metadata``, ``get_model_config``,
``get_inference_statistics``, ``get_model_repository_index``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchfill.adapters.triton_stats import read_model_stats

#: Triton wire data types the profiler can fill with random values, and their numpy types.
_NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
#: Seconds to wait for the statistics of an execution to appear (Triton records them after the response).
STATS_SETTLE_S = 2.0
#: Characters of a server's message (a model's load failure, an inference error) kept in a one-line error.
SERVER_TEXT_LIMIT = 300
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]+)$")


class ProfileError(RuntimeError):
    """A profile that cannot be measured; the message says why, with the server, model and numbers."""


class ProfileUsageError(ProfileError):
    """A flag or input file that does not fit the model on the server; the message names the option and numbers.

    The command line reports it like any other bad argument (exit 2), and always before measuring.
    """


@dataclass(frozen=True)
class TensorInfo:
    """One input or output as the server declares it: wire data type and dims without the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    @property
    def config_type(self) -> str:
        """The model-configuration spelling (``TYPE_FP32``); BYTES is ``TYPE_STRING``."""
        return "TYPE_STRING" if self.datatype == "BYTES" else f"TYPE_{self.datatype}"


@dataclass(frozen=True)
class ModelInfo:
    """What the server says about the model (metadata + configuration)."""

    name: str
    version: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


@dataclass(frozen=True)
class SizeMeasurement:
    """Execution latencies of one batch size, ms."""

    batch_size: int
    executions_ms: tuple[float, ...]

    def quantile_ms(self, q: float) -> float:
        return float(np.quantile(np.asarray(self.executions_ms), q, method="higher"))


def one_line(text: str, limit: int = SERVER_TEXT_LIMIT) -> str:
    """``text`` on one line: every run of whitespace (newlines too) one space, cut to ``limit`` characters with …."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def check_url(url: str) -> str:
    """``url`` as ``host:port`` (the form tritonclient.http takes); a leading ``http://`` is dropped.

    Raises:
        ProfileUsageError: anything but ``HOST:PORT`` with a port in 1-65535, naming ``--url``.
    """
    text = url.strip()
    if text.lower().startswith("http://"):
        text = text[len("http://") :].rstrip("/")
    elif "://" in text:
        raise ProfileUsageError(
            f"--url {url!r} must be HOST:PORT of Triton's HTTP endpoint (e.g. localhost:8000): drop "
            f"{text.split('://', 1)[0]}:// (only plain HTTP is supported)"
        )
    m = _HOST_PORT.match(text)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        raise ProfileUsageError(
            f"--url {url!r} must be HOST:PORT of Triton's HTTP endpoint, the port in 1-65535 (e.g. localhost:8000)"
        )
    return text


@functools.cache
def _client_class() -> Any:
    """tritonclient's HTTP client whose ``__del__`` stays quiet on an instance its constructor did not finish.

    (tritonclient 2.x: ``__del__`` calls ``close()``, which reads ``_closed``, set last in ``__init__``: a
    constructor that raised printed "Exception ignored in ... __del__" on stderr.)
    """
    import tritonclient.http as httpclient

    class QuietClient(httpclient.InferenceServerClient):  # type: ignore[misc]
        def __del__(self) -> None:
            if getattr(self, "_closed", True) is False:
                with contextlib.suppress(Exception):  # at interpreter exit: nothing left to report to
                    self.close()

    return QuietClient


def connect(url: str, timeout_s: float = 10.0) -> Any:
    """An HTTP client for ``url`` (``host:port``, see :func:`check_url`) whose server answers as live.

    Raises:
        ProfileUsageError: ``url`` is not ``HOST:PORT``.
        ProfileError: when nothing answers at ``url`` or the server is not live.
    """
    url = check_url(url)
    try:
        client = _client_class()(url, connection_timeout=timeout_s, network_timeout=timeout_s)
    except Exception as e:  # the HTTP stack may still refuse a host:port
        raise ProfileError(f"cannot use Triton URL {url!r}: {one_line(str(e))}") from None
    try:
        live = client.is_server_live()
    except Exception as e:  # connection refused, DNS, timeout: all mean "not reachable"
        client.close()
        reason = f"{type(e).__name__}: {one_line(str(e))}".rstrip(": ")
        raise ProfileError(f"cannot reach Triton at {url}: {reason}") from None
    if not live:
        client.close()
        raise ProfileError(f"Triton at {url} answers but is not live")
    return client


def read_model_info(client: Any, url: str, model: str, version: str = "") -> ModelInfo:
    """Metadata and configuration of a ready model.

    Raises:
        ProfileError: when the model is unknown or not ready (with its state and reason from the repository
            index when the server gives them).
    """
    from tritonclient.utils import InferenceServerException

    if not client.is_model_ready(model, version):
        state = ""
        try:
            for entry in client.get_model_repository_index():
                if entry.get("name") == model and (not version or entry.get("version") == version):
                    reason = one_line(entry.get("reason") or "")
                    state = f" (state {entry.get('state', '?')}{': ' + reason if reason else ''})"
                    break
            else:
                state = " (not in the model repository)"
        except InferenceServerException:
            pass
        raise ProfileError(f"model {model!r}{' version ' + version if version else ''} is not ready on {url}{state}")
    try:
        meta = client.get_model_metadata(model, version)
        config = client.get_model_config(model, version)
    except InferenceServerException as e:
        raise ProfileError(f"{url}: cannot read model {model!r}: {one_line(e.message() or str(e))}") from None
    mbs = int(config.get("max_batch_size", 0))

    def tensors(items: Iterable[dict[str, Any]]) -> tuple[TensorInfo, ...]:
        out = []
        for t in items:
            shape = [int(d) for d in t.get("shape", [])]
            dims = shape[1:] if mbs > 0 and shape else shape  # metadata shapes carry the batch dim (-1)
            out.append(TensorInfo(str(t["name"]), str(t["datatype"]), tuple(dims)))
        return tuple(out)

    return ModelInfo(
        name=model,
        version=version,
        platform=str(meta.get("platform", "") or config.get("platform", "")),
        backend=str(config.get("backend", "")),
        max_batch_size=mbs,
        inputs=tensors(meta.get("inputs", [])),
        outputs=tensors(meta.get("outputs", [])),
    )


def input_maker(
    info: ModelInfo, url: str, shapes: dict[str, Sequence[int]] | None = None, seed: int = 0
) -> Callable[[int], list[Any]]:
    """``make(b)``: one request of ``b`` samples of random data for every input.

    Args:
        shapes: dims (without the batch dimension) for inputs whose declared dims are variable (-1).

    Raises:
        ProfileUsageError: ``shapes`` names a tensor that is not an input of the model, or gives dims that do
            not fit its declared ones (rank, and every fixed dim).
        ProfileError: for an input whose data type or variable dims cannot be synthesized, naming it and the
            ``--shape`` to give.
    """
    import tritonclient.http as httpclient

    shapes = shapes or {}
    unknown = set(shapes) - {t.name for t in info.inputs}
    if unknown:
        raise ProfileUsageError(
            f"--shape names {sorted(unknown)}, which are not inputs of {info.name!r} on {url} "
            f"(its inputs: {[t.name for t in info.inputs]})"
        )
    for t in info.inputs:
        given = shapes.get(t.name)
        if given is not None and (
            len(given) != len(t.dims) or any(d >= 0 and g != d for g, d in zip(given, t.dims, strict=True))
        ):
            raise ProfileUsageError(
                f"--shape {t.name}={','.join(str(g) for g in given)} does not fit input {t.name!r} of {info.name!r} on "
                f"{url}, dims {list(t.dims)} (without the batch dimension): fixed dims must be given as they are, "
                "-1 takes any positive size"
            )
    plan: list[tuple[TensorInfo, tuple[int, ...], Any]] = []
    for t in info.inputs:
        dims = tuple(int(d) for d in shapes.get(t.name, t.dims))
        if any(d < 0 for d in dims):
            raise ProfileError(
                f"{url}: input {t.name!r} of {info.name!r} has variable dims {list(t.dims)}; give concrete ones "
                f"with --shape {t.name}=" + ",".join("16" if d < 0 else str(d) for d in t.dims)
            )
        if t.datatype not in _NUMPY:
            raise ProfileError(
                f"{url}: input {t.name!r} of {info.name!r} is {t.datatype}, which batchfill profile cannot "
                "synthesize (its valid contents depend on the model); measure with your own client and type the "
                "profile"
            )
        plan.append((t, dims, _NUMPY[t.datatype]))
    rng = np.random.default_rng(seed)
    cache: dict[int, list[Any]] = {}

    def make(b: int) -> list[Any]:
        if b in cache:
            return cache[b]
        batch = [b] if info.max_batch_size > 0 else []
        out = []
        for t, dims, dtype in plan:
            shape = [*batch, *dims]
            if dtype is np.bool_:
                data = rng.random(shape) < 0.5
            elif np.issubdtype(dtype, np.integer):
                data = rng.integers(0, 2, size=shape).astype(dtype)  # 0/1: valid as ids, masks and lengths
            else:
                data = rng.random(shape).astype(dtype)
            inp = httpclient.InferInput(t.name, shape, t.datatype)
            inp.set_data_from_numpy(data)
            out.append(inp)
        cache[b] = out
        return out

    return make


def default_batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two up to ``max_batch_size``, and ``max_batch_size`` itself; ``[1]`` without batching."""
    if max_batch_size <= 1:
        return [1]
    sizes = [1 << k for k in range(int(math.log2(max_batch_size)) + 1)]
    return sorted({*sizes, max_batch_size})


def measure(
    client: Any,
    info: ModelInfo,
    make_inputs: Callable[[int], list[Any]],
    batch_sizes: Sequence[int],
    *,
    warmup: int = 5,
    repeats: int = 30,
    progress: Callable[[int, int], None] | None = None,
) -> list[SizeMeasurement]:
    """Execution latency of ``repeats`` executions per batch size, each read from the statistics delta.

    ``progress(done, total)`` is called after every measured execution. Nobody else may send requests to the
    model meanwhile: the execution count of every delta is checked.

    Raises:
        ProfileError: a batch size above ``max_batch_size``, an inference that fails, or statistics that do not
            show exactly one execution of the expected size.
    """
    from tritonclient.utils import InferenceServerException

    cap = max(1, info.max_batch_size)
    bad = [b for b in batch_sizes if not 1 <= b <= cap]
    if bad:
        raise ProfileError(f"batch sizes {bad} are outside [1, {cap}] (max_batch_size of {info.name!r})")
    total = len(batch_sizes) * repeats
    done = 0
    out: list[SizeMeasurement] = []
    # Triton records an execution's statistics just after responding: every read waits for the count expected
    expected = _settled(client, info, None).execution_count
    for b in batch_sizes:
        inputs = make_inputs(b)
        try:
            for _ in range(warmup):
                client.infer(info.name, inputs, model_version=info.version)
            expected += warmup
            samples: list[float] = []
            before = _settled(client, info, expected)
            for _ in range(repeats):
                client.infer(info.name, inputs, model_version=info.version)
                after = _settled(client, info, before.execution_count + 1)
                stat = after.batches.get(b)
                prev = before.batches.get(b)
                got = (stat.compute_infer.count if stat else 0) - (prev.compute_infer.count if prev else 0)
                if after.execution_count - before.execution_count != 1 or got != 1 or stat is None:
                    raise ProfileError(
                        f"{info.name!r}: expected one execution of batch size {b}, the statistics show "
                        f"{after.execution_count - before.execution_count} executions ({got} of size {b}); is "
                        "another client sending requests?"
                    )
                ns = stat.total_ns - (prev.total_ns if prev else 0)
                samples.append(ns / 1e6)
                before = after
                expected += 1
                done += 1
                if progress is not None:
                    progress(done, total)
        except InferenceServerException as e:
            raise ProfileError(
                f"{info.name!r}: inference of batch size {b} failed: {one_line(e.message() or str(e))}"
            ) from None
        out.append(SizeMeasurement(b, tuple(samples)))
    return out


def _settled(client: Any, info: ModelInfo, executions: int | None) -> Any:
    """The model's statistics once they show ``executions`` (Triton records an execution after responding)."""
    deadline = time.monotonic() + STATS_SETTLE_S
    while True:
        snap = read_model_stats(client, info.name, info.version)
        if executions is None or snap.execution_count >= executions:
            return snap
        if time.monotonic() > deadline:
            raise ProfileError(
                f"{info.name!r}: statistics show {snap.execution_count} executions, expected {executions}"
            )
        time.sleep(0.002)
