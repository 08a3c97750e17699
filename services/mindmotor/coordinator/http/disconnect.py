"""`until_disconnect`: run a coroutine for a request, cancelling it if the client goes away first
(for non-streaming responses, which would otherwise run to the end for nobody)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from starlette.requests import Request

from mindmotor.coordinator.http.errors import ClientGone

T = TypeVar("T")


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise ClientGone("the client closed the connection")
    return task.result()
