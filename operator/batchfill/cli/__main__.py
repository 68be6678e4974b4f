"""``python -m batchfill.cli``: the same entry point as the ``batchfill`` console script."""

from batchfill.cli.main import entry

entry()
