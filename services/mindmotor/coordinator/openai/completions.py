"""POST /v1/completions: prompts (text, texts, token ids, lists of token ids) to choices."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from mindmotor.coordinator.openai.completion_format import CompletionFormat, EchoOptions
from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.dispatch.planning import check_n, generate
from mindmotor.coordinator.openai.prompts import completion_prompts, truncation
from mindmotor.coordinator.openai.running_usage import RunningUsage
from mindmotor.coordinator.openai.sampling import sampling_from_request
from mindmotor.coordinator.openai.schemas import CompletionRequest
from mindmotor.coordinator.state import Coordinator, request_id


async def create_completion(c: Coordinator, body: CompletionRequest, request: Request) -> Response:
    model = c.catalog.resolve(body.model, c.router.choose_version)   # the version first: its tokenizer
    request.state.model = model.name
    if body.max_tokens == 0 and not body.echo:
        raise BadRequest("max_tokens 0 is only allowed with echo (to score the prompt)", param="max_tokens")
    if body.max_tokens == 0 and body.min_tokens:
        raise BadRequest("min_tokens must be 0 when max_tokens is 0", param="min_tokens")
    keep = truncation(body.truncate_prompt_tokens, model.max_model_len)
    prompts = await completion_prompts(body.prompt, model.tokenizer, model.max_model_len, body.add_special_tokens, keep)
    check_n(c, len(prompts), body.n)          # before the per-choice lists below
    prompt_lp = body.prompt_logprobs
    if body.echo and body.logprobs is not None:        # the echoed prompt's logprobs come from the prefill
        prompt_lp = max(prompt_lp or 0, body.logprobs)
    max_tokens = 1 if body.max_tokens == 0 else body.max_tokens
    sampling = sampling_from_request(body, max_tokens, body.logprobs, prompt_lp)
    prompt_ids = [list(p.token_ids) for p in prompts for _ in range(body.n)]
    echo = None
    if body.echo:
        texts = [p.text if p.text is not None else model.tokenizer.decode(p.token_ids) for p in prompts]
        echo = EchoOptions(texts=[t for t in texts for _ in range(body.n)], token_ids=prompt_ids,
                           score_only=body.max_tokens == 0)
    rid = request_id(request)
    fmt = CompletionFormat(f"cmpl-{rid}", int(time.time()), model.lora or model.name, model.tokens, body.logprobs, echo,
                           body.include_usage, prompt_logprobs=body.prompt_logprobs,
                           as_ids=body.return_tokens_as_token_ids, prompt_ids=prompt_ids,
                           return_token_ids=body.return_token_ids,
                           running=RunningUsage([len(p) for p in prompt_ids]) if body.continuous_usage else None)
    return await generate(c, request, rid, model, prompts, sampling, body.n, body.priority, fmt,
                          body.stream, body.include_usage)
