"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}` with a status.

Raise an `APIError` subclass anywhere (route, middleware, generation); `install_handlers` makes
FastAPI answer it, its own validation errors (malformed JSON, bad types: 400) and anything
unexpected (500 with no internals) in that shape.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

log = logging.getLogger("mindmotor.coordinator")


class APIError(Exception):
    status = 500
    type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        message = _printable(message)     # may quote the client's text: lone surrogates are escaped
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()


def _printable(text: str) -> str:
    """`text` as valid UTF-8 (JSON bodies must encode): a lone surrogate becomes `\\ud800`."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class BadRequest(APIError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(APIError):
    status = 401
    type = "authentication_error"


class NotFound(APIError):
    status = 404
    type = "not_found_error"


class ModelNotFound(NotFound):
    """An unknown model: OpenAI's 404 (`invalid_request_error`, code `model_not_found`)."""
    type = "invalid_request_error"


class MethodNotAllowed(APIError):
    status = 405
    type = "invalid_request_error"


class PayloadTooLarge(APIError):
    status = 413
    type = "invalid_request_error"


class TooManyRequests(APIError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, retry_after_s: float, code: str):
        super().__init__(message, code=code, headers={"Retry-After": str(max(1, round(retry_after_s)))})
        self.retry_after_s = retry_after_s


class ServiceUnavailable(APIError):
    status = 503
    type = "service_unavailable"


class ClientGone(APIError):
    """The client closed the connection before the response (nginx's 499)."""
    status = 499
    type = "client_closed_request"


class InternalError(APIError):
    status = 500
    type = "internal_error"


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "dict", "list"}


def _param(loc: tuple) -> str | None:
    """`("body", "messages", 0, "content", "str")` -> "messages.0.content": the field, without the
    union member pydantic appends when no member of a union matched."""
    parts = []
    for p in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(p, str) and (p in _TYPE_TAGS or "[" in p or p[:1].isupper()):
            break
        parts.append(str(p))
    return ".".join(parts) or None


def validation_error(exc: RequestValidationError) -> BadRequest:
    errors = exc.errors()
    if not errors:
        return BadRequest("invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return BadRequest(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(": "),
                          code="invalid_json")
    param = _param(tuple(first.get("loc", ())))
    messages = dict.fromkeys(f"{_param(tuple(e.get('loc', ()))) or 'body'}: {e.get('msg')}" for e in errors)
    message = "; ".join(list(messages)[:5])
    return BadRequest(message, param=param, code="invalid_value")


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {404: NotFound, 405: MethodNotAllowed}.get(exc.status_code)
        if exc.status_code == 400:
            return error_response(BadRequest(str(exc.detail)))
        err = (kind or APIError)(str(exc.detail), headers=dict(exc.headers or {}))
        err.status = exc.status_code
        return error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error")
        return error_response(InternalError("internal error; see the coordinator's log"))
