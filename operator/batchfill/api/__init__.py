"""BatchedModel API: spec and status models (pydantic v2), validation, and the CRD generated from them."""

from batchfill.api.documents import parse_documents
from batchfill.api.errors import InfeasibleSLAError, Problem, SpecError
from batchfill.api.spec import BatchedModel, BatchedModelSpec
from batchfill.api.status import BatchedModelStatus, PlanStatus, SeedRule
from batchfill.api.validate import check_spec, load_model

__all__ = [
    "BatchedModel",
    "BatchedModelSpec",
    "BatchedModelStatus",
    "InfeasibleSLAError",
    "PlanStatus",
    "Problem",
    "SeedRule",
    "SpecError",
    "check_spec",
    "load_model",
    "parse_documents",
]
