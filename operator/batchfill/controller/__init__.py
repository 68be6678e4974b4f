"""The running operator: kopf handlers (thin), the reconcile, the two loops and their ticks, and settings.

* handlers.py: kopf decorators, startup and cleanup, error translation;
* reconcile.py: the apply flow of create/update/resume (and the loops' re-apply);
* loops.py: the scaling and profiling threads, one pass over every model per interval;
* scaling.py, profiling.py: one model's tick, gather (adapters) -> decide (pure) -> act (adapters);
* desired.py, status.py: the plan of a spec, and the status computed from it and the children (pure);
* settings.py: the operator's settings.

Never imports batchfill.testbed.
"""
