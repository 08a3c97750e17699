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
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()
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


@router.get("/v2")
async def server_metadata():
    return JSONResponse({"name": "mindmotor", "version": __version__, "extensions": EXTENSIONS})


@router.get("/v2/health/live")
async def live():
    return Response(status_code=200)


@router.get("/v2/health/ready")
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


@router.post("/v2/models/{model}/generate")
@triton_errors
async def generate(model: str, request: Request, c: CoordinatorDep):
    _check(c, model, None)
    call = llm_model.from_generate(await _json(request))
    if call.stream:
        raise BadRequest("a stream needs the generate_stream endpoint", param="stream")
    fmt, _, values = await run(c, request, model, call)
    return JSONResponse(fmt.generate_body(values))


@router.post("/v2/models/{model}/generate_stream")
@triton_errors
async def generate_stream(model: str, request: Request, c: CoordinatorDep):
    _check(c, model, None)
    doc = await _json(request)
    if isinstance(doc, dict):
        doc = {**doc, "stream": True}
    _, response, _ = await run(c, request, model, llm_model.from_generate(doc))
    return response


for _path, _handler, _method in (("/v2/models/{model}", model_metadata, "GET"),
                                 ("/v2/models/{model}/ready", model_ready, "GET"),
                                 ("/v2/models/{model}/config", model_config, "GET"),
                                 ("/v2/models/{model}/infer", infer, "POST")):
    for _each in _versioned(_path):
        router.add_api_route(_each, _handler, methods=[_method])


async def _json(request: Request):
    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
