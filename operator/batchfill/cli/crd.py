"""`batchfill crd`: print the BatchedModel (or, with ``--kind GPUPool``, the GPUPool) CustomResourceDefinition,
generated from the pydantic models (YAML)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from batchfill.api.crd import render_crd_yaml, render_pool_crd_yaml
from batchfill.cli.common import EXIT_OK


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Write the CRD to standard output (crds/batchedmodel.yaml, or crds/gpupool.yaml, is this output)."""
    pool = getattr(args, "kind", "BatchedModel") == "GPUPool"
    sys.stdout.write(render_pool_crd_yaml() if pool else render_crd_yaml())
    return EXIT_OK
