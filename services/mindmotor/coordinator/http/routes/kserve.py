"""The KServe v2 / Triton inference protocol (`mindmotor.coordinator.kserve`): errors in Triton's
shape, `{"error": message}`, with the status the OpenAI API would give (400, 401, 404, 429, 503).

Health and server metadata are open like `/health`; the model routes take the API key like
`/v1/*` (middleware.py)."""

from __future__ import annotations

import functools
import json

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from mindmotor import __version__
from mindmotor.coordinator.http.errors import APIError, BadRequest, NotFound
from mindmotor.coordinator.kserve import llm_model
from mindmotor.coordinator.kserve.llm_model import VERSION
from mindmotor.coordinator.kserve.run import run
from mindmotor.coordinator.kserve.tensors import HEADER_LENGTH, TensorError, decode_request, encode_response
from mindmotor.coordinator.http.openapi import EVENT_STREAM, NO_BODY, STATUS_ONLY, TritonError, api_errors
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()
# the route's own errors are Triton's shape; the API key, rate limit and body limit answer OpenAI's
MODEL_ERRORS = {**api_errors(400, 404, 503, model=TritonError), **api_errors(401, 413, 429)}
EXTENSIONS = ["binary_tensor_data", "model_configuration", "generate", "parameters"]


def triton_errors(handler):
    @functools.wraps(handler)
    async def wrapped(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except APIError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)
        except TensorError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
    return wrapped


def _versioned(path: str) -> list[str]:
    """`/v2/models/{model}...` and `/v2/models/{model}/versions/{version}...` (only version 1 exists)."""
    return [path, path.replace("{model}", "{model}/versions/{version}", 1)]


def _check(c, model: str, version: str | None) -> None:
    if model not in c.catalog.names():
        raise NotFound(f"Request for unknown model: '{model}' is not found")
    if version not in (None, "", VERSION):
        raise NotFound(f"Request for unknown model: '{model}' version {version} is not found")


@router.get("/v2", responses={200: {"description": "the server's metadata (name, version, extensions)"}})
async def server_metadata():
    return JSONResponse({"name": "mindmotor", "version": __version__, "extensions": EXTENSIONS})


@router.api_route("/v2/health/live", methods=["GET", "HEAD"], response_class=Response, responses=STATUS_ONLY)
async def live():
    return Response(status_code=200)


@router.api_route("/v2/health/ready", methods=["GET", "HEAD"], response_class=Response,
                  responses={200: NO_BODY, 503: NO_BODY})
async def ready(c: CoordinatorDep):
    names = c.catalog.names()
    ok = c.started and bool(names) and all(c.table.has_routable(m) for m in names)
    return Response(status_code=200 if ok else 503)


@triton_errors
async def model_metadata(model: str, c: CoordinatorDep, version: str | None = None):
    _check(c, model, version)
    return JSONResponse(llm_model.metadata(model))


@triton_errors
async def model_ready(model: str, c: CoordinatorDep, version: str | None = None):
    _check(c, model, version)
    return Response(status_code=200 if c.table.has_routable(model) else 503)


@triton_errors
async def model_config(model: str, c: CoordinatorDep, version: str | None = None):
    _check(c, model, version)
    return JSONResponse(llm_model.config(model))


@triton_errors
async def infer(model: str, request: Request, c: CoordinatorDep, version: str | None = None):
    _check(c, model, version)
    infer_request = decode_request(await request.body(), request.headers.get(HEADER_LENGTH))
    call = llm_model.from_infer(infer_request)
    if call.stream:
        raise BadRequest("a stream needs the generate_stream endpoint (HTTP infer answers once)",
                         param="stream")
    fmt, _, values = await run(c, request, model, call)
    body, headers = encode_response(model, VERSION, infer_request, fmt.tensors(values))
    return Response(body, headers=headers)


@router.post("/v2/models/{model}/generate", responses=MODEL_ERRORS)
@triton_errors
async def generate(model: str, request: Request, c: CoordinatorDep):
    _check(c, model, None)
    call = llm_model.from_generate(await _json(request))
    if call.stream:
        raise BadRequest("a stream needs the generate_stream endpoint", param="stream")
    fmt, _, values = await run(c, request, model, call)
    return JSONResponse(fmt.generate_body(values))


@router.post("/v2/models/{model}/generate_stream", responses={
    200: {"description": "server-sent events", "content": {**EVENT_STREAM}},
    **MODEL_ERRORS})
@triton_errors
async def generate_stream(model: str, request: Request, c: CoordinatorDep):
    _check(c, model, None)
    doc = await _json(request)
    if isinstance(doc, dict):
        doc = {**doc, "stream": True}
    _, response, _ = await run(c, request, model, llm_model.from_generate(doc))
    return response


_RESPONSES = {model_metadata: MODEL_ERRORS, model_config: MODEL_ERRORS,
              model_ready: {200: NO_BODY, 503: NO_BODY, **api_errors(401, 429), 404: MODEL_ERRORS[404]},
              infer: {200: {"description": "the inference response: JSON, or JSON and binary tensor data",
                            "content": {"application/octet-stream": {"schema": {"type": "string"}}}}, **MODEL_ERRORS}}


for _path, _handler, _method in (("/v2/models/{model}", model_metadata, "GET"),
                                 ("/v2/models/{model}/ready", model_ready, "GET"),
                                 ("/v2/models/{model}/config", model_config, "GET"),
                                 ("/v2/models/{model}/infer", infer, "POST")):
    for _each in _versioned(_path):
        router.add_api_route(_each, _handler, methods=[_method], responses=_RESPONSES[_handler],
                             response_class=Response if _handler is model_ready else JSONResponse)


async def _json(request: Request):
    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
