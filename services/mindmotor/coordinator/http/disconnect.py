"""`until_disconnect`: run a coroutine for a request, cancelling it if the client goes away first
(for non-streaming responses, which would otherwise run to the end for nobody).

The work runs in the caller's task; one watcher task waits for the client's `http.disconnect` and
cancels the caller's task when it comes (a task for the work as well cost a second task per
request: issue 26)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from starlette.requests import Request

from mindmotor.coordinator.http.errors import ClientGone

T = TypeVar("T")


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    task = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:       # our cancellation, no one else's
            raise ClientGone("the client closed the connection") from None
        raise
    finally:
        watcher.cancel()
