"""The controller's HTTP admin API (FastAPI): the registry, commands, health and metrics.

    GET    /health                        open: {"status", "is_leader", "controller_id", "store", ...}
    GET    /metrics                       open: Prometheus text
    GET    /v1/instances                  the registry: {"object": "list", "version", "data": [...]}
    GET    /v1/instances/{id}
    POST   /v1/instances/{id}/drain       {"reason"?}   — draining now; the worker is told
    POST   /v1/instances/{id}/role        {"role"}      — the worker is told; the role changes when
                                                          its heartbeat reports it
    DELETE /v1/instances/{id}             deregister

Everything but /health and /metrics needs `Authorization: Bearer <admin token>` when a token is
configured (the controller refuses to start without one when the admin API binds beyond loopback) (a Prometheus scraping the controller should not hold a token that can drain workers;
the metrics are read-only, like every other service's);
errors use the OpenAI error body `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import hmac
import time
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from mindmotor.common.redact import redact
from mindmotor.common.store import StoreUnavailable

from .config import ControllerConfig
from mindmotor.common.leader import LeaderElector
from .metrics import ControllerMetrics
from .registry import Registry


class AdminError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class DrainBody(BaseModel):
    reason: str = ""


class RoleBody(BaseModel):
    role: str


def create_admin_app(config: ControllerConfig, registry: Registry, elector: LeaderElector,
                     metrics: ControllerMetrics) -> FastAPI:
    app = FastAPI(title="MindMotor Controller admin", docs_url=None, redoc_url=None, openapi_url=None)
    token = config.admin_token

    def require_token(request: Request) -> None:
        if not token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise AdminError(401, "Invalid or missing admin token (Authorization: Bearer <token>).",
                             code="invalid_api_key")

    api = APIRouter(dependencies=[Depends(require_token)])

    @app.exception_handler(AdminError)
    async def _admin_error(request: Request, exc: AdminError):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(error_body(exc.message, exc.type, exc.code, exc.param), exc.status, headers=headers)

    @app.exception_handler(StoreUnavailable)
    async def _store_error(request: Request, exc: StoreUnavailable):
        return JSONResponse(error_body(redact(f"store unavailable: {exc}"), "server_error", "store_unavailable"), 503)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(error_body(first.get("msg", "invalid request"), "invalid_request_error",
                                       param=param), 400)

    async def found(instance_id: str):
        record = await registry.get(instance_id)
        if record is None:
            raise AdminError(404, f"instance {instance_id!r} not found", code="instance_not_found")
        return record

    @app.get("/health")
    async def health():
        return {"status": "ok", "is_leader": elector.is_leader, "controller_id": config.controller_id,
                "store": config.store_kind, "leader_since": elector.leader_since or None}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @api.get("/v1/instances")
    async def list_instances():
        now = time.time()
        records = await registry.list()
        return {"object": "list", "version": await registry.version(), "controller_id": config.controller_id,
                "is_leader": elector.is_leader, "data": [r.to_admin_json(now) for r in records]}

    @api.get("/v1/instances/{instance_id}")
    async def get_instance(instance_id: str):
        return (await found(instance_id)).to_admin_json(time.time())

    @api.post("/v1/instances/{instance_id}/drain")
    async def drain(instance_id: str, body: DrainBody | None = None):
        await found(instance_id)
        record = await registry.command_drain(instance_id, (body or DrainBody()).reason)
        if record is None:
            raise AdminError(404, f"instance {instance_id!r} not found", code="instance_not_found")
        return record.to_admin_json(time.time())

    @api.post("/v1/instances/{instance_id}/role")
    async def set_role(instance_id: str, body: RoleBody):
        await found(instance_id)
        try:
            record = await registry.command_set_role(instance_id, body.role)
        except ValueError as exc:
            raise AdminError(400, str(exc), param="role") from exc
        if record is None:
            raise AdminError(404, f"instance {instance_id!r} not found", code="instance_not_found")
        return record.to_admin_json(time.time())

    @api.delete("/v1/instances/{instance_id}")
    async def deregister(instance_id: str):
        if not await registry.remove(instance_id):
            raise AdminError(404, f"instance {instance_id!r} not found", code="instance_not_found")
        return {"id": instance_id, "object": "instance", "deleted": True}

    app.include_router(api)
    return app
