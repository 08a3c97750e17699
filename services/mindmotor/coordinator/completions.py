"""POST /v1/completions: prompts (text, texts, token ids, lists of token ids) to choices."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from .completion_format import CompletionFormat
from .errors import BadRequest
from .planning import generate
from .prompts import completion_prompts
from .sampling import sampling_from_request
from .schemas import CompletionRequest
from .state import Coordinator, request_id


async def create_completion(c: Coordinator, body: CompletionRequest, request: Request) -> Response:
    model = c.catalog.resolve(body.model, c.router.choose_version)   # the version first: its tokenizer
    request.state.model = model.name
    if body.echo and body.logprobs is not None:
        raise BadRequest("echo together with logprobs is not supported", param="echo")
    prompts = completion_prompts(body.prompt, model.tokenizer)
    sampling = sampling_from_request(body, body.max_tokens, body.logprobs)
    echo_texts = None
    if body.echo:
        echo = [p.text if p.text is not None else model.tokenizer.decode(p.token_ids) for p in prompts]
        echo_texts = [text for text in echo for _ in range(body.n)]
    rid = request_id(request)
    fmt = CompletionFormat(f"cmpl-{rid}", int(time.time()), model.name, model.tokens,
                           body.logprobs, echo_texts, body.include_usage)
    return await generate(c, request, rid, model, prompts, sampling, body.n, body.priority, fmt,
                          body.stream, body.include_usage)
