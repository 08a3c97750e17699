"""The chat completions API's response (`object: "chat.completion"`) and stream chunks
(`object: "chat.completion.chunk"`: the role first, then content deltas, then the finish)."""

from __future__ import annotations

from .generation import Piece, Usage
from .logprobs import TokenText, chat_logprobs, vllm_prompt_logprobs
from .results import ChoiceResult, usage_body

OBJECT = "chat.completion"
CHUNK_OBJECT = "chat.completion.chunk"


class ChatFormat:
    def __init__(self, response_id: str, created: int, model: str, tokens: TokenText, logprobs: bool,
                 top_logprobs: int, include_usage: bool, prompt_logprobs: int | None = None,
                 as_ids: bool = False, prompt_token_ids: list[int] | None = None):
        self.response_id = response_id
        self.created = created
        self.model = model
        self.tokens = tokens
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.include_usage = include_usage
        self.prompt_logprobs = prompt_logprobs      # vLLM's field (not streamed), when asked
        self.prompt_token_ids = prompt_token_ids
        self.as_ids = as_ids

    def _chunk(self, index: int, delta: dict, finish_reason: str | None = None, logprobs=None,
               stop_reason=None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        chunk = {"id": self.response_id, "object": CHUNK_OBJECT, "created": self.created, "model": self.model,
                 "system_fingerprint": None, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _logprobs(self, entries) -> dict | None:
        if not self.logprobs:
            return None
        return {"content": chat_logprobs(entries, self.tokens, self.top_logprobs, self.as_ids), "refusal": None}

    def stream_start(self, index: int) -> list[dict]:
        return [self._chunk(index, {"role": "assistant", "content": ""})]

    def stream_piece(self, index: int, piece: Piece) -> list[dict]:
        chunks = []
        if piece.text or (self.logprobs and piece.logprobs):
            chunks.append(self._chunk(index, {"content": piece.text}, logprobs=self._logprobs(piece.logprobs)))
        if piece.finish_reason is not None:
            chunks.append(self._chunk(index, {}, piece.finish_reason, stop_reason=piece.stop_reason))
        return chunks

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.response_id, "object": CHUNK_OBJECT, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": [], "usage": usage_body(usage)}

    def response(self, results: list[ChoiceResult], usage: Usage) -> dict:
        choices = [{"index": index,
                    "message": {"role": "assistant", "content": result.text, "refusal": None},
                    "logprobs": self._logprobs(result.logprobs), "finish_reason": result.finish_reason,
                    "stop_reason": result.stop_reason}
                   for index, result in enumerate(results)]
        body = {"id": self.response_id, "object": OBJECT, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, "usage": usage_body(usage)}
        if self.prompt_logprobs is not None:
            body["prompt_logprobs"] = vllm_prompt_logprobs(
                self.prompt_token_ids[0], results[0].prompt_logprobs if results else [], self.tokens,
                self.prompt_logprobs, self.as_ids)
        return body
