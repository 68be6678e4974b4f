"""The operator's client-side API rate limit (adapters.kube.RateLimiter): a token bucket like client-go's."""

from __future__ import annotations

import threading

import pytest

from batchfill.adapters.kube import RateLimiter, limit_requests


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def test_a_burst_passes_then_requests_are_spaced_at_the_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(qps=20, burst=30, clock=clock, sleep=clock.sleep)
    waits = [limiter.acquire() for _ in range(30)]
    assert waits == [0.0] * 30  # the burst
    start = clock.now
    for _ in range(40):
        limiter.acquire()
    assert clock.now - start == pytest.approx(40 / 20)  # then 20 per second
    clock.now += 10.0  # idle: the bucket refills to the burst, not beyond
    assert [limiter.acquire() for _ in range(30)] == [0.0] * 30
    assert limiter.acquire() == pytest.approx(1 / 20)


def test_limit_requests_makes_every_call_take_a_token() -> None:
    clock = FakeClock()
    limiter = RateLimiter(qps=2, burst=1, clock=clock, sleep=clock.sleep)

    class Api:
        calls = 0

        def call_api(self, *args: object, **kwargs: object) -> str:
            Api.calls += 1
            return "ok"

    api = limit_requests(Api(), limiter)  # type: ignore[arg-type]
    assert [api.call_api("/x") for _ in range(5)] == ["ok"] * 5
    assert Api.calls == 5
    assert clock.now - 100.0 == pytest.approx(4 / 2)  # the first from the burst, then 2 per second


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_a_limit_that_would_block_forever_is_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="qps="):
        RateLimiter(qps, burst)
