import time

import pytest

from mindmotor.device.timing import StepPacer


def test_realtime_waits_for_the_emulated_duration():
    pacer = StepPacer("realtime")
    started = time.monotonic()
    lag = pacer.pace(started, 0.02)
    assert time.monotonic() - started >= 0.02
    assert lag == 0.0
    assert pacer.steps == 1 and pacer.emulated_time_s == pytest.approx(0.02)


def test_virtual_never_waits():
    pacer = StepPacer("virtual")
    started = time.monotonic()
    pacer.pace(started, 5.0)
    pacer.pace(time.monotonic(), 5.0)
    assert time.monotonic() - started < 0.5
    assert pacer.emulated_time_s == pytest.approx(10.0) and pacer.steps == 2


@pytest.mark.parametrize("mode", ["realtime", "virtual"])
def test_lag_when_the_host_is_slower_than_the_card(mode):
    pacer = StepPacer(mode)
    host_started = time.monotonic() - 0.05            # the host already spent 50 ms
    before = time.monotonic()
    lag = pacer.pace(host_started, 0.01)
    assert time.monotonic() - before < 0.01            # no waiting: already past the deadline
    assert lag >= 0.04
    assert pacer.lag_time_s == pytest.approx(lag)
    assert pacer.host_time_s >= 0.05


def test_unknown_mode():
    with pytest.raises(ValueError, match="realtime"):
        StepPacer("turbo")
