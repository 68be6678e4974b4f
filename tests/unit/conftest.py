from __future__ import annotations

import copy
from typing import Any

import pytest

from batchfill.api.spec import API_VERSION, KIND

SEED_DOC: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": KIND,
    "metadata": {"name": "resnet50", "namespace": "ml"},
    "spec": {
        "model": {"name": "resnet50", "platform": "onnxruntime_onnx"},
        "sla": {"latencyP99Ms": 100, "networkOverheadMs": 10},
        "profile": [
            {"batchSize": 1, "latencyMs": 10},
            {"batchSize": 4, "latencyMs": 28},
            {"batchSize": 8, "latencyMs": 50},
        ],
    },
}

# The spec the field cases are stated for (docs/field-cases.md): SLA 50 ms, no network overhead.
CASES_DOC: dict[str, Any] = {
    "metadata": {"name": "resnet", "namespace": "ml"},
    "spec": {
        "model": {
            "name": "resnet50",
            "backend": "onnxruntime",
            "inputs": [{"name": "INPUT__0", "dataType": "TYPE_FP32", "dims": [3, 224, 224]}],
            "outputs": [{"name": "OUTPUT__0", "dataType": "TYPE_FP32", "dims": [1000]}],
        },
        "sla": {"latencyP99Ms": 50},
        "profile": [
            {"batchSize": 1, "latencyMs": 4},
            {"batchSize": 8, "latencyMs": 12},
            {"batchSize": 32, "latencyMs": 35},
            {"batchSize": 64, "latencyMs": 70},
        ],
        "scaling": {"minReplicas": 1, "maxReplicas": 4},
    },
}


def with_spec(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with spec sections merged in (``batching={...}``)."""
    doc = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(doc["spec"].get(key), dict):
            doc["spec"][key].update(value)
        else:
            doc["spec"][key] = value
    return doc


@pytest.fixture
def seed_doc() -> dict[str, Any]:
    return copy.deepcopy(SEED_DOC)


@pytest.fixture
def cases_doc() -> dict[str, Any]:
    return copy.deepcopy(CASES_DOC)
