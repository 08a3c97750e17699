"""`POST /v1/responses` and the stored responses' `GET`, `DELETE` and input items.

A request continues the stored conversation of its `previous_response_id` (404 when that response
was never stored, was deleted or has expired), runs as a chat completion, and — unless
`store: false` — is stored with its whole conversation before the client sees it finished: a
non-streamed response before it is returned, a streamed one before its `response.completed` event.
A store that fails is logged with the request id and counted; the response still goes out, marked
`store: false` (it cannot be continued)."""

from __future__ import annotations

import logging
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mindmotor.coordinator.http.errors import NotFound
from mindmotor.coordinator.http.ignored import note_ignored, unknown_fields
from mindmotor.coordinator.http.sse import EventStreamResponse
from mindmotor.coordinator.openai.chat import create_chat_completion
from mindmotor.coordinator.openai.responses.output import ResponsesFormat, stream_events
from mindmotor.coordinator.openai.responses.request import chat_request, input_items, parse
from mindmotor.coordinator.state import Coordinator, request_id

log = logging.getLogger("mindmotor.coordinator")
FINISHED = (b"event: response.completed\n", b"event: response.incomplete\n")


async def create_response(c: Coordinator, body: dict, request: Request) -> Response:
    req = parse(body)
    note_ignored(request, unknown_fields(req))
    earlier = (await stored(c, req.previous_response_id, "previous_response_id"))["conversation"] \
        if req.previous_response_id else []
    conversation = earlier + input_items(req)
    chat = chat_request(req, conversation)
    response_id = f"resp_{request_id(request)}"
    formats: list[ResponsesFormat] = []

    def wrap(chat_format) -> ResponsesFormat:
        formats.append(ResponsesFormat(chat_format, response_id, chat_format.model, req))
        return formats[0]

    response = await create_chat_completion(c, chat, request, wrap=wrap)
    fmt = formats[0]
    if isinstance(response, EventStreamResponse):
        response.events = _storing(c, stream_events(response.events), fmt, conversation)
        return response
    await _store(c, fmt, conversation)
    return JSONResponse(fmt.final)


async def _storing(c: Coordinator, events: AsyncIterator[bytes], fmt: ResponsesFormat, conversation: list[dict]
                   ) -> AsyncIterator[bytes]:
    async for chunk in events:
        if chunk.startswith(FINISHED):
            await _store(c, fmt, conversation)
        yield chunk


async def _store(c: Coordinator, fmt: ResponsesFormat, conversation: list[dict]) -> None:
    if not fmt.request.store or fmt.final is None:
        return
    try:
        await c.responses.put(fmt.id, {"response": fmt.final, "conversation": conversation + fmt.final["output"],
                                       "input": conversation})
    except Exception:  # noqa: BLE001 - the response is still served, marked unstored
        log.exception("storing a response failed", extra={"response_id": fmt.id})
        c.metrics.responses_store_errors.inc()
        fmt.final["store"] = False


async def stored(c: Coordinator, response_id: str | None, param: str = "response_id") -> dict:
    record = await c.responses.get(response_id or "")
    if record is None:
        raise NotFound(f"the response {response_id!r} was not found (never stored, deleted, or expired)",
                       param=param, code="response_not_found")
    return record


async def get_response(c: Coordinator, response_id: str) -> dict:
    return (await stored(c, response_id))["response"]


async def delete_response(c: Coordinator, response_id: str) -> dict:
    if not await c.responses.delete(response_id):
        raise NotFound(f"the response {response_id!r} was not found", param="response_id", code="response_not_found")
    return {"id": response_id, "object": "response", "deleted": True}


async def input_items_of(c: Coordinator, response_id: str) -> dict:
    items = (await stored(c, response_id))["input"]
    data = [{"id": item.get("id") or f"item_{response_id.removeprefix('resp_')}_{i}", **item}
            for i, item in enumerate(items)]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": False}
