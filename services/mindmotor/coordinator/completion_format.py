"""The completions API's response and stream chunks (`object: "text_completion"`)."""

from __future__ import annotations

from .generation import Piece, Usage
from .logprobs import CompletionLogprobs, TokenText
from .results import ChoiceResult, usage_body

OBJECT = "text_completion"


class CompletionFormat:
    def __init__(self, response_id: str, created: int, model: str, tokens: TokenText, logprobs: int | None,
                 echo_texts: list[str] | None, include_usage: bool):
        self.response_id = response_id
        self.created = created
        self.model = model
        self.tokens = tokens
        self.logprobs = logprobs
        self.echo_texts = echo_texts            # per choice, when echo was asked
        self.include_usage = include_usage
        self._lp: dict[int, CompletionLogprobs] = {}

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = {"id": self.response_id, "object": OBJECT, "created": self.created, "model": self.model,
                 "choices": choices}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _logprobs(self, index: int) -> CompletionLogprobs:
        lp = self._lp.get(index)
        if lp is None:
            offset = len(self.echo_texts[index]) if self.echo_texts else 0
            lp = self._lp[index] = CompletionLogprobs(self.tokens, self.logprobs or 0, offset)
        return lp

    def stream_start(self, index: int) -> list[dict]:
        if self.echo_texts and self.echo_texts[index]:
            return [self._chunk([{"index": index, "text": self.echo_texts[index], "logprobs": None,
                                  "finish_reason": None}])]
        return []

    def stream_piece(self, index: int, piece: Piece) -> list[dict]:
        if not (piece.text or piece.finish_reason or (self.logprobs is not None and piece.logprobs)):
            return []
        logprobs = self._logprobs(index).piece(piece.logprobs) if self.logprobs is not None else None
        choice = {"index": index, "text": piece.text, "logprobs": logprobs, "finish_reason": piece.finish_reason}
        if piece.finish_reason is not None:
            choice["stop_reason"] = piece.stop_reason
        return [self._chunk([choice])]

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.response_id, "object": OBJECT, "created": self.created, "model": self.model,
                "choices": [], "usage": usage_body(usage)}

    def response(self, results: list[ChoiceResult], usage: Usage) -> dict:
        choices = []
        for index, result in enumerate(results):
            echo = self.echo_texts[index] if self.echo_texts else ""
            logprobs = (self._logprobs(index).piece(result.logprobs) if self.logprobs is not None else None)
            choices.append({"index": index, "text": echo + result.text, "logprobs": logprobs,
                            "finish_reason": result.finish_reason, "stop_reason": result.stop_reason})
        return {"id": self.response_id, "object": OBJECT, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage_body(usage), "system_fingerprint": None}
