"""The numbers scaling uses while a hand rollback holds (controller/served_config.py): parsing, and the cases where
the plan's numbers stay, each with its reason."""

from __future__ import annotations

import pytest

from batchfill.controller.desired import desired_state
from batchfill.controller.served_config import MAX_CONFIG_BYTES, batching_of, served_numbers

from .conftest import SEED_DOC, with_spec


def test_the_batching_of_a_rendered_config_is_read_with_tritons_schema() -> None:
    desired = desired_state(SEED_DOC["spec"])
    plan = desired.plan_status
    assert batching_of(desired.config) == (
        plan.maxBatchSize, tuple(plan.preferredBatchSizes), plan.maxQueueDelayMicroseconds,
    )  # fmt: skip
    off = desired_state(with_spec(SEED_DOC, batching={"maxBatchSize": 0})["spec"])
    assert batching_of(off.config) == (0, (), 0)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("max_batch_size: lots", "is not a Triton ModelConfig"),
        ("no_such_field: 1", "is not a Triton ModelConfig"),
        ("#" * (MAX_CONFIG_BYTES + 1), f"more than {MAX_CONFIG_BYTES}"),
    ],
)
def test_a_config_that_is_no_model_config_is_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        batching_of(text)


def test_the_plans_numbers_stay_when_the_served_config_cannot_be_evaluated() -> None:
    desired = desired_state(SEED_DOC["spec"])
    plan = desired.plan_status
    same = served_numbers(desired, None, "", None)
    assert (same.numbers.capacity_rps, same.config_hash, same.note) == (plan.capacityPerReplicaRps,
                                                                      desired.config_hash, "")  # fmt: skip
    gone = served_numbers(desired, None, "0123456789abcdef", None)
    assert gone.numbers.capacity_rps == plan.capacityPerReplicaRps
    assert "config 0123456789abcdef runs, but scaling uses the plan's numbers: its ConfigMap was not found" in gone.note
    broken = served_numbers(desired, None, "0123456789abcdef", "max_batch_size: lots")
    assert "is not a Triton ModelConfig" in broken.note
    assert broken.numbers.capacity_rps == plan.capacityPerReplicaRps
    wide = served_numbers(desired, None, "0123456789abcdef", "max_batch_size: 64\ndynamic_batching {}\n")
    assert "config.pbtxt max_batch_size=64 is beyond the profile's largest batch size 8" in wide.note
    served = served_numbers(desired, None, "0123456789abcdef",
                            "max_batch_size: 1\ndynamic_batching { max_queue_delay_microseconds: 100 }\n")  # fmt: skip
    assert served.note == ""
    assert served.config_hash == "0123456789abcdef"
    assert 0 < served.numbers.capacity_rps < plan.capacityPerReplicaRps
    assert served.numbers.max_batch_size == 1
