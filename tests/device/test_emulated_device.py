import time

import pytest

from mindmotor.device.cost_model import StepShape
from mindmotor.device.emulated_device import EmulatedDevice
from mindmotor.device.hbm import DeviceOutOfMemoryError
from mindmotor.device.profiles import get_profile


def test_run_step_prices_paces_and_records():
    device = EmulatedDevice("910B3", profile=get_profile("qwen2-7b"), device_id=3)
    assert device.kv_plan.num_blocks > 0 and device.allocator.free < device.kv_plan.bytes_per_block
    cost = device.run_step(StepShape(prefills=[(128, 0)], decodes=[64] * 4), time.monotonic())
    assert cost.seconds > 0
    assert device.pacer.steps == 1
    assert device.pacer.emulated_time_s == pytest.approx(cost.seconds)
    snap = device.snapshot()
    assert snap["device"] == "910B3" and snap["npu_id"] == 3 and snap["utilization"] > 0


def test_empty_step_leaves_the_card_idle():
    device = EmulatedDevice(profile="llama2-7b")
    assert device.run_step(StepShape(), time.monotonic()).seconds == 0
    assert device.pacer.steps == 0 and device.snapshot()["utilization"] == 0


def test_construction_errors():
    with pytest.raises(ValueError):
        EmulatedDevice("910B3")
    with pytest.raises(DeviceOutOfMemoryError):
        EmulatedDevice("910B3", profile=get_profile("llama3-70b"))
    assert EmulatedDevice("910B3", profile=get_profile("llama3-70b", tp=8)).kv_plan.num_blocks > 0
