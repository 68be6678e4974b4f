"""`batchfill crd`: print the BatchedModel CustomResourceDefinition, generated from the pydantic models (YAML)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from batchfill.api.crd import render_crd_yaml
from batchfill.cli.common import EXIT_OK


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Write the CRD to standard output (crds/batchedmodel.yaml is this output)."""
    sys.stdout.write(render_crd_yaml())
    return EXIT_OK
