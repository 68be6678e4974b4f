"""The local tritonserver adapter, rendered configs and the real example models on the real server."""

from __future__ import annotations

import concurrent.futures
import http.server
import itertools
import re
import socket
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from batchfill.adapters.triton_stats import (
    delta,
    measure_profile,
    summary_quantile_ms,
    wait_for_counts,
)
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.status import PlanStatus
from batchfill.render import render_model_config
from batchfill.testbed.loadgen import GENERATOR_LAG_LIMIT_MS, grpc_fp32_input, run_poisson
from batchfill.testbed.model_repo import write_model
from batchfill.testbed.process import free_ports, process_group_alive
from batchfill.testbed.triton_local import LocalTriton, TritonStartError

from .conftest import SLEEP_DIMS, SLEEP_INPUT, http_fp32_inputs, load_model, sleep_config_pb, with_parameters

pytestmark = pytest.mark.component

TRITON_VERSION = "2.51.0"


# 127.0.0.1 as /proc/net/tcp spells it, and as an IPv4-mapped IPv6 address (gRPC listens on tcp6).
LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F"}


def _listening_ports() -> dict[int, str]:
    """Local TCP ports in LISTEN state -> hex local address, from /proc/net/tcp and tcp6."""
    out: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, port = fields[1].split(":")
            if fields[3] == "0A":
                out[int(port, 16)] = addr
    return out


def test_server_is_ready_and_listens_on_loopback_only(triton: LocalTriton) -> None:
    client = triton.http_client()
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["version"] == TRITON_VERSION
    assert "statistics" in meta["extensions"]
    client.close()
    listening = _listening_ports()
    for port in (triton.http_port, triton.grpc_port, triton.metrics_port):
        assert listening.get(port) in LOOPBACK_HEX, f"port {port} listens on {listening.get(port)}, not loopback"
    assert "nv_" in triton.metrics_text()


def _seed_spec(name: str, *, alpha_ms: float, beta_ms: float) -> BatchedModelSpec:
    return BatchedModelSpec.model_validate(
        {
            "model": {
                "name": name,
                "backend": "python",
                "inputs": [{"name": SLEEP_INPUT, "dataType": "TYPE_FP32", "dims": SLEEP_DIMS}],
                "outputs": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": SLEEP_DIMS}],
            },
            "sla": {"latencyP99Ms": 100, "networkOverheadMs": 10},
            "profile": [{"batchSize": b, "latencyMs": alpha_ms + beta_ms * b} for b in (1, 4, 8)],
            "triton": {"gpusPerReplica": 1},
        }
    )


def test_rendered_config_loads_serves_and_batches(triton: LocalTriton) -> None:
    """render_model_config's text is accepted verbatim, read back as rendered, and its batcher batches."""
    name = "rendered_sleep"
    alpha, beta = 20.0, 1.0
    spec = _seed_spec(name, alpha_ms=alpha, beta_ms=beta)
    plan = PlanStatus(
        maxBatchSize=8,
        preferredBatchSizes=[4, 8],
        maxQueueDelayMicroseconds=2000,
        instanceCount=1,
        serverBudgetMs=90,
        capacityPerReplicaRps=100,
        predictedP99Ms=80,
        minClientTimeoutMs=100,
        rule="test",
    )
    text = render_model_config(spec, plan, instance_kind="KIND_CPU")
    served = load_model(triton, name, with_parameters(text, alpha_ms=alpha, beta_ms=beta), "sleep_model")

    assert served["name"] == name
    assert served["backend"] == "python"
    assert served["max_batch_size"] == 8
    assert served["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert int(served["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000
    assert [(g["kind"], g["count"]) for g in served["instance_group"]] == [("KIND_CPU", 1)]
    assert [int(d) for d in served["input"][0]["dims"]] == SLEEP_DIMS

    client = triton.http_client()
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    inp = httpclient.InferInput(SLEEP_INPUT, [3, 4], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(name, [inp]).as_numpy("OUTPUT0"), data)

    # 8 concurrent single-sample requests: the first runs alone (nothing else is queued yet); the dynamic
    # batcher must put the rest into batches of more than one. Triton records an execution's statistics just
    # after responding, so the baseline waits until the 3-sample request above is counted.
    before = wait_for_counts(client, name, inferences=3)

    def one(i: int) -> np.ndarray:
        c = triton.http_client()
        x = np.full((1, 4), i, dtype=np.float32)
        req = httpclient.InferInput(SLEEP_INPUT, [1, 4], "FP32")
        req.set_data_from_numpy(x)
        out = c.infer(name, [req]).as_numpy("OUTPUT0")
        c.close()
        return out

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(8)))
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, np.full((1, 4), i, dtype=np.float32))  # each gets its own rows
    d = delta(before, wait_for_counts(client, name, inferences=before.inference_count + 8))
    client.close()
    print(f"8 concurrent requests ran as batches {sorted(d.batches)} ({d.execution_count} executions)")
    assert d.inference_count == 8
    assert max(d.batches) > 1
    assert max(d.batches) <= 8
    assert d.execution_count < 8


def test_triton_rejects_preferred_size_above_max_batch_size(triton: LocalTriton) -> None:
    """What the renderer's plan check protects against: Triton refuses such a config at load time."""
    text = sleep_config_pb("bad_preferred", 4, preferred=[8], queue_delay_us=100)
    write_model(triton.model_repository, "bad_preferred", text, "sleep_model")
    client = triton.http_client()
    with pytest.raises(InferenceServerException, match="failed to load 'bad_preferred'"):
        client.load_model("bad_preferred")
    assert not client.is_model_ready("bad_preferred")
    client.close()
    errors = "\n".join(triton.log_errors())
    print(errors)
    assert "preferred size must be <= max batch size for bad_preferred" in errors


# --- the real model: PaddleOCR's text-line orientation classifier ------------------------------------

OCR_SPEC = {
    "model": {
        "name": "ocr_cls",
        "backend": "python",
        "inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [3, 48, 192]}],
        "outputs": [{"name": "probs", "dataType": "TYPE_FP32", "dims": [2]}],
    },
    "sla": {"latencyP99Ms": 60, "networkOverheadMs": 10},
    "profile": [{"batchSize": 1, "latencyMs": 2}, {"batchSize": 16, "latencyMs": 25}],
    "triton": {"gpusPerReplica": 0},
}


def _text_line(text: str) -> np.ndarray:
    """A 48x192 crop of black ``text`` on white, normalised as PaddleOCR's classifier expects (CHW)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.92, 0.48), dpi=100)
    canvas = FigureCanvasAgg(fig)
    fig.text(0.02, 0.5, text, fontsize=20, va="center", ha="left", color="black")
    canvas.draw()
    rgb = np.asarray(canvas.buffer_rgba())[..., :3].astype(np.float32)
    assert rgb.shape == (48, 192, 3)
    return ((rgb / 255.0 - 0.5) / 0.5).transpose(2, 0, 1).copy()


def test_ocr_classifier_serves_batches_and_reads_orientation(triton: LocalTriton) -> None:
    spec = BatchedModelSpec.model_validate(OCR_SPEC)
    plan = PlanStatus(
        maxBatchSize=16,
        preferredBatchSizes=[16],
        maxQueueDelayMicroseconds=1000,
        instanceCount=1,
        serverBudgetMs=50,
        capacityPerReplicaRps=100,
        predictedP99Ms=40,
        minClientTimeoutMs=60,
        rule="test",
    )
    load_model(triton, "ocr_cls", render_model_config(spec, plan), "ocr_model")
    client = triton.http_client()

    words = ["batchfill OCR", "Triton server", "abcdefg hijk"]
    upright = np.stack([_text_line(w) for w in words])
    flipped = upright[:, :, ::-1, ::-1].copy()  # rotated by 180 degrees
    batch = np.concatenate([upright, flipped])
    inp = httpclient.InferInput("x", list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch)
    probs = client.infer("ocr_cls", [inp]).as_numpy("probs")
    print("orientation probabilities (0°, 180°):\n", probs.round(3))
    assert probs.shape == (6, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    assert (probs[:3, 0] > 0.9).all(), "upright text lines not recognised as 0°"
    assert (probs[3:, 1] > 0.9).all(), "rotated text lines not recognised as 180°"

    # Concurrent requests batched by Triton get back their own rows (split per request in model.py).
    def one(i: int) -> np.ndarray:
        c = triton.http_client()
        req = httpclient.InferInput("x", [1, 3, 48, 192], "FP32")
        req.set_data_from_numpy(batch[i : i + 1])
        out = c.infer("ocr_cls", [req]).as_numpy("probs")
        c.close()
        return out[0]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        single = np.stack(list(pool.map(one, range(6))))
    np.testing.assert_allclose(single, probs, atol=1e-4)

    m = measure_profile(client, "ocr_cls", http_fp32_inputs("x", [3, 48, 192]), [1, 2, 4, 8, 16], repeats=10)
    client.close()
    print("OCR classifier execution latency on this CPU (ms):", {b: round(v, 2) for b, v in m.mean_ms.items()})
    lat = [m.mean_ms[b] for b in (1, 2, 4, 8, 16)]
    assert all(a < b for a, b in itertools.pairwise(lat)), f"latency not increasing in b: {lat}"
    # Each execution lies within its request's round trip, so the mean execution is at most the mean round trip,
    # which is at most the client's p99 of 10 (numpy's linear p99 of 10 values is 0.09 * 9th + 0.91 * 10th).
    for b in m.mean_ms:
        assert m.mean_ms[b] <= m.client_p99_ms[b], f"b={b}: execution {m.mean_ms[b]:.2f} ms > round trip p99"


# --- the load generator itself -------------------------------------------------------------------------


def test_loadgen_sustains_300_rps_without_being_the_bottleneck(triton: LocalTriton) -> None:
    """Against a model that takes no time, 300 req/s Poisson for 10 s: the sender keeps its schedule, and every
    request is answered about as fast as at 100 req/s."""
    name = "noop"
    text = sleep_config_pb(name, 64, preferred=[], queue_delay_us=500)
    load_model(triton, name, with_parameters(text, alpha_ms=0, beta_ms=0), "sleep_model")
    make = grpc_fp32_input(SLEEP_INPUT, SLEEP_DIMS)
    # The calibration: the same round trips at a third of the rate, where neither the sender nor the server
    # queues; it also warms the model up. At 300/s a generator that keeps its schedule within
    # GENERATOR_LAG_LIMIT_MS (its own definition of not being the bottleneck) adds at most that to a round trip.
    calibration = run_poisson(triton.grpc_url, name, make, 100, duration_s=10, seed=8)
    print(f"calibration: {calibration.summary()}")
    assert calibration.failed == 0, calibration.errors
    allowed_p99_ms = calibration.p99_ms + GENERATOR_LAG_LIMIT_MS
    # A neighbour on this shared 2-core machine can stall the sender for tens of ms (28 ms p99 lag at 100/s in one
    # run): up to three 10 s runs, judged on the first one whose sender was on time by the end and whose round
    # trips kept the bound. A sender slower than 300/s falls further behind with every request (0.1 s per 2 %
    # it lacks, by the end of 10 s), on all three runs; one stalled by a neighbour catches up.
    runs = [calibration]
    for attempt in range(1, 4):
        r = run_poisson(triton.grpc_url, name, make, 300, duration_s=10, seed=7)
        runs.append(r)
        late_at_end_ms = float(np.median(r.send_lag_ms[-len(r.send_lag_ms) // 10 :]))
        print(f"attempt {attempt}: {r.summary()}; send lag over the last second {late_at_end_ms:.2f} ms (median); "
              f"allowed p99 {allowed_p99_ms:.2f} ms")  # fmt: skip
        if late_at_end_ms <= GENERATOR_LAG_LIMIT_MS and r.p99_ms <= allowed_p99_ms:
            break
    assert r.failed == 0, r.errors
    assert r.ok == r.sent
    assert abs(r.achieved_rate_rps - 300) / 300 < 0.08  # Poisson count over 10 s: sd ~1.8 %
    assert late_at_end_ms <= GENERATOR_LAG_LIMIT_MS, f"the sender fell behind: {late_at_end_ms:.1f} ms late at the end"
    assert r.p99_ms <= allowed_p99_ms, f"p99 {r.p99_ms:.2f} ms at 300/s, {calibration.p99_ms:.2f} ms at 100/s"
    server_p99 = summary_quantile_ms(triton.metrics_text(), name)
    assert server_p99 is not None
    # the server sees less than the client; its summary covers every run so far (the calibration and each attempt),
    # so it is held to the slowest of them, not to the last attempt (CI: 12.7 ms against the third attempt's 5.9)
    assert server_p99 <= max(x.p99_ms for x in runs) + 1.0


# --- lifecycle: failure reporting and cleanup (own servers, not the module's) -------------------------


def test_start_failure_reports_the_server_log(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_model(repo, "broken", 'backend: "python"\nmax_batch_size: 4\nbogus_field: 1\n', "sleep_model")
    server = LocalTriton(repo, startup_timeout_s=60, log_path=tmp_path / "tritonserver.log")
    with pytest.raises(TritonStartError) as err:
        server.start()
    msg = str(err.value)
    assert "exited" in msg or "not ready" in msg
    assert "bogus_field" in msg, msg  # the tail of the server log names the problem
    assert not server.is_running()


def test_context_manager_stops_the_server_and_its_stubs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_model(repo, "m", with_parameters(sleep_config_pb("m", 4), alpha_ms=1, beta_ms=0), "sleep_model")
    with LocalTriton(repo) as server:
        pid = server.pid
        assert pid is not None
        assert process_group_alive(pid)
        assert server.http_client().is_model_ready("m")
    assert not process_group_alive(pid)
    assert server.pid is None


def test_a_fixed_port_in_use_fails_the_start_naming_the_address(tmp_path: Path) -> None:
    host = "127.44.0.2"  # a pod IP, as the dev cluster's pods have
    with socket.socket() as taken:
        taken.bind((host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        http, grpc = free_ports(2, host)
        server = LocalTriton(tmp_path, host=host, http_port=http, grpc_port=grpc, metrics_port=port)
        with pytest.raises(TritonStartError, match=re.escape(f"{host}:{port} (metrics) is already in use")):
            server.start()
        assert not server.is_running()


class _ReadyEverywhere(http.server.BaseHTTPRequestHandler):
    """Another server: 200 to every GET, as a tritonserver of another cluster answers /v2/health/ready."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("taken", ["HTTP", "metrics"])
def test_a_server_another_one_answers_for_never_counts_as_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: str
) -> None:
    """The other server binds after the fixed ports were checked (a race the check cannot close): tritonserver
    cannot bind, and the start fails naming the address instead of returning while another server answers there
    (HTTP: it answers the readiness probe) or while this one is about to exit (metrics: bound last)."""
    monkeypatch.setattr(LocalTriton, "_check_fixed_ports_free", lambda self: None)
    host = "127.44.0.3"
    ports = dict(zip(("HTTP", "gRPC", "metrics"), free_ports(3, host), strict=True))
    other = http.server.HTTPServer((host, ports[taken]), _ReadyEverywhere)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        server = LocalTriton(tmp_path, host=host, http_port=ports["HTTP"], grpc_port=ports["gRPC"],
                             metrics_port=ports["metrics"], startup_timeout_s=60,
                             log_path=tmp_path / "tritonserver.log")  # fmt: skip
        with pytest.raises(TritonStartError, match=re.escape(f"{host}:{ports[taken]}")):
            server.start()
        assert not server.is_running()
        with urllib.request.urlopen(f"http://{host}:{ports[taken]}/", timeout=5) as r:
            assert r.status == 200  # the other server was left alone
    finally:
        other.shutdown()
        other.server_close()
