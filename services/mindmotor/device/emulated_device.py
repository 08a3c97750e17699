"""One emulated NPU: memory plan, step cost, pacing and telemetry behind one object.

The engine calls `run_step(shape, host_started_at)` after computing a step on the host; the
device prices the step, holds it (realtime) until the card would have finished, and records
it for `npu-smi`.
"""

from __future__ import annotations

import time
from typing import Callable

from mindmotor.device.cost_model import CostModel, StepCost, StepShape
from mindmotor.device.hbm import plan_kv_cache
from mindmotor.device.profiles import ModelProfile, get_profile
from mindmotor.device.specs import get_device_spec
from mindmotor.device.telemetry import DeviceTelemetry
from mindmotor.device.timing import StepPacer


class EmulatedDevice:
    def __init__(self, spec_name: str = "910B3", profile: ModelProfile | str | None = None,
                 block_size: int = 16, memory_fraction: float = 0.8, timing: str = "virtual",
                 max_num_batched_tokens: int = 8192, device_id: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: the time steps are paced and recorded on (a virtual clock in the simulator)."""
        if profile is None:
            raise ValueError("EmulatedDevice needs a model profile (a ModelProfile or a name)")
        self.device_id = device_id
        self.spec = get_device_spec(spec_name)
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        self.allocator, self.kv_plan = plan_kv_cache(
            self.spec, self.profile, block_size=block_size, memory_fraction=memory_fraction,
            max_num_batched_tokens=max_num_batched_tokens)
        self.cost_model = CostModel(self.spec, self.profile)
        self.clock = clock
        self.pacer = StepPacer(timing, clock)
        self.telemetry = DeviceTelemetry(self.spec, self.allocator, device_id=device_id)
        self.kv_transfers = 0               # KV pulls received from prefill instances
        self.kv_transfer_s = 0.0            # their emulated duration, summed
        self.kv_transfer_bytes = 0          # their emulated size (the profile's bytes per token)

    def price_kv_transfer(self, num_tokens: int, link: str = "intra_node") -> float:
        """Emulated seconds to receive the KV of `num_tokens` tokens over `link` ("intra_node":
        HCCS, "inter_node"); recorded for metrics. The caller decides whether to wait for it."""
        seconds = self.cost_model.kv_transfer_seconds(num_tokens, link)
        self.kv_transfers += 1
        self.kv_transfer_s += seconds
        self.kv_transfer_bytes += num_tokens * self.profile.kv_bytes_per_token
        return seconds

    def price_host_copy(self, nbytes: int) -> float:
        """Emulated seconds to copy `nbytes` from host memory onto the card (a LoRA slot load)."""
        return self.cost_model.host_copy_seconds(nbytes)

    def idle(self, seconds: float) -> None:
        """The card waits `seconds` with nothing to run (for a copy to land): realtime sleeps, and
        emulated time moves on either way."""
        if seconds <= 0:
            return
        if self.pacer.mode == "realtime":
            time.sleep(seconds)
        self.pacer.emulated_time_s += seconds

    def run_step(self, shape: StepShape, host_started_at: float) -> StepCost:
        cost = self.cost_model.step(shape)
        if cost.num_kernels == 0:            # nothing scheduled: the card stays idle
            return cost
        self.pacer.pace(host_started_at, cost.seconds)
        self.telemetry.record_step(cost.seconds, self.clock())
        return cost

    def stall(self, seconds: float) -> float:
        """The card waits `seconds` (a copy on the critical path): emulated time passes (realtime:
        also on the wall clock). Returns `seconds`."""
        self.pacer.stall(seconds)
        return seconds

    def snapshot(self) -> dict:
        return self.telemetry.snapshot()
