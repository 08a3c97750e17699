"""`run(main, loop)`: run a service's main coroutine on the chosen event loop — uvloop (libuv, as
`uvicorn[standard]` picks it) where it is installed and asked for ("auto" or "uvloop"), else
asyncio's own. uvloop's loop does the same work in fewer instructions per I/O event (accepting,
reading and writing sockets, timers, call_soon): measured on the coordinator in
docs/architecture.md ("The front door")."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, Callable, Coroutine

LOOPS = ("auto", "asyncio", "uvloop")


def loop_factory(loop: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the event loop `loop` names (None: asyncio's default)."""
    if loop not in LOOPS:
        raise ValueError(f"event loop {loop!r}: expected one of {LOOPS}")
    if loop == "asyncio" or (loop == "auto" and importlib.util.find_spec("uvloop") is None):
        return None
    import uvloop

    return uvloop.new_event_loop


def loop_name(loop: str = "auto") -> str:
    """What `loop` resolves to here: "uvloop" or "asyncio"."""
    return "asyncio" if loop_factory(loop) is None else "uvloop"


def run(main: Coroutine[Any, Any, Any], loop: str = "auto") -> Any:
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(main)
