"""`POST /invocations`, SageMaker's inference route, as vLLM serves it: the body's shape picks the
API — `messages` a chat completion, `prompt` a completion — with that API's fields, answers and
errors; a body with neither is a 400 naming both."""

from __future__ import annotations

from fastapi import APIRouter, Body, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from mindmotor.coordinator.http.errors import BadRequest, validation_error
from mindmotor.coordinator.http.ignored import note_ignored, unknown_fields
from mindmotor.coordinator.http.openapi import EVENT_STREAM, api_errors
from mindmotor.coordinator.openai.chat import create_chat_completion
from mindmotor.coordinator.openai.completions import create_completion
from mindmotor.coordinator.openai.schemas import ChatCompletionRequest, CompletionRequest
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()

_EITHER = {"anyOf": [{"$ref": "#/components/schemas/CompletionRequest"},
                     {"$ref": "#/components/schemas/ChatCompletionRequest"}]}
_ANSWER = {"anyOf": [{"$ref": "#/components/schemas/CompletionResponse"},
                     {"$ref": "#/components/schemas/ChatCompletionResponse"}]}


@router.post("/invocations", openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": _EITHER}}}},
             responses={200: {"description": "the completion or chat completion (an event stream with `stream`)",
                              "content": {"application/json": {"schema": _ANSWER},
                                          **EVENT_STREAM}},
                        **api_errors()})
async def invocations(request: Request, c: CoordinatorDep, body: dict = Body(...)):
    if "messages" in body:
        model, create = ChatCompletionRequest, create_chat_completion
    elif "prompt" in body:
        model, create = CompletionRequest, create_completion
    else:
        raise BadRequest("an invocation is a chat completion (with 'messages') or a completion (with 'prompt'); "
                         "this body has neither", param="messages")
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from None
    note_ignored(request, unknown_fields(parsed))
    return await create(c, parsed, request)
