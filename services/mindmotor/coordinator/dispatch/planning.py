"""From a validated request to running generations: the choices limit (400 when prompts × n
could never be admitted) and the context check per prompt (400), the structured-output spec
checked by a helper process (400 when it is bad, too large or crashes the compiler; 429 when no
helper is free), an instance must exist (503), admission (429: full for now), then one
`Generation` per choice — choice j of a prompt gets seed + j when a seed is given."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from mindmotor.rules.request_rules import InvalidRequest, check_choices

from mindmotor.coordinator.dispatch.fanout import ChoiceSet
from mindmotor.coordinator.dispatch.generation import Generation, GenerationRequest
from mindmotor.coordinator.metrics import ChoiceTimer
from mindmotor.coordinator.catalog.models import ServedModel
from mindmotor.coordinator.openai.prompts import Prompt, bad_request, resolve_max_tokens
from mindmotor.coordinator.dispatch.respond import OutputFormat, respond
from mindmotor.coordinator.routing.router import NoInstanceAvailable
from mindmotor.coordinator.openai.sampling import SamplingOptions
from mindmotor.coordinator.dispatch.resume import HEADER as RESUME_HEADER, stream_marker
from mindmotor.coordinator.state import Coordinator
from mindmotor.coordinator.http.errors import BadRequest, TooManyRequests
from mindmotor.coordinator.slo_classes import HEADER as CLASS_HEADER, ClassError, resolve

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
from mindmotor.sandbox.spec_check import SpecsBusy


def check_n(c: Coordinator, num_prompts: int, n: int) -> None:
    """400 for more choices than allowed — before anything is made per choice."""
    try:
        check_choices(num_prompts, n, c.settings.max_n, c.settings.max_requests)
    except InvalidRequest as exc:
        raise bad_request(exc) from None


async def generate(c: Coordinator, request: Request, request_id: str, model: ServedModel, prompts: list[Prompt],
                   sampling: SamplingOptions, n: int, priority: int, fmt: OutputFormat, stream: bool,
                   include_usage: bool) -> Response:
    arrival = time.perf_counter()
    check_n(c, len(prompts), n)
    slo_class, priority = request_class(c, request, priority)
    max_new = [resolve_max_tokens(len(p.token_ids), sampling.max_tokens, model.max_model_len, sampling.min_tokens)
               for p in prompts]
    await check_structured(c, sampling)
    if not c.table.has_routable(model.name):
        raise NoInstanceAvailable(model.name)
    generations, prompt_indices = [], []
    trace_parent = c.tracing.extract(request.headers) if c.tracing.enabled else None
    for p_index, prompt in enumerate(prompts):
        c.metrics.prompt_tokens.labels(model.name).inc(len(prompt.token_ids))
        for j in range(n):
            index = len(generations)
            req = GenerationRequest(request_id=f"{request_id}-{index}", model=model.name,
                                    prompt_token_ids=prompt.token_ids, sampling=sampling.for_choice(j),
                                    max_new_tokens=max_new[p_index], priority=priority, versions=model.versions,
                                    lora=model.lora)
            generations.append(Generation(req, c.router, c.channels, c.metrics,
                                          ChoiceTimer(c.metrics, model.name, arrival, slo_class,
                                                      c.settings.slo_classes[slo_class]), c.settings.max_retry,
                                          c.settings.prefill_timeout_s, retry_after_s=c.settings.retry_after_s,
                                          guard=c.guard))
            generations[-1].unary = not stream       # read whole: one unary worker call per attempt
            if c.tracing.enabled:
                generations[-1].tracing, generations[-1].trace_parent = c.tracing, trace_parent
            prompt_indices.append(p_index)
    marker = None
    if stream:
        marker = await stream_marker(request.headers.get(RESUME_HEADER), generations, fmt, c.resume_key, c.table,
                                     c.channels, c.metrics)
    running = [i for i in range(len(generations)) if not (marker and marker.resumed and marker.marks.choices[i].finished)]
    ticket = await c.admission.acquire(model.name, len(running), slo_class, getattr(request.state, "caller", "") or "")
    return await respond(request, ChoiceSet([generations[i] for i in running], running), prompt_indices, fmt, stream,
                         include_usage, ticket, c.metrics, model.name, c.in_flight, marker, lora=model.lora)


def request_class(c: Coordinator, request: Request, priority: int) -> tuple[str, int]:
    """The request's SLO class (its API key's, or X-MindMotor-Class: slo_classes.py) and the engine
    priority it runs at: the class's plus the request's own (vLLM's `priority`, default 0)."""
    s = c.settings
    try:
        name = resolve(s.slo_classes, s.default_class, s.class_by_key, getattr(request.state, "caller", None),
                       request.headers.get(CLASS_HEADER))
    except ClassError as exc:
        raise BadRequest(str(exc), code="invalid_class", param="X-MindMotor-Class") from None
    return name, max(INT32_MIN, min(INT32_MAX, priority + s.slo_classes[name].priority))


async def check_structured(c: Coordinator, sampling: SamplingOptions) -> None:
    """The request's structured-output spec, checked by a helper process (its field in the 400)."""
    try:
        await c.specs.check(sampling.structured)
    except InvalidRequest as exc:
        raise bad_request(exc) from None
    except SpecsBusy as exc:
        c.metrics.rejected.labels("structured_outputs_busy").inc()
        raise TooManyRequests(f"the structured-output compilers are busy ({exc}); retry later",
                              retry_after_s=c.settings.retry_after_s, code="structured_outputs_busy") from None
