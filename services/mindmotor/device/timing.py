"""Pacing engine steps to the emulated card's clock.

`realtime`: a step does not finish before its emulated duration, so clients see the latency
the card would give. `virtual`: nothing waits; emulated time is only accounted. Both report
lag = how far the host's own work overran the emulated duration (the host was the bottleneck).
"""

from __future__ import annotations

import time
from typing import Callable

MODES = ("realtime", "virtual")


class StepPacer:
    def __init__(self, mode: str = "virtual", clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: what host time is read from (a virtual clock, in the simulator, stands still
        during a step: no host time, no lag); realtime pacing needs the wall clock."""
        if mode not in MODES:
            raise ValueError(f"unknown timing mode {mode!r}; valid: {', '.join(MODES)}")
        if mode == "realtime" and clock is not time.monotonic:
            raise ValueError("realtime pacing waits on the wall clock (time.monotonic), not a virtual clock")
        self.mode = mode
        self.clock = clock
        self.emulated_time_s = 0.0   # sum of emulated step durations
        self.host_time_s = 0.0       # sum of host time spent before pacing (model + scheduling)
        self.lag_time_s = 0.0        # sum of max(0, host - emulated)
        self.steps = 0

    def pace(self, host_started_at: float, emulated_seconds: float) -> float:
        """Wait (realtime) until host_started_at + emulated_seconds (on the clock); return lag."""
        host_elapsed = self.clock() - host_started_at
        lag = max(0.0, host_elapsed - emulated_seconds)
        if self.mode == "realtime":
            deadline = host_started_at + emulated_seconds
            while (remaining := deadline - time.monotonic()) > 0:
                time.sleep(remaining)
        self.emulated_time_s += emulated_seconds
        self.host_time_s += host_elapsed
        self.lag_time_s += lag
        self.steps += 1
        return lag

    def stall(self, seconds: float) -> None:
        """Emulated time passes with no step (the card waits on a copy); realtime: it waits too."""
        if self.mode == "realtime":
            time.sleep(seconds)
        self.emulated_time_s += seconds
