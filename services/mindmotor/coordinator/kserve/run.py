"""Run a `GenerateCall`: the model resolved (a version chosen as for `/v1/completions`), the
prompts tokenized off the event loop, then the shared generation path (admission, routing,
retries, failover) with the Triton output format."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mindmotor.coordinator.dispatch.planning import generate
from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.kserve.llm_model import GenerateCall
from mindmotor.coordinator.kserve.output import KServeFormat
from mindmotor.coordinator.openai.prompts import completion_prompts
from mindmotor.coordinator.openai.sampling import sampling_from_request
from mindmotor.coordinator.state import Coordinator, request_id


async def run(c: Coordinator, request: Request, model_name: str, call: GenerateCall
              ) -> tuple[KServeFormat, Response, dict | None]:
    """The format, the response, and (when not streamed) the output values by output name."""
    model = c.catalog.resolve(model_name, c.router.choose_version)
    request.state.model = model.name
    body = call.completion_request(model.name)
    if body.max_tokens == 0:
        raise BadRequest("max_tokens must be at least 1", param="max_tokens")
    prompts = await completion_prompts(body.prompt, model.tokenizer, model.max_model_len)
    sampling = sampling_from_request(body, body.max_tokens, None)
    fmt = KServeFormat(model.name, call, [len(p.token_ids) for p in prompts])
    response = await generate(c, request, request_id(request), model, prompts, sampling, 1, body.priority, fmt,
                              call.stream, False)
    values = json.loads(response.body) if isinstance(response, JSONResponse) else None
    return fmt, response, values
