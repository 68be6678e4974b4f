"""The sleep model's execution latency, measured by Triton's statistics API, is alpha + beta*b plus a constant.

This is what makes the simulator checkable against the real server: the test model's batch latency is known,
so any difference between simulated and measured queueing comes from the batcher, not from the model.

Tolerances (stated, printed with the measured numbers):
* the constant overhead c (median of measured - nominal) is the Python backend's per-execution cost outside
  ``execute``'s sleep; it must lie in [0, 2] ms;
* every batch size must be within 1.0 ms of nominal + c for client-formed batches, and within 2.0 ms for
  batches the dynamic batcher formed out of single-sample requests (more requests per execution; only batch
  sizes seen at least 20 times count, since a mean of a few executions is timer noise);
* the least-squares slope must be within 5 % of beta for client-formed batches (one request of b samples).
  For batches of b single-sample requests the backend also pays a per-request cost outside ``execute``
  (request/response marshalling through shared memory): measured about 0.06 ms per request on this machine,
  so the slope there must lie in [beta, beta + 0.15 ms]. A profile measured with client-side batches
  (``batchfill profile``) understates dynamically formed batches of b requests by that much per request.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchfill.adapters.triton_stats import delta, measure_profile, wait_for_counts
from batchfill.testbed.loadgen import grpc_fp32_input, run_poisson
from batchfill.testbed.triton_local import LocalTriton

from .conftest import SLEEP_DIMS, SLEEP_INPUT, http_fp32_inputs, load_model, sleep_config_pb, with_parameters

pytestmark = pytest.mark.component

ALPHA_MS = 5.0
BETA_MS = 1.0
MAX_OVERHEAD_MS = 2.0
POINT_TOLERANCE_MS = 1.0
DYNAMIC_POINT_TOLERANCE_MS = 2.0
SLOPE_TOLERANCE = 0.05
MAX_PER_REQUEST_OVERHEAD_MS = 0.15


def _check_profile(measured: dict[int, float], tolerance_ms: float, *, dynamic: bool = False) -> float:
    sizes = np.array(sorted(measured), dtype=float)
    got = np.array([measured[int(b)] for b in sizes])
    nominal = ALPHA_MS + BETA_MS * sizes
    c = float(np.median(got - nominal))
    slope, intercept = np.polyfit(sizes, got, 1)
    print(f"alpha={ALPHA_MS} beta={BETA_MS}: overhead c={c:.3f} ms, fit {intercept:.3f} + {slope:.4f}*b")
    for b, g, n in zip(sizes, got, nominal, strict=True):
        print(f"  b={int(b):3d} nominal {n:7.2f} measured {g:7.2f} residual {g - n - c:+.3f} ms")
    assert 0.0 <= c <= MAX_OVERHEAD_MS, f"constant overhead {c:.2f} ms outside [0, {MAX_OVERHEAD_MS}]"
    worst = float(np.max(np.abs(got - nominal - c)))
    assert worst <= tolerance_ms, f"a batch size is {worst:.2f} ms off alpha + beta*b + c"
    if dynamic:
        per_request = slope - BETA_MS
        print(f"  per-request overhead of dynamically batched requests: {per_request:.3f} ms")
        assert 0.0 <= per_request <= MAX_PER_REQUEST_OVERHEAD_MS, f"slope {slope:.3f} vs beta {BETA_MS}"
    else:
        assert abs(slope - BETA_MS) <= SLOPE_TOLERANCE * BETA_MS, f"slope {slope:.3f} != beta {BETA_MS}"
    return c


def test_client_batched_profile_is_alpha_plus_beta_b(triton: LocalTriton) -> None:
    name = "sleep_profile"
    load_model(
        triton, name, with_parameters(sleep_config_pb(name, 32), alpha_ms=ALPHA_MS, beta_ms=BETA_MS), "sleep_model"
    )
    client = triton.http_client()
    m = measure_profile(
        client, name, http_fp32_inputs(SLEEP_INPUT, SLEEP_DIMS), [1, 2, 4, 8, 16, 32], warmup=3, repeats=20
    )
    client.close()
    assert m.executions == dict.fromkeys([1, 2, 4, 8, 16, 32], 20)
    _check_profile(m.mean_ms, POINT_TOLERANCE_MS)


def test_dynamic_batches_of_single_requests_take_alpha_plus_beta_b(triton: LocalTriton) -> None:
    """b counts the samples of ALL requests in one execute call, whatever sizes the batcher formed."""
    name = "sleep_dynamic"
    text = sleep_config_pb(name, 16, preferred=[], queue_delay_us=3000)
    load_model(triton, name, with_parameters(text, alpha_ms=ALPHA_MS, beta_ms=BETA_MS), "sleep_model")
    make = grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS)
    run_poisson(triton.grpc_url, name, make, 50, count=30)  # warm-up, excluded by the delta
    client = triton.http_client()
    before = wait_for_counts(client, name, inferences=31)
    r = run_poisson(triton.grpc_url, name, make, 400, duration_s=8, seed=3)
    print(r.summary())
    assert r.failed == 0, r.errors
    sent = r.ok + r.priming_requests
    d = delta(before, wait_for_counts(client, name, inferences=before.inference_count + sent))
    client.close()
    assert d.inference_count == sent
    seen = {b: s.executions for b, s in sorted(d.batches.items())}
    print("executions per batch size:", seen)
    measured = d.exec_latency_ms(min_executions=20)
    assert len(measured) >= 4, f"the dynamic batcher formed too few distinct batch sizes: {seen}"
    assert max(measured) > 4
    _check_profile(measured, DYNAMIC_POINT_TOLERANCE_MS, dynamic=True)
