"""batchfill: serve models on NVIDIA Triton at the lowest GPU cost that still meets a p99 latency SLA."""

__version__ = "0.1.0"
