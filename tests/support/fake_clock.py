"""`FakeClock`: a clock a test moves by hand (`clock.now += 5`), for code that takes a
`clock: Callable[[], float]` — time as the subject of a test, without sleeping."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
