"""`LatencyWindow`: nearest-rank percentiles over the samples of the last `window_s` seconds, at most
`max_samples` of them; and `RequestTimer` feeds one TTFT and one mean TPOT per request into it."""

from __future__ import annotations

import pytest

from mindmotor.worker.latency_window import LatencyWindow
from mindmotor.worker.metrics import RequestTimer
from fake_clock import FakeClock


def test_percentile_over_the_window_only():
    clock = FakeClock(0.0)
    window = LatencyWindow(window_s=30.0, max_samples=100, clock=clock)
    assert window.percentile(90) == (0.0, 0)
    for value in range(1, 11):                  # 0.1 .. 1.0 s at t = 0
        window.add(value / 10)
    assert window.percentile(90) == (0.9, 10) and window.percentile(50) == (0.5, 10)
    clock.now = 20.0
    window.add(5.0)
    assert window.percentile(90) == (1.0, 11) and window.percentile(99) == (5.0, 11)   # ranks 10 and 11 of 11
    clock.now = 31.0                            # the first ten are older than 30 s
    assert window.percentile(90) == (5.0, 1)


def test_bounded_by_max_samples():
    window = LatencyWindow(window_s=1e9, max_samples=3, clock=FakeClock(0.0))
    for value in (9.0, 1.0, 2.0, 3.0):
        window.add(value)
    assert window.values() == [1.0, 2.0, 3.0]


def test_request_timer_records_ttft_and_mean_tpot(monkeypatch):
    import mindmotor.worker.metrics as metrics_module

    times = iter([0.0, 0.2, 0.3, 0.5, 0.6])     # start, first token, then three more single tokens

    class FakeMetrics:
        ttft = tpot = type("H", (), {"observe": lambda self, v: None})()
        requests = type("C", (), {"labels": lambda self, **kw: type("I", (), {"inc": lambda s: None})()})()
        recent_ttft = LatencyWindow(clock=FakeClock(0.0))
        recent_tpot = LatencyWindow(clock=FakeClock(0.0))
        model_name = "m"
        vllm_ttft = vllm_tpot = vllm_itl = vllm_e2e = vllm_success = type(   # vLLM's names: not under test here
            "V", (), {"labels": lambda self, *a: type("O", (), {"observe": lambda s, v: None,
                                                                "inc": lambda s: None})()})()

    monkeypatch.setattr(metrics_module.time, "monotonic", lambda: next(times))
    timer = RequestTimer(FakeMetrics())
    for _ in range(4):
        timer.on_tokens(1)
    timer.on_finish("length")
    assert FakeMetrics.recent_ttft.values() == [pytest.approx(0.2)]
    assert FakeMetrics.recent_tpot.values() == [pytest.approx(0.4 / 3)]
