"""POST /v1/chat/completions: messages through the model's chat template to choices."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from starlette.requests import Request
from starlette.responses import Response

from mindmotor.coordinator.openai.chat_format import ChatFormat
from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.dispatch.planning import check_n, generate
from mindmotor.coordinator.dispatch.respond import OutputFormat
from mindmotor.coordinator.http.ignored import note_ignored
from mindmotor.coordinator.openai.prompts import TemplateOptions, chat_prompt, truncation
from mindmotor.coordinator.openai.running_usage import RunningUsage
from mindmotor.coordinator.openai.sampling import sampling_from_request
from mindmotor.coordinator.openai.schemas import ChatCompletionRequest
from mindmotor.coordinator.state import Coordinator, request_id
from mindmotor.coordinator.openai.tools import tool_plan


async def create_chat_completion(c: Coordinator, body: ChatCompletionRequest, request: Request,
                                 wrap: Callable[[ChatFormat], OutputFormat] | None = None) -> Response:
    """With `wrap`, the chat format is wrapped by another API's (the Responses API's)."""
    model = c.catalog.resolve(body.model, c.router.choose_version)   # the version first: its tokenizer
    request.state.model = model.name
    if body.top_logprobs and not body.logprobs:
        raise BadRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    if body.prompt_logprobs is not None and body.stream:
        raise BadRequest("prompt_logprobs are not available when stream is true", param="prompt_logprobs")
    check_n(c, 1, body.n)                     # before anything per choice
    tools = tool_plan(body, c.settings.max_tools)
    options = TemplateOptions.of(body, tools.tools)
    note_ignored(request, options.unused(model.tokenizer))
    prompt = await chat_prompt(body.messages, model.tokenizer, options, c.settings.max_prompt_chars,
                               model.max_model_len, body.add_special_tokens,
                               truncation(body.truncate_prompt_tokens, model.max_model_len))
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    sampling = sampling_from_request(body, body.max_new_tokens, logprobs, body.prompt_logprobs)
    forced = tools.constraint()
    if forced is not None:
        if sampling.structured is not None:
            raise BadRequest("a forced tool call (tool_choice required or named) cannot be combined with "
                             "another structured output", param="tool_choice")
        sampling = dataclasses.replace(sampling, structured=forced)
    rid = request_id(request)
    fmt = ChatFormat(f"chatcmpl-{rid}", int(time.time()), model.lora or model.name, model.tokens,
                     body.logprobs, body.top_logprobs or 0, body.include_usage,
                     prompt_logprobs=body.prompt_logprobs, as_ids=body.return_tokens_as_token_ids,
                     prompt_token_ids=list(prompt.token_ids), tools=tools,
                     running=RunningUsage([len(prompt.token_ids)] * body.n) if body.continuous_usage else None,
                     role=body.reply_role, echo=_echo(body), return_token_ids=body.return_token_ids)
    return await generate(c, request, rid, model, [prompt], sampling, body.n, body.priority,
                          wrap(fmt) if wrap is not None else fmt, body.stream, body.include_usage)


def _echo(body: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's content, when its role is the reply's (the message the
    reply continues), first in the reply."""
    last = body.messages[-1]
    return last.text() if body.echo and last.role == body.reply_role else ""
