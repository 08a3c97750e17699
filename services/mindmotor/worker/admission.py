"""Whether the worker takes new requests, and which requests it is still serving.

Draining is one-way: once started (Drain RPC or SIGTERM) the worker refuses new requests, lets
the in-flight ones finish, and `wait_idle` tells the server when it may stop. A *pause* (for a
role switch) looks the same from outside but ends with `resume`. Used from the event loop only.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Awaitable, Callable, Iterator

SERVING = "serving"
DRAINING = "draining"


class Admission:
    def __init__(self) -> None:
        self.draining = False
        self.paused = False
        self.in_flight: set[str] = set()       # request ids of Generate calls not yet finished
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_drain: list[Callable[[], Awaitable[None]]] = []

    @property
    def state(self) -> str:
        return DRAINING if self.draining or self.paused else SERVING

    @property
    def accepting(self) -> bool:
        return self.state == SERVING

    def pause(self) -> None:
        """Refuse new requests until `resume` (a drain started meanwhile stays)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def on_drain(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Await `callback()` once, when draining starts (e.g. to turn the health check off)."""
        self._on_drain.append(callback)

    async def start_drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        for callback in self._on_drain:
            await callback()

    @contextmanager
    def track(self, request_id: str) -> Iterator[None]:
        """Count the request as in flight for the duration of the block."""
        self.in_flight.add(request_id)
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight.discard(request_id)
            if not self.in_flight:
                self._idle.set()

    async def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait until no request is in flight; False if `timeout_s` (None: no limit) ran out."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True
