import threading

import pytest

from mindmotor.device.hbm import plan_kv_cache
from mindmotor.device.profiles import get_profile
from mindmotor.device.specs import get_device_spec
from mindmotor.device.telemetry import DeviceTelemetry

SPEC = get_device_spec("910B3")
T0 = 1000.0


@pytest.fixture
def telemetry():
    allocator, _ = plan_kv_cache(SPEC, get_profile("qwen2-7b"))
    return DeviceTelemetry(SPEC, allocator)


def test_idle_card(telemetry):
    snap = telemetry.snapshot(now=T0)
    assert snap["device"] == "910B3" and snap["health"] == "OK"
    assert snap["utilization"] == 0 and snap["power_w"] == SPEC.idle_watts
    assert snap["hbm_used_bytes"] == telemetry.allocator.used
    assert snap["hbm_total_bytes"] == 64 * 2**30
    assert snap["aicore_freq_mhz"] == 1800


def test_utilization_and_power_follow_the_load(telemetry):
    telemetry.record_step(0.25, wall_now=T0 + 0.5)
    telemetry.record_step(0.25, wall_now=T0 + 1.0)
    half = telemetry.snapshot(now=T0 + 1.0)
    assert half["utilization"] == pytest.approx(50.0)
    half_power = SPEC.idle_watts + 0.5 * (SPEC.tdp_watts - SPEC.idle_watts)
    assert half["power_w"] == pytest.approx(half_power)
    assert telemetry.snapshot(now=T0 + 3.0)["utilization"] == 0.0      # window has passed


def test_utilization_is_clamped(telemetry):
    telemetry.record_step(5.0, wall_now=T0)            # virtual mode: emulated >> wall time
    assert telemetry.snapshot(now=T0)["utilization"] == 100.0


def test_temperature_rises_smoothly_under_load(telemetry):
    temperatures = []
    for second in range(60):
        telemetry.record_step(1.0, wall_now=T0 + second)
        temperatures.append(telemetry.snapshot(now=T0 + second)["temperature_c"])
    assert all(b > a for a, b in zip(temperatures, temperatures[1:]))
    assert temperatures[-1] - temperatures[-2] < 2.0                     # no jumps
    assert temperatures[-1] < telemetry.ambient_c + 45.0 + 1e-9          # bounded by the TDP target


def test_concurrent_recording(telemetry):
    def work():
        for _ in range(500):
            telemetry.record_step(1e-4)
            telemetry.snapshot()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0 <= telemetry.snapshot()["utilization"] <= 100
