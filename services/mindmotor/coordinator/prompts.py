"""Prompts to token ids — the completions API's four prompt shapes, chat messages through the
model's chat template — and the context-length check: the engine's rules (`request_rules`),
applied before any worker is asked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mindmotor.common.tokenizer import Tokenizer, TokenizerError
from mindmotor.engine.request_rules import InvalidRequest, check_text, check_token_ids
from mindmotor.engine.request_rules import resolve_max_tokens as _resolve_max_tokens

from .errors import BadRequest
from .schemas import ChatMessage


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    text: str | None = None         # the text it came from (for echo), when it came from text


def bad_request(exc: InvalidRequest) -> BadRequest:
    """The shared rules' error as the HTTP API's 400."""
    return BadRequest(exc.message, param=exc.param, code=exc.code)


def encode_text(tokenizer: Tokenizer, text: str, param: str) -> list[int]:
    """`text` tokenized; a 400 naming `param` for text no tokenizer takes (lone surrogates)."""
    try:
        return tokenizer.encode(check_text(text, param))
    except InvalidRequest as exc:
        raise bad_request(exc) from None


def completion_prompts(prompt, tokenizer: Tokenizer) -> list[Prompt]:
    if isinstance(prompt, str):
        prompts = [Prompt(encode_text(tokenizer, prompt, "prompt"), prompt)]
    elif not prompt:
        raise BadRequest("the prompt is empty", param="prompt", code="invalid_value")
    elif isinstance(prompt[0], str):
        prompts = [Prompt(encode_text(tokenizer, p, "prompt"), p) for p in prompt]
    elif isinstance(prompt[0], int):
        prompts = [Prompt(list(prompt))]
    else:
        prompts = [Prompt(list(p)) for p in prompt]
    for p in prompts:
        if not p.token_ids:
            raise BadRequest("the prompt is empty", param="prompt", code="invalid_value")
        try:
            check_token_ids(p.token_ids, "prompt token ids", param="prompt")   # the vocabulary: the worker's
        except InvalidRequest as exc:
            raise bad_request(exc) from None
    return prompts


def chat_text(messages: Sequence[ChatMessage], tokenizer: Tokenizer, add_generation_prompt: bool = True,
              tools: list[dict] | None = None) -> str:
    for i, m in enumerate(messages):
        try:
            check_text(m.text(), f"messages.{i}.content")
            check_text(m.name or "", f"messages.{i}.name")
        except InvalidRequest as exc:
            raise bad_request(exc) from None
    try:
        return tokenizer.apply_chat_template([m.template_dict() for m in messages],
                                             add_generation_prompt=add_generation_prompt, tools=tools)
    except TokenizerError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except Exception as exc:  # a template error (jinja2): the messages do not fit the template
        raise BadRequest(f"the messages cannot be formatted with the model's chat template: {exc}",
                         param="messages") from exc


def chat_prompt(messages: Sequence[ChatMessage], tokenizer: Tokenizer, add_generation_prompt: bool = True,
                tools: list[dict] | None = None) -> Prompt:
    text = chat_text(messages, tokenizer, add_generation_prompt, tools)
    ids = encode_text(tokenizer, text, "messages")
    if not ids:
        raise BadRequest("the messages make an empty prompt", param="messages")
    return Prompt(ids, text)


def resolve_max_tokens(prompt_len: int, max_tokens: int | None, max_model_len: int, min_tokens: int = 0) -> int:
    """The number of tokens the request may produce; BadRequest when the context cannot hold it
    (or min_tokens exceeds the room left). With no known context length (no instance reported
    yet), the worker checks instead."""
    if not max_model_len:
        return max_tokens or 0
    try:
        return _resolve_max_tokens(prompt_len, max_tokens, min_tokens, max_model_len)
    except InvalidRequest as exc:
        raise bad_request(exc) from None
