"""Prompts to token ids — the completions API's four prompt shapes, chat messages through the
model's chat template — and the context-length check: the engine's rules (`request_rules`),
applied before any worker is asked.

Nothing here runs long on the event loop: text beyond `INLINE_CHARS` is tokenized on a worker
thread by the tokenizers library's batch call (which releases the GIL), and a chat template over
more than `INLINE_CHARS` of messages is rendered on a worker thread; the rendered prompt is
limited to `max_prompt_chars` (400 naming the limit)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Sequence

from mindmotor.common.tokenizer import Tokenizer, TokenizerError
from mindmotor.rules.request_rules import InvalidRequest, check_text, check_token_ids
from mindmotor.rules.request_rules import resolve_max_tokens as _resolve_max_tokens

from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.openai.schemas import ChatMessage

INLINE_CHARS = 8192      # below this, a thread hop costs more than the work


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    text: str | None = None         # the text it came from (for echo), when it came from text


def bad_request(exc: InvalidRequest) -> BadRequest:
    """The shared rules' error as the HTTP API's 400."""
    return BadRequest(exc.message, param=exc.param, code=exc.code)


async def encode_texts(tokenizer: Tokenizer, texts: list[str], param: str, max_model_len: int = 0
                       ) -> list[list[int]]:
    """Each text tokenized; a 400 naming `param` for text no tokenizer takes (lone surrogates), or
    that is sure to exceed `max_model_len` tokens (more characters than that many tokens can
    spell: refused without spending the CPU to tokenize it). Large inputs off the event loop."""
    try:
        for text in texts:
            check_text(text, param)
    except InvalidRequest as exc:
        raise bad_request(exc) from None
    limit = max_model_len * tokenizer.max_token_chars if max_model_len else 0
    longest = max((len(t) for t in texts), default=0)
    if limit and longest > limit:
        raise BadRequest(f"the {param} has {longest} characters, so more than this model's maximum context length "
                         f"of {max_model_len} tokens (a token is at most {tokenizer.max_token_chars} characters)",
                         param=param, code="context_length_exceeded")
    if sum(len(t) for t in texts) <= INLINE_CHARS:
        return [tokenizer.encode(t) for t in texts]
    return await asyncio.to_thread(tokenizer.encode_many, texts)


async def encode_text(tokenizer: Tokenizer, text: str, param: str, max_model_len: int = 0) -> list[int]:
    return (await encode_texts(tokenizer, [text], param, max_model_len))[0]


async def completion_prompts(prompt, tokenizer: Tokenizer, max_model_len: int = 0) -> list[Prompt]:
    if isinstance(prompt, str):
        prompt = [prompt]
    elif not prompt:
        raise BadRequest("the prompt is empty", param="prompt", code="invalid_value")
    if isinstance(prompt[0], str):
        prompts = [Prompt(ids, p) for ids, p in zip(await encode_texts(tokenizer, list(prompt), "prompt",
                                                                          max_model_len), prompt)]
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


async def chat_text(messages: Sequence[ChatMessage], tokenizer: Tokenizer, add_generation_prompt: bool = True,
                    tools: list[dict] | None = None, max_chars: int | None = None) -> str:
    size = 0
    for i, m in enumerate(messages):
        try:
            check_text(m.text(), f"messages.{i}.content")
            check_text(m.name or "", f"messages.{i}.name")
        except InvalidRequest as exc:
            raise bad_request(exc) from None
        size += len(m.text())
    dicts = [m.template_dict() for m in messages]

    def render() -> str:
        return tokenizer.apply_chat_template(dicts, add_generation_prompt=add_generation_prompt, tools=tools)

    try:
        text = render() if size <= INLINE_CHARS and not tools else await asyncio.to_thread(render)
    except TokenizerError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except Exception as exc:  # a template error (jinja2): the messages do not fit the template
        raise BadRequest(f"the messages cannot be formatted with the model's chat template: {exc}",
                         param="messages") from exc
    if max_chars is not None and len(text) > max_chars:
        raise BadRequest(f"the chat template made a prompt of {len(text)} characters; the limit is {max_chars}",
                         param="messages", code="prompt_too_long")
    return text


async def chat_prompt(messages: Sequence[ChatMessage], tokenizer: Tokenizer, add_generation_prompt: bool = True,
                      tools: list[dict] | None = None, max_chars: int | None = None,
                      max_model_len: int = 0) -> Prompt:
    text = await chat_text(messages, tokenizer, add_generation_prompt, tools, max_chars)
    ids = await encode_text(tokenizer, text, "messages", max_model_len)
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
