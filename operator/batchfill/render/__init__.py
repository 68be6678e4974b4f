"""Pure renderers: Triton's config.pbtxt (through Triton's own protobuf schema); Kubernetes objects."""

from batchfill.render.model_config import (
    InstanceKind,
    build_model_config,
    config_hash,
    config_on_cpu,
    config_with_parameters,
    render_model_config,
)

__all__ = [
    "InstanceKind",
    "build_model_config",
    "config_hash",
    "config_on_cpu",
    "config_with_parameters",
    "render_model_config",
]
