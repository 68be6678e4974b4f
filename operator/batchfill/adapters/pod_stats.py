"""Triton's statistics extension of one running pod: cumulative executions and time per batch size.

``GET http://<pod IP>:<http port>/v2/models/<model>/stats`` through tritonclient.http; only ``batch_stats``
is kept (compute_input + compute_infer + compute_output per size: what the batcher waits for). Every failure
(connection refused, timeout, model not loaded yet, malformed answer) is a :class:`PodStatsError` with the pod's
address, never an exception the loop has to know about.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchfill.adapters.triton_stats import parse_model_stats


class PodStatsError(RuntimeError):
    """The statistics of a pod could not be read (message names the address and the cause)."""


@dataclass(frozen=True)
class PodBatchStats:
    """Cumulative ``{batch size: (executions, total ns)}`` of one pod's model since its Triton started."""

    batches: dict[int, tuple[int, int]]


def read_pod_batch_stats(address: str, model: str, *, timeout_s: float = 2.0) -> PodBatchStats:
    """Read the model's batch statistics from the Triton at ``address`` (``host:port``).

    Raises:
        PodStatsError: anything that prevented a usable answer.
    """
    import tritonclient.http as httpclient

    try:
        client = httpclient.InferenceServerClient(address, connection_timeout=timeout_s, network_timeout=timeout_s)
    except Exception as e:  # a malformed address raises anything from the HTTP stack
        raise PodStatsError(f"{address}: {e}") from None
    try:
        stats = parse_model_stats(client.get_inference_statistics(model), model)
    except KeyError:
        raise PodStatsError(f"{address}: no statistics for model {model!r}") from None
    except Exception as e:  # refused, timeout, HTTP error, bad JSON: the pod's profile is simply not read now
        raise PodStatsError(f"{address}: {type(e).__name__}: {e}") from None
    finally:
        client.close()
    return PodBatchStats({b: (s.executions, s.total_ns) for b, s in stats.batches.items()})
