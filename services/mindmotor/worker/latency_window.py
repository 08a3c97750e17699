"""`LatencyWindow`: the recent latencies of one kind (TTFT, or TPOT) and their percentiles.

A sliding window — samples younger than `window_s`, at most the last `max_samples` — so that a
worker's heartbeat reports how it serves *now* (the controller's P/D ratio policy compares the p90
with the deployment's SLO), where a Prometheus histogram only accumulates. Used on the worker's
event loop only (no locks).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

WINDOW_S = 30.0
MAX_SAMPLES = 512


class LatencyWindow:
    def __init__(self, window_s: float = WINDOW_S, max_samples: int = MAX_SAMPLES,
                 clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self.clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)   # (time, seconds)

    def add(self, seconds: float) -> None:
        self._samples.append((self.clock(), seconds))

    def values(self) -> list[float]:
        """The samples still in the window (older ones are dropped)."""
        horizon = self.clock() - self.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        return [value for _, value in self._samples]

    def percentile(self, q: float) -> tuple[float, int]:
        """(the q-th percentile by the nearest-rank method, number of samples); (0.0, 0) if empty."""
        values = sorted(self.values())
        if not values:
            return 0.0, 0
        rank = max(1, math.ceil(q / 100.0 * len(values)))
        return values[rank - 1], len(values)
