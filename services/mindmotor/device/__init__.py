"""The emulated Ascend NPU: specs, model profiles, HBM plan, step cost, pacing, telemetry.

The numpy model produces the tokens; the device decides how much memory there is and how
long each step takes. Everything here is standard library only, so importing it is cheap.
"""

from mindmotor.device.cost_model import CostModel, StepCost, StepShape
from mindmotor.device.emulated_device import EmulatedDevice
from mindmotor.device.hbm import DeviceOutOfMemoryError, HBMAllocator, KVPlan, plan_kv_cache
from mindmotor.device.profiles import PROFILES, ModelProfile, get_profile
from mindmotor.device.specs import DEVICE_SPECS, DeviceSpec, get_device_spec
from mindmotor.device.telemetry import DeviceTelemetry
from mindmotor.device.timing import StepPacer

__all__ = [
    "CostModel", "StepCost", "StepShape", "EmulatedDevice", "DeviceOutOfMemoryError",
    "HBMAllocator", "KVPlan", "plan_kv_cache", "PROFILES", "ModelProfile", "get_profile",
    "DEVICE_SPECS", "DeviceSpec", "get_device_spec", "DeviceTelemetry", "StepPacer",
]
