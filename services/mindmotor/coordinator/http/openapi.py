"""The OpenAPI document (`/openapi.json`) as the server answers, not as FastAPI assumes: every
error is a 400 (never FastAPI's 422) or another status in OpenAI's error shape; each route
declares the statuses it can answer and the schema of each body; `/ping` has no body and
`/metrics` is Prometheus text. schemathesis checks the document against the running server
(tests/coordinator/test_openapi.py).

The response models here are documentation only — the routes build plain dicts (see
`openai/*_format.py`) and nothing is validated against them at run time — so they are open
(`extra="allow"`): a field added to a response does not break a client generated from them."""

from __future__ import annotations

import warnings
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict

from mindmotor import __version__


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorInfo(_Open):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(_Open):
    """OpenAI's error shape, for every error of the OpenAI and vLLM routes."""
    error: ErrorInfo


class TritonError(_Open):
    """Triton's error shape, for the errors of the KServe v2 routes themselves."""
    error: str


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, Any] | None = None


class CompletionChoice(_Open):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    prompt_token_ids: list[int] | None = None      # return_token_ids
    token_ids: list[int] | None = None             # return_token_ids


class CompletionResponse(_Open):
    """`/v1/completions` without `stream` (with it: `text/event-stream` of chunks of this shape)."""
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ToolCallOut(_Open):
    id: str
    type: str
    function: dict[str, Any]


class ChatMessageOut(_Open):
    role: str
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Open):
    index: int
    message: ChatMessageOut
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None             # return_token_ids


class ChatCompletionResponse(_Open):
    """`/v1/chat/completions` without `stream` (with it: `text/event-stream` of chunks)."""
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    prompt_token_ids: list[int] | None = None      # return_token_ids


class ModelCard(_Open):
    id: str
    object: str
    created: int
    owned_by: str
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(_Open):
    object: str
    data: list[ModelCard]


class TokenizeResponse(_Open):
    count: int
    max_model_len: int | None = None
    tokens: list[int]
    token_strs: list[str | None] | None = None


class DetokenizeResponse(_Open):
    prompt: str


class ResponseObject(_Open):
    """A Responses API response (OpenAI's `Response`)."""
    id: str
    object: str
    status: str | None = None
    output: list[dict[str, Any]] | None = None


class DeletedResponse(_Open):
    id: str
    object: str
    deleted: bool


class ItemList(_Open):
    object: str
    data: list[dict[str, Any]]


class HealthBody(_Open):
    status: str
    instances: dict[str, Any]


class ReadyBody(_Open):
    ready: bool
    models: list[str]
    models_without_instance: list[str]


class VersionBody(_Open):
    version: str


def _error(description: str, model: type[BaseModel] = ErrorResponse) -> dict:
    return {"model": model, "description": description}


ERROR_DESCRIPTIONS = {
    400: "invalid request: a field named in `error.param`",
    401: "missing or wrong API key (when keys are configured)",
    403: "an admin route on a coordinator without an admin token",
    404: "unknown model, route or stored response",
    413: "request body over the size limit",
    429: "rate limit or admission queue full (Retry-After)",
    503: "no instance can serve the model now",
}


API_ERRORS = (400, 401, 404, 413, 429, 503)       # what any API route may answer


def api_errors(*statuses: int, model: type[BaseModel] = ErrorResponse) -> dict[int, dict]:
    """The `responses` of a route: its error statuses (default: `API_ERRORS`), in OpenAI's shape (or
    `model`'s)."""
    return {s: _error(ERROR_DESCRIPTIONS[s], model) for s in statuses or API_ERRORS}


# one server-sent event: `data` JSON text (or `[DONE]`), `event` its type where the API names them
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"}}}
EVENT_STREAM = {"text/event-stream": {"schema": SSE_EVENT}}


def generation(model: type[BaseModel]) -> dict[int | str, dict]:
    """A generation route's responses: 200 JSON (`model`), or an event stream with `stream: true`."""
    return {200: {"model": model, "description": "the result; with `stream: true`, server-sent events",
                  "content": EVENT_STREAM}, **api_errors()}


NO_BODY = {"description": "no body", "content": {}}
STATUS_ONLY = {200: NO_BODY}


def install_openapi(app: FastAPI, extra_schemas: dict[str, type[BaseModel]] | None = None) -> None:
    """`app.openapi()` builds the document once: FastAPI's, without the 422 it adds to every route
    with a body (this server answers 400) and its unused validation-error schemas, with
    `extra_schemas` (bodies a route reads itself, referenced by its `openapi_extra`)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            with warnings.catch_warnings():      # GET and HEAD of one route share an operation id: made unique below
                warnings.simplefilter("ignore", UserWarning)
                doc = get_openapi(title=app.title, version=__version__, description=app.description, routes=app.routes)
            seen: set[str] = set()
            for operations in doc.get("paths", {}).values():
                for method, operation in operations.items():
                    operation.get("responses", {}).pop("422", None)
                    for response in operation.get("responses", {}).values():
                        if response.get("content") == {}:
                            del response["content"]          # a status without a body
                    if operation.get("operationId") in seen:
                        operation["operationId"] = f"{operation['operationId']}_{method}"
                    seen.add(operation.get("operationId"))
            schemas = doc.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            for name, model in (extra_schemas or {}).items():
                schemas[name] = model.model_json_schema(ref_template="#/components/schemas/{model}")
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
