"""The local real components for the demo, the tests and the benchmarks: a Kubernetes control plane, tritonserver,
Prometheus, load generators, the scaling lab. Never imported by batchfill.controller or batchfill.adapters, nor by
anything the operator image runs."""
