"""The chat completions API's response (`object: "chat.completion"`) and stream chunks
(`object: "chat.completion.chunk"`: the role first, then content deltas, then the finish).

vLLM's extras: `echo` (the last message's content first: a chunk of its own in a stream), the
reply's role (the last message's without a generation prompt), and `return_token_ids` —
`prompt_token_ids` on the response (in a stream: on each choice's first chunk) and `token_ids` on
each choice (in a stream: each chunk's new tokens)."""

from __future__ import annotations

from mindmotor.coordinator.dispatch.respond import OpenAIFraming
from mindmotor.coordinator.dispatch.generation import Piece, Usage
from mindmotor.coordinator.openai.logprobs import TokenText, chat_logprobs, vllm_prompt_logprobs
from mindmotor.coordinator.openai.results import ChoiceResult, usage_body
from mindmotor.coordinator.openai.running_usage import RunningUsage
from mindmotor.coordinator.openai.tool_stream import Delta, ToolCallStream
from mindmotor.coordinator.openai.tools import ToolCall, ToolPlan

from mindmotor.vocabulary import FinishReason

OBJECT = "chat.completion"
CHUNK_OBJECT = "chat.completion.chunk"


class ChatFormat(OpenAIFraming):
    def __init__(self, response_id: str, created: int, model: str, tokens: TokenText, logprobs: bool,
                 top_logprobs: int, include_usage: bool, prompt_logprobs: int | None = None,
                 as_ids: bool = False, prompt_token_ids: list[int] | None = None, tools: ToolPlan | None = None,
                 running: RunningUsage | None = None, role: str = "assistant", echo: str = "",
                 return_token_ids: bool = False):
        self.response_id = response_id
        self.role = role
        self.echo = echo
        self.return_token_ids = return_token_ids
        self.created = created
        self.model = model
        self.tokens = tokens
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.include_usage = include_usage
        self.prompt_logprobs = prompt_logprobs      # vLLM's field (not streamed), when asked
        self.prompt_token_ids = prompt_token_ids
        self.as_ids = as_ids
        self.tools = tools if tools is not None and tools.parses else None
        self._streams: dict[int, ToolCallStream] = {}   # with auto/required tools: each choice's parser
        self._named: set[int] = set()                   # named: the choices whose header was sent
        self.running = running                      # continuous_usage_stats

    @property
    def resumable(self) -> bool:
        """Whether a cut stream can be resumed (resume.py): not with parsed tool calls (a piece
        makes several chunks, whose parser state runs over the whole output)."""
        return self.tools is None

    def _chunk(self, index: int, delta: dict, finish_reason: str | None = None, logprobs=None,
               stop_reason=None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        chunk = {"id": self.response_id, "object": CHUNK_OBJECT, "created": self.created, "model": self.model,
                 "system_fingerprint": None, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        if self.running is not None:
            chunk["usage"] = self.running.body(index)
        return chunk

    def _logprobs(self, entries) -> dict | None:
        if not self.logprobs:
            return None
        return {"content": chat_logprobs(entries, self.tokens, self.top_logprobs, self.as_ids), "refusal": None}

    def stream_start(self, index: int) -> list[dict]:
        first = self._chunk(index, {"role": self.role, "content": ""})
        if self.return_token_ids:
            first["prompt_token_ids"] = list(self.prompt_token_ids or ())
        return [first] + ([self._chunk(index, {"content": self.echo})] if self.echo else [])

    def stream_piece(self, index: int, piece: Piece) -> list[dict]:
        chunks = self._stream_piece(index, piece)
        if self.return_token_ids and piece.token_ids:
            if not chunks or chunks[0]["choices"][0]["finish_reason"] is not None:
                chunks.insert(0, self._chunk(index, {}))
            chunks[0]["choices"][0]["token_ids"] = list(piece.token_ids)
        return chunks

    def _stream_piece(self, index: int, piece: Piece) -> list[dict]:
        if self.running is not None:
            self.running.add(index, len(piece.token_ids))
        if self.tools is not None:
            return self._tool_stream_piece(index, piece)
        chunks = []
        if piece.text or (self.logprobs and piece.logprobs):
            chunks.append(self._chunk(index, {"content": piece.text}, logprobs=self._logprobs(piece.logprobs)))
        if piece.finish_reason is not None:
            chunks.append(self._chunk(index, {}, piece.finish_reason, stop_reason=piece.stop_reason))
        return chunks

    def _tool_stream_piece(self, index: int, piece: Piece) -> list[dict]:
        """A named call streams as it is generated: the call's id and name first, then argument
        deltas. Auto and required stream like vLLM's tool parsers: content until a `<tool_call>`
        is recognised, then per call a delta with its index, id, type and name, then deltas of
        its arguments as they grow; finish_reason "tool_calls" when a call was made."""
        if self.tools.mode == "named":
            chunks = self._named_stream_piece(index, piece)
        else:
            stream = self._streams.setdefault(index, self.tools.stream())
            deltas = stream.feed(piece.text)
            if piece.finish_reason is not None:
                deltas += stream.finish()
                del self._streams[index]
            chunks = [self._chunk(index, self._delta(d)) for d in deltas]
            if piece.finish_reason is not None:
                chunks.append(self._chunk(index, {}, self._finish(piece.finish_reason, stream.calls),
                                          stop_reason=piece.stop_reason))
        if self.logprobs and piece.logprobs:
            if not chunks or chunks[0]["choices"][0]["finish_reason"] is not None:
                chunks.insert(0, self._chunk(index, {}))
            chunks[0]["choices"][0]["logprobs"] = self._logprobs(piece.logprobs)
        return chunks

    @staticmethod
    def _delta(d: Delta) -> dict:
        if d.index is None:
            return {"content": d.content}
        if d.name is not None:
            return {"tool_calls": [ToolCall(d.name, "").body(d.index)]}
        return {"tool_calls": [{"index": d.index, "function": {"arguments": d.arguments}}]}

    def _named_stream_piece(self, index: int, piece: Piece) -> list[dict]:
        chunks = []
        if index not in self._named:
            self._named.add(index)
            header = ToolCall(self.tools.name, "").body(0)
            chunks.append(self._chunk(index, {"role": "assistant", "content": None, "tool_calls": [header]}))
        if piece.text:
            chunks.append(self._chunk(index, {"tool_calls": [{"index": 0, "function": {"arguments": piece.text}}]}))
        if piece.finish_reason is not None:
            self._named.discard(index)
            chunks.append(self._chunk(index, {}, piece.finish_reason, stop_reason=piece.stop_reason))
        return chunks

    def _finish(self, finish_reason: str | None, calls) -> str | None:
        if calls and self.tools.mode != "named" and finish_reason == FinishReason.STOP:
            return FinishReason.TOOL_CALLS
        return finish_reason

    def _message(self, result: ChoiceResult) -> tuple[dict, str | None]:
        if self.tools is None:
            return {"role": self.role, "content": self.echo + result.text, "refusal": None}, result.finish_reason
        content, calls = self.tools.parse(result.text)
        if self.echo:
            content = self.echo + (content or "")
        message = {"role": self.role, "content": content, "refusal": None,
                   "tool_calls": [c.body() for c in calls]}
        return message, self._finish(result.finish_reason, calls)

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.response_id, "object": CHUNK_OBJECT, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": [], "usage": usage_body(usage)}

    def response(self, results: list[ChoiceResult], usage: Usage) -> dict:
        choices = []
        for index, result in enumerate(results):
            message, finish_reason = self._message(result)
            choices.append({"index": index, "message": message, "logprobs": self._logprobs(result.logprobs),
                            "finish_reason": finish_reason, "stop_reason": result.stop_reason})
            if self.return_token_ids:
                choices[-1]["token_ids"] = list(result.token_ids)
        body = {"id": self.response_id, "object": OBJECT, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, "usage": usage_body(usage)}
        if self.return_token_ids:
            body["prompt_token_ids"] = list(self.prompt_token_ids or ())
        if self.prompt_logprobs is not None:
            body["prompt_logprobs"] = vllm_prompt_logprobs(
                self.prompt_token_ids[0], results[0].prompt_logprobs if results else [], self.tokens,
                self.prompt_logprobs, self.as_ids)
        return body
