"""Whether the worker takes new requests, and which requests it is still serving.

Draining is one-way: once started (Drain RPC or SIGTERM) the worker refuses new requests, lets
the in-flight ones finish, and `wait_idle` tells the server when it may stop. A *pause* (for a
role switch) looks the same from outside but ends with `resume`. A worker whose engine died is
*failed*: it refuses everything for good (it is about to exit). Used from the event loop only.

At most `max_in_flight` requests are served at once (`--max-concurrent-requests`); one more is
refused as busy (RESOURCE_EXHAUSTED), which a coordinator answers by trying another instance.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Awaitable, Callable, Iterator

from mindmotor.vocabulary import WorkerState


class Admission:
    def __init__(self, max_in_flight: int = 4096) -> None:
        if max_in_flight < 1:
            raise ValueError(f"the concurrent request limit must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.draining = False
        self.paused = False
        self.failed = False
        self.in_flight: set[str] = set()       # request ids of Generate calls not yet finished
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_drain: list[Callable[[], Awaitable[None]]] = []

    @property
    def state(self) -> WorkerState:
        if self.failed:
            return WorkerState.FAILED
        return WorkerState.DRAINING if self.draining or self.paused else WorkerState.SERVING

    @property
    def accepting(self) -> bool:
        return self.state == WorkerState.SERVING

    @property
    def full(self) -> bool:
        return len(self.in_flight) >= self.max_in_flight

    def fail(self) -> None:
        """The engine died: refuse everything from now on."""
        self.failed = True

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


def server_options(max_in_flight: int) -> list[tuple[str, int]]:
    """gRPC server options under which the concurrency limit, not gRPC, refuses calls: gRPC core
    sheds calls the application has not picked up yet once more than `max_pending_requests` wait
    (randomly up to the hard limit, then all), answering them CANCELLED — which looks like a
    failed worker. Both limits are raised above the worker's own."""
    soft = max_in_flight + 1000
    return [("grpc.server.max_pending_requests", soft), ("grpc.server.max_pending_requests_hard_limit", 2 * soft)]
