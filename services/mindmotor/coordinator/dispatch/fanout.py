"""`ChoiceSet`: the n generations of one HTTP request (n choices, times the prompts of a batched
completions request), started together and read as one stream of (choice index, piece).

`start` waits for every choice's first piece, so that a request the worker refuses (400) or that
finds no instance (503) is answered with that status, not with a stream that fails at once.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from mindmotor.coordinator.http.errors import APIError, BadRequest, InternalError
from mindmotor.coordinator.dispatch.generation import Generation, Piece

_DONE = object()


def _most_telling(errors: list[BaseException]) -> BaseException:
    """The error to answer with when several choices failed: a client error first."""
    for kind in (BadRequest, APIError):
        for error in errors:
            if isinstance(error, kind):
                return error
    error = errors[0]
    if isinstance(error, StopAsyncIteration):
        return InternalError("a generation ended without output")
    return error


class ChoiceSet:
    def __init__(self, generations: list[Generation], indices: list[int] | None = None):
        """`indices`: each generation's choice index in the response (default: its position) —
        a resumed stream runs only the choices its client has not seen finish."""
        self.generations = generations
        self.indices = indices if indices is not None else list(range(len(generations)))
        self.streams = [g.stream() for g in generations]
        self._first: list[Piece] = []
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        if len(self.streams) == 1:
            self._first = [await anext(self.streams[0])]
            return
        results = await asyncio.gather(*(anext(s) for s in self.streams), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise _most_telling(errors)
        self._first = list(results)

    async def events(self) -> AsyncIterator[tuple[int, Piece]]:
        """Every piece of every choice, as they come (each choice's pieces in order), with the
        choice's index in the response."""
        async for position, piece in self._events():
            yield self.indices[position], piece

    async def _events(self) -> AsyncIterator[tuple[int, Piece]]:
        pending = []
        for index, piece in enumerate(self._first):
            yield index, piece
            if piece.finish_reason is None:
                pending.append(index)
        if len(pending) == 1:
            async for piece in self.streams[pending[0]]:
                yield pending[0], piece
            return
        if not pending:
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int) -> None:
            try:
                async for piece in self.streams[index]:
                    await queue.put((index, piece))
                await queue.put((index, _DONE))
            except BaseException as exc:  # noqa: BLE001 - handed to the reader
                await queue.put((index, exc))

        self._tasks = [asyncio.create_task(pump(i)) for i in pending]
        running = len(pending)
        while running:
            index, item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item

    async def aclose(self) -> None:
        """Stop every choice (cancelling its worker call)."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for stream in self.streams:
            try:
                await stream.aclose()
            except Exception:  # noqa: BLE001 - closing must not fail the response
                pass
