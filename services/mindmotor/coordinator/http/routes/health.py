from __future__ import annotations

import os

from fastapi import APIRouter
from starlette.responses import JSONResponse, PlainTextResponse, Response

from mindmotor import __version__

from mindmotor.coordinator.http.openapi import STATUS_ONLY, HealthBody, ReadyBody, VersionBody
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()


def _instances(c) -> dict:
    return {v.instance_id: {"model": v.model, "healthy": v.healthy, "routable": c.table.is_routable(v),
                            "deployment": v.deployment, "version": v.version}
            for v in c.table.all()}


def _traffic(c) -> dict:
    """model -> version -> weight, for the models whose requests are split between versions."""
    return {name: weights for name in c.catalog.names() if (weights := c.router.traffic(name))}


@router.api_route("/health", methods=["GET", "HEAD"], responses={200: {"model": HealthBody},
                  503: {"model": HealthBody, "description": "no instance can take requests"}})
async def health(c: CoordinatorDep):
    """200 when at least one instance can take requests, else 503."""
    ok = c.table.has_routable()
    return JSONResponse({"status": "ok" if ok else "no_healthy_instance", "instances": _instances(c),
                         "traffic": _traffic(c), "spec_helpers": c.specs.pool.live,
                         "replica": {"pid": os.getpid(), "requests_in_flight": c.in_flight.requests,
                                     "streams_in_flight": c.in_flight.streams}},
                        status_code=200 if ok else 503)


@router.api_route("/ready", methods=["GET", "HEAD"], responses={200: {"model": ReadyBody},
                  503: {"model": ReadyBody, "description": "not started, or a model without an instance"}})
async def ready(c: CoordinatorDep):
    """200 once started and every served model has a routable instance."""
    names = c.catalog.names()
    missing = [m for m in names if not c.table.has_routable(m)]
    ok = c.started and bool(names) and not missing
    return JSONResponse({"ready": ok, "models": names, "models_without_instance": missing},
                        status_code=200 if ok else 503)


@router.api_route("/ping", methods=["GET", "HEAD"], response_class=Response, responses=STATUS_ONLY)
async def ping():
    """vLLM's liveness probe: 200 while the process serves HTTP."""
    return Response(status_code=200)


@router.post("/ping", response_class=Response, responses=STATUS_ONLY)
async def ping_post():
    return Response(status_code=200)


@router.get("/version", responses={200: {"model": VersionBody}})
async def version():
    return JSONResponse({"version": __version__})


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"description": "Prometheus text exposition format 0.0.4"}})
async def metrics(c: CoordinatorDep):
    for name in c.catalog.names():
        c.metrics.instances.labels(name).set(sum(1 for v in c.table.candidates(name)))
    c.metrics.refresh_engines(c.table.models())
    return Response(c.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
