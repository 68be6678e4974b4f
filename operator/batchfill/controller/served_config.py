"""The plan numbers scaling uses while a hand rollback holds: those of the config the pods run, not the plan's.

A person who rolls the Deployment back (``kubectl rollout undo``, :func:`batchfill.controller.status.hand_rollback`)
puts the pods on an older config.pbtxt until the spec changes. Its max_batch_size and queue delay give another
capacity at SLA than the plan's, and scaling on the plan's would size the replicas for batches the pods do not
form. The served config is read from its ConfigMap (named by its digest, immutable), parsed with Triton's protobuf
schema, and evaluated with the plan's profile and the spec's SLA (:func:`batchfill.policy.plan.config_capacity`).
Pure: the caller reads the ConfigMap.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tritonclient.grpc.model_config_pb2 as model_config_pb2
from google.protobuf import text_format

from batchfill.api.errors import Problem, SpecError
from batchfill.api.spec import BatchedModelSpec, ProfilePoint
from batchfill.api.status import PlannedProfileSource
from batchfill.controller.desired import Desired, Measured
from batchfill.policy.plan import ConfigCapacity, config_capacity
from batchfill.policy.scaling import PlanNumbers

#: Served configs evaluated (one per rolled-back model and profile, while the rollback holds).
SERVED_CACHE_SIZE = 256
#: The largest config.pbtxt parsed, bytes (batchfill renders a few hundred; a ConfigMap holds at most 1 MiB).
MAX_CONFIG_BYTES = 64 * 1024


@dataclass(frozen=True)
class ServedNumbers:
    """The numbers a scaling tick uses, and where they come from.

    Attributes:
        numbers: the decision's plan numbers.
        config_hash: the digest of the config they describe (the plan's, or the one the pods were rolled back to).
        note: why the plan's numbers are used although the pods run another config ("" otherwise).
    """

    numbers: PlanNumbers
    config_hash: str
    note: str = ""


def batching_of(config_text: str) -> tuple[int, tuple[int, ...], int]:
    """(max_batch_size, preferred_batch_size, max_queue_delay_microseconds) of a config.pbtxt; (0, (), 0) when it
    has no ``dynamic_batching`` block or max_batch_size 0 (Triton then runs every request alone).

    Raises:
        ValueError: the text is over :data:`MAX_CONFIG_BYTES` or is not a Triton ModelConfig (the parser's
            message, with its line and column).
    """
    if len(config_text.encode()) > MAX_CONFIG_BYTES:
        raise ValueError(f"config.pbtxt is {len(config_text.encode())} bytes, more than {MAX_CONFIG_BYTES}")
    cfg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(config_text, cfg)
    except text_format.ParseError as err:
        raise ValueError(f"config.pbtxt is not a Triton ModelConfig: {err}") from None
    if cfg.max_batch_size < 1 or not cfg.HasField("dynamic_batching"):
        return 0, (), 0
    batching = cfg.dynamic_batching
    return (
        int(cfg.max_batch_size),
        tuple(int(b) for b in batching.preferred_batch_size),
        int(batching.max_queue_delay_microseconds),
    )


@functools.lru_cache(maxsize=SERVED_CACHE_SIZE)
def _evaluated(spec_json: str, config_text: str) -> ConfigCapacity:
    """:func:`config_capacity` of the config in ``config_text`` for the spec given as JSON (cached: the tick of a
    rolled-back model asks every pass). Raises ValueError or SpecError (not cached)."""
    b, preferred, delay = batching_of(config_text)
    spec = BatchedModelSpec.model_validate_json(spec_json)
    largest = max((p.batchSize for p in spec.profile or ()), default=0)
    if b > largest:
        problem = f"={b} is beyond the profile's largest batch size {largest}; it is never extrapolated"
        raise SpecError([Problem("config.pbtxt max_batch_size", problem)])
    return config_capacity(spec, b, preferred, delay)


def served_numbers(
    desired: Desired, measured: Measured | None, rolled_back: str, config_text: str | None
) -> ServedNumbers:
    """The plan numbers for a tick: the served config's while a hand rollback holds, else the plan's.

    Args:
        desired: the model's plan.
        measured: the measured profile the plan uses (``controller.desired.adopted_profile``), if any.
        rolled_back: the digest of the config a hand rollback put the pods on ("" when none holds).
        config_text: that config's config.pbtxt (its ConfigMap's), None when it was not found.
    """
    plan = PlanNumbers.from_status(desired.plan_status)
    if not rolled_back:
        return ServedNumbers(plan, desired.config_hash)
    if config_text is None:
        return ServedNumbers(plan, desired.config_hash, f"config {rolled_back} runs, but scaling uses the plan's "
                             "numbers: its ConfigMap was not found")  # fmt: skip
    if desired.profile_source == PlannedProfileSource.FIRST_PLAN:
        return ServedNumbers(plan, rolled_back, f"config {rolled_back} runs; no profile yet, so its capacity is "
                             "unknown too")  # fmt: skip
    spec = desired.spec
    if measured:
        spec = spec.model_copy(update={"profile": [ProfilePoint(batchSize=b, latencyMs=ms) for b, ms in measured]})
    try:
        done = _evaluated(spec.model_dump_json(), config_text)
    except (ValueError, SpecError) as err:
        return ServedNumbers(plan, desired.config_hash, f"config {rolled_back} runs, but scaling uses the plan's "
                             f"numbers: {err}")  # fmt: skip
    c = done.candidate
    numbers = PlanNumbers(c.capacity_rps, c.max_batch_size, c.max_queue_delay_us, done.server_budget_ms,
                          done.batch_fill_at_target, done.batch_fill_at_max_target)  # fmt: skip
    return ServedNumbers(numbers, rolled_back)


def served_batch_size(config_text: str | None, default: int) -> int:
    """The max_batch_size of the served config (batch fill's denominator), ``default`` (the plan's) when there is
    no text or it does not parse (:func:`served_numbers` then says why)."""
    if config_text is None:
        return default
    try:
        return batching_of(config_text)[0]
    except ValueError:
        return default


def config_text(configmap: Mapping[str, Any] | None, key: str) -> str | None:
    """The config.pbtxt in a config ConfigMap as read (under ``key``), or None when it is gone or holds none."""
    text = ((configmap or {}).get("data") or {}).get(key)
    return text if isinstance(text, str) and text else None
