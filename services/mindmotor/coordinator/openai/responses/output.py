"""A chat completion as a Responses API response, and a chat stream as Responses events.

`ResponsesFormat` wraps the request's `ChatFormat` (which already parses tool calls, whole or
streamed): each chat chunk it makes becomes Responses events — an output item opened when its first
text or call arrives (`response.output_item.added`, `response.content_part.added`), text and
argument deltas, every open item closed and `response.completed` (or `response.incomplete` when
`max_output_tokens` cut it) with the whole response when the choice's last piece arrives (it
carries the usage). An error after the stream began is an `error` event; there is no `[DONE]`.
Every event has its `sequence_number`; the SSE `event:` line names its type (`stream_events`)."""

from __future__ import annotations

import itertools
import json
import time
from typing import AsyncIterator

from mindmotor.coordinator.dispatch.generation import Piece, Usage
from mindmotor.coordinator.http.errors import APIError
from mindmotor.coordinator.openai.chat_format import ChatFormat
from mindmotor.coordinator.openai.responses.request import ResponsesRequest
from mindmotor.coordinator.openai.results import ChoiceResult
from mindmotor.vocabulary import FinishReason


class ResponsesFormat:
    stream_end = None
    resumable = False

    def __init__(self, chat: ChatFormat, response_id: str, model: str, request: ResponsesRequest):
        self.chat = chat
        self.id = response_id
        self.model = model
        self.request = request
        self.created_at = int(time.time())
        self.final: dict | None = None              # the finished response (to store)
        self._seq = 0
        self._output: list[dict] = []               # items so far (a stream's)
        self._open: dict | None = None              # the item being streamed
        self._calls: dict[int, dict] = {}           # chat tool-call index -> its function_call item
        self._numbers = itertools.count()           # output item ids

    # ---- the response object ----------------------------------------------------------------
    def envelope(self, status: str, output: list[dict], usage: Usage | None = None,
                 incomplete: bool = False) -> dict:
        r = self.request
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.model, "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": r.instructions, "tools": r.tools or [], "tool_choice": r.tool_choice or "auto",
                "parallel_tool_calls": r.parallel_tool_calls if r.parallel_tool_calls is not None else True,
                "text": r.text or {"format": {"type": "text"}}, "temperature": r.temperature, "top_p": r.top_p,
                "max_output_tokens": r.max_output_tokens, "previous_response_id": r.previous_response_id,
                "metadata": r.metadata or {}, "store": r.store, "truncation": r.truncation or "disabled",
                "user": r.user, "reasoning": r.reasoning, "usage": _usage(usage) if usage is not None else None}

    def response(self, results: list[ChoiceResult], usage: Usage) -> dict:
        message = self.chat.response(results, usage)["choices"][0]["message"]
        output = []
        if message.get("content"):
            output.append(_message_item(self._item_id("msg"), message["content"]))
        for call in message.get("tool_calls") or []:
            output.append(_call_item(self._item_id("fc"), call["id"], call["function"]["name"],
                                     call["function"]["arguments"]))
        incomplete = results[0].finish_reason == FinishReason.LENGTH
        self.final = self.envelope("incomplete" if incomplete else "completed", output, usage, incomplete)
        return self.final

    def _item_id(self, kind: str) -> str:
        return f"{kind}_{self.id.removeprefix('resp_')}{next(self._numbers)}"

    # ---- the stream ---------------------------------------------------------------------------
    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def stream_start(self, index: int) -> list[dict]:
        started = self.envelope("in_progress", [])
        return [self._event("response.created", response=started),
                self._event("response.in_progress", response=started)]

    def stream_piece(self, index: int, piece: Piece) -> list[dict]:
        events = []
        for chunk in self.chat.stream_piece(index, piece):
            for choice in chunk["choices"]:
                events += self._delta(choice.get("delta") or {})
        if piece.finish_reason is not None:
            events += self._close()
            incomplete = piece.finish_reason == FinishReason.LENGTH
            self.final = self.envelope("incomplete" if incomplete else "completed", self._output, piece.usage,
                                       incomplete)
            events.append(self._event("response.incomplete" if incomplete else "response.completed",
                                      response=self.final))
        return events

    def _delta(self, delta: dict) -> list[dict]:
        events = []
        if delta.get("content"):
            if self._open is None or self._open["type"] != "message":
                events += self._close()
                events += self._open_item(_message_item(self._item_id("msg"), "", status="in_progress"))
                events.append(self._event("response.content_part.added", item_id=self._open["id"],
                                          output_index=len(self._output), content_index=0,
                                          part={"type": "output_text", "text": "", "annotations": []}))
            self._open["content"][0]["text"] += delta["content"]
            events.append(self._event("response.output_text.delta", item_id=self._open["id"],
                                      output_index=len(self._output), content_index=0, delta=delta["content"],
                                      logprobs=[]))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id") is not None:               # a new call: its id and name first
                events += self._close()
                item = _call_item(self._item_id("fc"), call["id"], function.get("name", ""), "", "in_progress")
                self._calls[call.get("index", 0)] = item
                events += self._open_item(item)
            item = self._calls.get(call.get("index", 0))
            if function.get("arguments") and item is not None:
                item["arguments"] += function["arguments"]
                events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                          output_index=len(self._output), delta=function["arguments"]))
        return events

    def _open_item(self, item: dict) -> list[dict]:
        self._open = item
        return [self._event("response.output_item.added", output_index=len(self._output), item=dict(item))]

    def _close(self) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        at = len(self._output)
        item["status"] = "completed"
        self._output.append(item)
        events = []
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(self._event("response.output_text.done", item_id=item["id"], output_index=at,
                                      content_index=0, text=text, logprobs=[]))
            events.append(self._event("response.content_part.done", item_id=item["id"], output_index=at,
                                      content_index=0, part=item["content"][0]))
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=at, name=item["name"], arguments=item["arguments"]))
        events.append(self._event("response.output_item.done", output_index=at, item=item))
        return events

    def stream_error(self, exc: APIError) -> dict:
        return self._event("error", code=exc.code, message=exc.message, param=exc.param)

    def usage_chunk(self, usage: Usage) -> dict:       # never asked for: response.completed carries it
        return {}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _usage(usage: Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


async def stream_events(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """SSE events with the `event:` line the Responses API sends before each `data:` line."""
    async for chunk in events:
        if chunk.startswith(b"data: {"):
            kind = json.loads(chunk[6:]).get("type")
            if isinstance(kind, str):
                chunk = b"event: " + kind.encode() + b"\n" + chunk
        yield chunk
