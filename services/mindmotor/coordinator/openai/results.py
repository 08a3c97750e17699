"""`ChoiceResult`: one choice collected whole (for non-streaming responses), and the usage of a
response: prompt tokens counted once per prompt, completion tokens summed over every choice."""

from __future__ import annotations

from dataclasses import dataclass, field

from mindmotor.protocol import worker_pb2 as pb

from mindmotor.coordinator.dispatch.generation import Piece, Usage


@dataclass
class ChoiceResult:
    prompt_index: int = 0
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    usage: Usage | None = None
    prompt_logprobs: list[pb.TokenLogprob] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def add(self, piece: Piece) -> None:
        self.text_parts.append(piece.text)
        self.token_ids.extend(piece.token_ids)
        self.logprobs.extend(piece.logprobs)
        self.prompt_logprobs.extend(piece.prompt_logprobs)
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason
            self.stop_reason = piece.stop_reason
            self.usage = piece.usage


def total_usage(usages: list[tuple[int, Usage | None]]) -> Usage:
    """Usage of a response from (prompt index, usage) of every choice."""
    total = Usage()
    seen: set[int] = set()
    for prompt_index, usage in usages:
        if usage is None:
            continue
        total.completion_tokens += usage.completion_tokens
        if prompt_index not in seen:
            seen.add(prompt_index)
            total.prompt_tokens += usage.prompt_tokens
            total.cached_tokens += usage.cached_tokens
    return total


def usage_body(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}
