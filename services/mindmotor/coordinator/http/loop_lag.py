"""`LoopLagMonitor`: how late the event loop runs a timer, sampled every `interval_s` into
`mindmotor_coordinator_event_loop_lag_seconds`. Work that holds the loop (a grammar compile, a
megabyte tokenized in place) shows here as the delay it imposed on every other request."""

from __future__ import annotations

import asyncio
import time


class LoopLagMonitor:
    def __init__(self, histogram, interval_s: float = 0.1):
        self.histogram = histogram
        self.interval_s = interval_s
        self.last_s = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.last_s = max(0.0, time.perf_counter() - before - self.interval_s)
            self.histogram.observe(self.last_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
