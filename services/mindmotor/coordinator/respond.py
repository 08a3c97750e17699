"""From started generations to the HTTP response, the same for both generation endpoints:
a JSON body (all choices collected), or an SSE stream (chunks as they come, the usage chunk when
asked, `[DONE]`; an error after the stream began is sent as an `{"error": ...}` event). Either way
the worker calls stop and the admission ticket is given back when the response ends, or when the
client goes away."""

from __future__ import annotations

from typing import AsyncIterator, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .admission import Ticket
from .disconnect import until_disconnect
from .errors import APIError
from .fanout import ChoiceSet
from .generation import Piece, Usage
from .results import ChoiceResult, total_usage
from .sse import DONE, EventStreamResponse, event


class OutputFormat(Protocol):
    def stream_start(self, index: int) -> list[dict]: ...
    def stream_piece(self, index: int, piece: Piece) -> list[dict]: ...
    def usage_chunk(self, usage: Usage) -> dict: ...
    def response(self, results: list[ChoiceResult], usage: Usage) -> dict: ...


async def respond(request: Request, choices: ChoiceSet, prompt_indices: list[int], fmt: OutputFormat,
                  stream: bool, include_usage: bool, ticket: Ticket) -> Response:
    async def close() -> None:
        await choices.aclose()
        ticket.release()

    try:
        await until_disconnect(request, choices.start())
        if not stream:
            results = await until_disconnect(request, _collect(choices, prompt_indices))
    except BaseException:
        await close()
        raise
    if not stream:
        await close()
        usage = total_usage([(r.prompt_index, r.usage) for r in results])
        return JSONResponse(fmt.response(results, usage))
    return EventStreamResponse(_events(choices, prompt_indices, fmt, include_usage), on_close=close)


async def _collect(choices: ChoiceSet, prompt_indices: list[int]) -> list[ChoiceResult]:
    results = [ChoiceResult(prompt_index=p) for p in prompt_indices]
    async for index, piece in choices.events():
        results[index].add(piece)
    return results


async def _events(choices: ChoiceSet, prompt_indices: list[int], fmt: OutputFormat,
                  include_usage: bool) -> AsyncIterator[bytes]:
    usages: list[tuple[int, Usage | None]] = []
    try:
        for index in range(len(prompt_indices)):
            for chunk in fmt.stream_start(index):
                yield event(chunk)
        async for index, piece in choices.events():
            for chunk in fmt.stream_piece(index, piece):
                yield event(chunk)
            if piece.finish_reason is not None:
                usages.append((prompt_indices[index], piece.usage))
        if include_usage:
            yield event(fmt.usage_chunk(total_usage(usages)))
    except APIError as exc:
        yield event(exc.body())
    yield DONE
