"""Prompts to token ids — the completions API's four prompt shapes, chat messages through the
model's chat template — and the context-length check: the engine's rules (`request_rules`),
applied before any worker is asked.

Nothing here runs long on the event loop: text beyond `INLINE_CHARS` is tokenized on a worker
thread by the tokenizers library's batch call (which releases the GIL), and a chat template over
more than `INLINE_CHARS` of messages is rendered on a worker thread; the rendered prompt is
limited to `max_prompt_chars` (400 naming the limit).

vLLM's prompt options: `add_special_tokens` (what the tokenizer's post-processor adds, a BOS:
true by default for completions, false for chat, whose template writes them), and
`truncate_prompt_tokens` (only the last N tokens of each prompt; -1: the model's context length;
more than the context is a 400). A truncated text prompt is not refused for its length before
tokenizing, and its echo is the text of the tokens kept."""

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


async def encode_texts(tokenizer: Tokenizer, texts: list[str], param: str, max_model_len: int = 0,
                       add_special_tokens: bool = False) -> list[list[int]]:
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
        return [tokenizer.encode(t, add_special_tokens) for t in texts]
    return await asyncio.to_thread(tokenizer.encode_many, texts, add_special_tokens)


async def encode_text(tokenizer: Tokenizer, text: str, param: str, max_model_len: int = 0,
                      add_special_tokens: bool = False) -> list[int]:
    return (await encode_texts(tokenizer, [text], param, max_model_len, add_special_tokens))[0]


def truncation(truncate_prompt_tokens: int | None, max_model_len: int) -> int | None:
    """How many prompt tokens to keep (the last ones), or None: all. -1 is the context length."""
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1:
        return max_model_len or None
    if max_model_len and truncate_prompt_tokens > max_model_len:
        raise BadRequest(f"truncate_prompt_tokens ({truncate_prompt_tokens}) is greater than this model's maximum "
                         f"context length ({max_model_len}); choose a smaller truncation size",
                         param="truncate_prompt_tokens")
    if truncate_prompt_tokens == 0:
        raise BadRequest("truncate_prompt_tokens must be at least 1 (or -1: the context length)",
                         param="truncate_prompt_tokens")
    return truncate_prompt_tokens


def _keep_last(prompt: Prompt, keep: int | None, tokenizer: Tokenizer) -> Prompt:
    if keep is None or len(prompt.token_ids) <= keep:
        return prompt
    ids = prompt.token_ids[-keep:]
    return Prompt(ids, tokenizer.decode(ids, skip_special_tokens=False) if prompt.text is not None else None)


async def completion_prompts(prompt, tokenizer: Tokenizer, max_model_len: int = 0, add_special_tokens: bool = False,
                             keep: int | None = None) -> list[Prompt]:
    """The prompts as token ids; `keep`: only each one's last `keep` tokens (`truncation`)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    elif not prompt:
        raise BadRequest("the prompt is empty", param="prompt", code="invalid_value")
    if isinstance(prompt[0], str):
        ids = await encode_texts(tokenizer, list(prompt), "prompt", 0 if keep else max_model_len, add_special_tokens)
        prompts = [Prompt(i, p) for i, p in zip(ids, prompt)]
    elif isinstance(prompt[0], int):
        prompts = [Prompt(list(prompt))]
    else:
        prompts = [Prompt(list(p)) for p in prompt]
    prompts = [_keep_last(p, keep, tokenizer) for p in prompts]
    for p in prompts:
        if not p.token_ids:
            raise BadRequest("the prompt is empty", param="prompt", code="invalid_value")
        try:
            check_token_ids(p.token_ids, "prompt token ids", param="prompt")   # the vocabulary: the worker's
        except InvalidRequest as exc:
            raise bad_request(exc) from None
    return prompts


@dataclass(frozen=True)
class TemplateOptions:
    """How messages are rendered: the chat request's template fields."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict] | None = None
    documents: list[dict] | None = None
    kwargs: dict | None = None          # chat_template_kwargs

    @classmethod
    def of(cls, body, tools: list[dict] | None = None) -> "TemplateOptions":
        """The options of a chat (or tokenize) request body; 400 for continue_final_message with
        add_generation_prompt, and for template kwargs that would replace the request's own."""
        if body.continue_final_message and body.add_generation_prompt:
            raise BadRequest("continue_final_message and add_generation_prompt cannot both be true (add_generation_"
                             "prompt defaults to true: set it to false to continue the final message)",
                             param="continue_final_message")
        kwargs = dict(body.chat_template_kwargs or {})
        reserved = sorted(RESERVED_TEMPLATE_VARIABLES & kwargs.keys())
        if reserved:
            raise BadRequest(f"chat_template_kwargs must not set {reserved[0]!r}: it is the request's own "
                             "(a field of the request, or the server's)", param=f"chat_template_kwargs.{reserved[0]}")
        return cls(body.add_generation_prompt, body.continue_final_message, tools,
                   getattr(body, "documents", None), kwargs or None)

    def unused(self, tokenizer: Tokenizer) -> list[str]:
        """The options the model's chat template does not read, so change nothing (named as ignored)."""
        variables = tokenizer.template_variables
        unused = [f"chat_template_kwargs.{k}" for k in (self.kwargs or {}) if k not in variables]
        if self.documents and "documents" not in variables:
            unused.append("documents")
        return unused


# what the renderer itself passes to the template: not a request's chat_template_kwargs
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                                         "continue_final_message", "bos_token", "eos_token", "chat_template",
                                         "tokenize"})


async def chat_text(messages: Sequence[ChatMessage], tokenizer: Tokenizer, options: TemplateOptions = TemplateOptions(),
                    max_chars: int | None = None) -> str:
    if options.continue_final_message and not messages:
        raise BadRequest("continue_final_message needs a final message", param="messages")
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
        return tokenizer.apply_chat_template(dicts, add_generation_prompt=options.add_generation_prompt,
                                             tools=options.tools, documents=options.documents,
                                             continue_final_message=options.continue_final_message,
                                             extra=options.kwargs)

    heavy = options.tools or options.documents or options.kwargs
    try:
        text = render() if size <= INLINE_CHARS and not heavy else await asyncio.to_thread(render)
    except TokenizerError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except Exception as exc:  # a template error (jinja2): the messages do not fit the template
        raise BadRequest(f"the messages cannot be formatted with the model's chat template: {exc}",
                         param="messages") from exc
    if max_chars is not None and len(text) > max_chars:
        raise BadRequest(f"the chat template made a prompt of {len(text)} characters; the limit is {max_chars}",
                         param="messages", code="prompt_too_long")
    return text


async def chat_prompt(messages: Sequence[ChatMessage], tokenizer: Tokenizer, options: TemplateOptions = TemplateOptions(),
                      max_chars: int | None = None, max_model_len: int = 0, add_special_tokens: bool = False,
                      keep: int | None = None) -> Prompt:
    text = await chat_text(messages, tokenizer, options, max_chars)
    ids = await encode_text(tokenizer, text, "messages", 0 if keep else max_model_len, add_special_tokens)
    if not ids:
        raise BadRequest("the messages make an empty prompt", param="messages")
    return _keep_last(Prompt(ids, text), keep, tokenizer)


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
