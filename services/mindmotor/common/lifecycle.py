"""How a MindMotor service runs: start, announce itself, wait for SIGTERM or SIGINT, stop.

The signal is registered before the start, so a signal during a slow start is not lost; a start
that fails stops whatever it had started before the error goes on."""

from __future__ import annotations

import asyncio
import signal
from typing import Callable, Protocol


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def stop_requested() -> asyncio.Event:
    """An event the first SIGTERM or SIGINT sets (in the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def run_until_signal(service: Service, on_ready: Callable[[], None],
                           on_stopping: Callable[[], None] = lambda: None) -> None:
    """Start `service`, call `on_ready` (log it, print the ready line), wait for a signal, stop."""
    stop = stop_requested()
    try:
        await service.start()
    except BaseException:
        await service.stop()
        raise
    on_ready()
    await stop.wait()
    on_stopping()
    await service.stop()


