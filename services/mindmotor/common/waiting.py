"""`wait_until`: poll a condition with a deadline — how tests and tools wait for a process or a
state instead of sleeping a fixed time."""

from __future__ import annotations

import time


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.02, what: str = "condition"):
    """Call `predicate` until it returns something truthy, and return that; AssertionError (naming
    `what` and the last value) when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s (last value: {value!r})")
        time.sleep(interval)
