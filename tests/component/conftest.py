"""Fixtures of the component tests: one real tritonserver (nvidia-pytriton's 2.51 build) per test module.

The server runs with ``--model-control-mode=explicit`` on an initially empty model repository in a temporary
directory; each test writes its models with :func:`batchfill.testbed.model_repo.write_model` and loads them
through the repository API (:func:`load_model`), so one server start (a few seconds) serves a whole module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.model_config_pb2 as mc
import tritonclient.http as httpclient
from google.protobuf import text_format

from batchfill.testbed.model_repo import write_model
from batchfill.testbed.process import process_group_alive
from batchfill.testbed.triton_local import LocalTriton

SLEEP_INPUT = "INPUT0"
SLEEP_OUTPUT = "OUTPUT0"
SLEEP_DIMS = [4]


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """A tritonserver for the module (explicit model control, empty repository)."""
    repo = tmp_path_factory.mktemp("model_repository")
    server = LocalTriton(repo, model_control_mode="explicit", log_path=repo.parent / "tritonserver.log")
    server.start()
    pgid = server.pid
    assert pgid is not None
    try:
        yield server
    finally:
        server.stop()
    assert not process_group_alive(pgid), f"tritonserver {pgid} or one of its stubs survived stop()"


def load_model(triton: LocalTriton, name: str, config_pbtxt: str, example: str) -> Any:
    """Write ``name`` into the server's repository, load it, and return its config as the server sees it."""
    write_model(triton.model_repository, name, config_pbtxt, example)
    client = triton.http_client()
    try:
        client.load_model(name)
    except Exception as e:
        raise AssertionError(f"loading {name} failed: {e}\n{triton.diagnostics()}") from e
    assert client.is_model_ready(name), triton.diagnostics()
    config = client.get_model_config(name)
    client.close()
    return config


def with_parameters(config_pbtxt: str, **parameters: float | str) -> str:
    """``config_pbtxt`` plus ``parameters`` entries (the sleep model's ``alpha_ms``/``beta_ms``).

    The renderer writes no ``parameters`` (Triton's defaults apply to everything it does not list), so the
    test model's own knobs are appended here; the result is checked to parse as a ModelConfig.
    """
    extra = "".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    text = config_pbtxt.rstrip("\n") + "\n" + extra
    text_format.Parse(text, mc.ModelConfig())
    return text


def sleep_config_pb(
    name: str, max_batch_size: int, *, preferred: list[int] | None = None, queue_delay_us: int | None = None
) -> str:
    """A sleep-model config.pbtxt built with Triton's protobuf schema (for tests that need no plan)."""
    cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    cfg.input.add(name=SLEEP_INPUT, data_type=mc.TYPE_FP32, dims=SLEEP_DIMS)
    cfg.output.add(name=SLEEP_OUTPUT, data_type=mc.TYPE_FP32, dims=SLEEP_DIMS)
    if queue_delay_us is not None:
        cfg.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
        cfg.dynamic_batching.preferred_batch_size.extend(preferred or [])
    cfg.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    return text_format.MessageToString(cfg)


def http_fp32_inputs(name: str, sample_shape: list[int], seed: int = 0):  # type: ignore[no-untyped-def]
    """``make_inputs(b)`` for :func:`batchfill.adapters.triton_stats.measure_profile`: b random samples."""

    def make(b: int) -> list[httpclient.InferInput]:
        data = np.random.default_rng(seed).random((b, *sample_shape), dtype=np.float32)
        inp = httpclient.InferInput(name, list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        return [inp]

    return make
