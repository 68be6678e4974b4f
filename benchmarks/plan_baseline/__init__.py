"""The planner as it was before the compiled batcher (commit 099221c): a frozen copy, the baseline of
benchmarks/plan_speed.py. Only the benchmarks import it; the operator never does (its plan is
batchfill.policy.plan). Do not edit: its purpose is to stay what the old planner computed."""
