"""The running operator: kopf handlers (thin), the loops, reconcile and settings.

Each loop tick is gather (adapters) -> decide (pure) -> act (adapters). Never imports batchfill.testbed.
"""
