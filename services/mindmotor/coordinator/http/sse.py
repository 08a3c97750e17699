"""Server-sent events: `data: {json}\\n\\n` per chunk, `data: [DONE]\\n\\n` at the end, sent by
`EventStreamResponse`, which also watches the connection: when the client goes away the stream
is cancelled at once (not at the next write), and `on_close` always runs (it stops the worker
calls and gives back the admission ticket)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator, Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

log = logging.getLogger("mindmotor.coordinator")

DONE = b"data: [DONE]\n\n"


def event(obj: dict, event_id: str | None = None) -> bytes:
    """One event; with `event_id`, an `id:` line first (a client reconnects with it: resume.py)."""
    data = b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
    return data if event_id is None else b"id: " + event_id.encode() + b"\n" + data


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]):
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.events = events
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.create_task(self._write(send))
        watcher = asyncio.create_task(self._watch(receive))
        try:
            done, _ = await asyncio.wait({writer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done and not writer.done():
                log.info("client disconnected; request cancelled")
            for task in (writer, watcher):
                task.cancel()
            await asyncio.gather(writer, watcher, return_exceptions=True)
            if writer.done() and not writer.cancelled() and writer.exception() is not None:
                log.error("stream failed", exc_info=writer.exception())
        finally:
            writer.cancel()
            watcher.cancel()
            try:
                await self.events.aclose()
            finally:
                await self.on_close()

    async def _write(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            return

    @staticmethod
    async def _watch(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
