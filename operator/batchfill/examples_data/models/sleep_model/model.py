"""Triton Python-backend test model whose batch latency is known: one execution of b samples sleeps
``alpha_ms + beta_ms * b`` milliseconds (the Symphony artifact's "sleep backend").

b is the total first dimension over all requests Triton hands to one ``execute`` call, so the model behaves
the same whether the batch was formed by the dynamic batcher (many requests of 1) or by the client (one
request of b). ``alpha_ms`` and ``beta_ms`` come from the model config's ``parameters``::

    parameters: { key: "alpha_ms" value: { string_value: "5" } }
    parameters: { key: "beta_ms"  value: { string_value: "1" } }

Input ``INPUT0`` (TYPE_FP32, dims [4] per sample) is echoed to ``OUTPUT0``. The time asleep is measured from
the start of ``execute``, so the small per-request bookkeeping is absorbed into the sleep rather than added.

With ``parameters: { key: "gpu_lock" value: { string_value: "/path/to/file" } }`` every execution first takes an
exclusive ``flock`` on that file and holds it while it sleeps: every model instance given the same path runs one
execution at a time, which emulates several models sharing one GPU the way ``batchfill.sim.shared`` models it.
The sleep is then measured from when the lock is held.
"""

import fcntl
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})

        def param(name, default):
            value = params.get(name, {}).get("string_value", "")
            return float(value) if value != "" else default

        self.alpha_s = param("alpha_ms", 0.0) / 1000.0
        self.beta_s = param("beta_ms", 0.0) / 1000.0
        lock_path = params.get("gpu_lock", {}).get("string_value", "")
        self.lock = open(lock_path, "a+") if lock_path else None  # noqa: SIM115 (held for the model's life)

    def execute(self, requests):
        if self.lock is None:
            return self._run(requests)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            return self._run(requests)
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)

    def _run(self, requests):
        start = time.perf_counter()
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        b = sum(int(x.shape[0]) if x.ndim > 0 else 1 for x in inputs)
        responses = [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]) for x in inputs]
        remaining = self.alpha_s + self.beta_s * b - (time.perf_counter() - start)
        if remaining > 0:
            time.sleep(remaining)
        return responses

    def finalize(self):
        if self.lock is not None:
            self.lock.close()
