"""What `npu-smi` and Prometheus see of an emulated card: utilization, HBM, power, temperature.

Utilization is the share of the last `WINDOW_S` seconds of wall time that the card was busy,
each step counted as busy over [wall_end - emulated_seconds, wall_end]. Power moves linearly
from idle to TDP with utilization; temperature approaches ambient + k * power with a first-order
lag (time constant `THERMAL_TAU_S`), k chosen so a card at TDP settles 45 C above ambient.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from mindmotor.device.hbm import HBMAllocator
from mindmotor.device.specs import DeviceSpec

WINDOW_S = 1.0
THERMAL_TAU_S = 20.0
RISE_AT_TDP_C = 45.0


class DeviceTelemetry:
    def __init__(self, spec: DeviceSpec, allocator: HBMAllocator, ambient_c: float = 35.0,
                 device_id: int = 0) -> None:
        self.spec, self.allocator, self.device_id = spec, allocator, device_id
        self.ambient_c = ambient_c
        self._c_per_watt = RISE_AT_TDP_C / spec.tdp_watts
        self._lock = threading.Lock()
        self._busy: deque[tuple[float, float]] = deque()   # (wall_end, emulated_seconds)
        self._temperature_c = ambient_c + self._c_per_watt * spec.idle_watts
        self._temperature_at: float | None = None          # wall time of the last update

    def record_step(self, emulated_seconds: float, wall_now: float | None = None) -> None:
        now = time.monotonic() if wall_now is None else wall_now
        with self._lock:
            self._busy.append((now, emulated_seconds))
            self._forget_before(now - WINDOW_S)

    def snapshot(self, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        with self._lock:
            utilization = self._utilization(now)
            spec = self.spec
            power = spec.idle_watts + (spec.tdp_watts - spec.idle_watts) * utilization / 100
            temperature = self._advance_temperature(now, power)
        return {
            "device": self.spec.name,
            "npu_id": self.device_id,
            "utilization": utilization,
            "hbm_used_bytes": self.allocator.used,
            "hbm_total_bytes": self.allocator.total,
            "power_w": power,
            "temperature_c": temperature,
            "aicore_freq_mhz": round(self.spec.clock_ghz * 1000),
            "health": "OK",
        }

    def _utilization(self, now: float) -> float:
        """Percent of [now - WINDOW_S, now] covered by busy intervals (clamped to 100)."""
        window_start = now - WINDOW_S
        self._forget_before(window_start)
        busy = 0.0
        for end, duration in self._busy:
            busy += max(0.0, min(end, now) - max(end - duration, window_start))
        return min(100.0, 100.0 * busy / WINDOW_S)

    def _forget_before(self, wall: float) -> None:
        while self._busy and self._busy[0][0] < wall:
            self._busy.popleft()

    def _advance_temperature(self, now: float, power_w: float) -> float:
        """First-order step toward ambient + k * power over the time since the last update."""
        if self._temperature_at is not None and now > self._temperature_at:
            target = self.ambient_c + self._c_per_watt * power_w
            approach = 1.0 - math.exp(-(now - self._temperature_at) / THERMAL_TAU_S)
            self._temperature_c += (target - self._temperature_c) * approach
        if self._temperature_at is None or now > self._temperature_at:
            self._temperature_at = now
        return self._temperature_c
