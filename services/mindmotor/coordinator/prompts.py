"""Prompts to token ids — the completions API's four prompt shapes, chat messages through the
model's chat template — and the context-length check (the engine's rule, applied before any
worker is asked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mindmotor.common.tokenizer import Tokenizer, TokenizerError

from .errors import BadRequest
from .schemas import ChatMessage


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    text: str | None = None         # the text it came from (for echo), when it came from text


def completion_prompts(prompt, tokenizer: Tokenizer) -> list[Prompt]:
    if isinstance(prompt, str):
        prompts = [Prompt(tokenizer.encode(prompt), prompt)]
    elif not prompt:
        raise BadRequest("the prompt is empty", param="prompt", code="invalid_value")
    elif isinstance(prompt[0], str):
        prompts = [Prompt(tokenizer.encode(p), p) for p in prompt]
    elif isinstance(prompt[0], int):
        prompts = [Prompt(list(prompt))]
    else:
        prompts = [Prompt(list(p)) for p in prompt]
    for p in prompts:
        if not p.token_ids:
            raise BadRequest("the prompt is empty", param="prompt", code="invalid_value")
        if any(t < 0 for t in p.token_ids):
            raise BadRequest("prompt token ids must not be negative", param="prompt", code="invalid_value")
    return prompts


def chat_text(messages: Sequence[ChatMessage], tokenizer: Tokenizer, add_generation_prompt: bool = True) -> str:
    try:
        return tokenizer.apply_chat_template([{"role": m.role, "content": m.text()} for m in messages],
                                             add_generation_prompt=add_generation_prompt)
    except TokenizerError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except Exception as exc:  # a template error (jinja2): the messages do not fit the template
        raise BadRequest(f"the messages cannot be formatted with the model's chat template: {exc}",
                         param="messages") from exc


def chat_prompt(messages: Sequence[ChatMessage], tokenizer: Tokenizer, add_generation_prompt: bool = True) -> Prompt:
    text = chat_text(messages, tokenizer, add_generation_prompt)
    ids = tokenizer.encode(text)
    if not ids:
        raise BadRequest("the messages make an empty prompt", param="messages")
    return Prompt(ids, text)


def resolve_max_tokens(prompt_len: int, max_tokens: int | None, max_model_len: int) -> int:
    """The number of tokens the request may produce; BadRequest when the context cannot hold it.
    With no known context length (no instance reported yet), the worker checks instead."""
    if not max_model_len:
        return max_tokens or 0
    if prompt_len >= max_model_len:
        raise BadRequest(f"the prompt has {prompt_len} tokens, but this model's maximum context length is "
                         f"{max_model_len} tokens (prompt plus at least one generated token)",
                         param="prompt", code="context_length_exceeded")
    room = max_model_len - prompt_len
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise BadRequest(f"this model's maximum context length is {max_model_len} tokens, but "
                         f"{prompt_len + max_tokens} were requested ({prompt_len} in the prompt, {max_tokens} "
                         "in the completion); reduce the prompt or max_tokens",
                         param="max_tokens", code="context_length_exceeded")
    return max_tokens
