"""`create_app(settings)`: the coordinator's FastAPI app — its parts built, its middleware stacked,
its routes mounted. Starting the app (lifespan) reads the local checkpoint directories (in a
thread), starts the instance source (reads every static worker once, then keeps polling; or
waits for the controller's first table) and model discovery, and waits (bounded) for the models
the first table holds to be discovered; stopping it closes the worker channels and the rate
limit store."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from mindmotor.common.http_limits import resolve_protocol
from mindmotor.common.tracing import Tracing
from mindmotor.coordinator.dispatch.admission import Admission
from mindmotor.coordinator.http.auth import APIKeys
from mindmotor.coordinator.dispatch.channels import WorkerChannels
from mindmotor.coordinator.config import CoordinatorSettings
from mindmotor.coordinator.catalog.adapters import AdapterDirectory
from mindmotor.coordinator.catalog.discovery import ModelDiscovery
from mindmotor.coordinator.http.errors import install_handlers
from mindmotor.coordinator.routing.table import RoutingTable
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.http.middleware import FrontDoor
from mindmotor.coordinator.catalog.models import ModelCatalog
from mindmotor.coordinator.dispatch.progress import ProgressGuard
from mindmotor.coordinator.http.rate_limit import MemoryRateLimiter, RateLimiter
from mindmotor.coordinator.dispatch.resume import new_key
from mindmotor.coordinator.openai.responses.store import StoreLimits, make_store
from mindmotor.coordinator.routing.router import Router
from mindmotor.coordinator.http.openapi import install_openapi
from mindmotor.coordinator.http.routes import api_routes
from mindmotor.coordinator.http.routes.docs import mount_assets
from mindmotor.coordinator.openai.responses.request import ResponsesRequest
from mindmotor.coordinator.routing.policies import make_policy
from mindmotor.coordinator.state import Coordinator
from mindmotor.coordinator.routing.static_source import StaticWorkerSource
from mindmotor.coordinator.http.loop_lag import LoopLagMonitor
from mindmotor.sandbox.pool import HelperMetrics, HelperPool
from mindmotor.sandbox.spec_check import SpecChecker

log = logging.getLogger("mindmotor.coordinator")


def make_rate_limiter(settings: CoordinatorSettings, metrics: CoordinatorMetrics | None = None
                      ) -> RateLimiter | None:
    if settings.rate_limit_rpm <= 0:
        return None
    if settings.redis_url:
        from mindmotor.coordinator.http.rate_limit_redis import RedisRateLimiter

        on_fail_open = (lambda reason: metrics.rate_limit_fail_open.labels(reason).inc()) if metrics else None
        return RedisRateLimiter(settings.redis_url, settings.rate_limit_rpm, settings.rate_limit_burst,
                                settings.redis_prefix, timeout_s=settings.rate_limit_redis_timeout_s,
                                open_s=settings.rate_limit_redis_skip_s, on_fail_open=on_fail_open)
    return MemoryRateLimiter(settings.rate_limit_rpm, settings.rate_limit_burst)


def build_coordinator(settings: CoordinatorSettings) -> Coordinator:
    metrics = CoordinatorMetrics()
    table = RoutingTable(suspect_s=settings.suspect_s)
    router = Router(table, lambda model: make_policy(settings.policy_for(model), settings), settings.traffic)
    channels = WorkerChannels()
    return Coordinator(
        settings=settings, table=table, router=router, channels=channels,
        catalog=ModelCatalog(settings, table),
        admission=Admission(settings.max_requests, settings.retry_after_s, metrics,
                                                         settings.slo_classes, settings.admission_wait_s), metrics=metrics,
        keys=APIKeys(settings.api_keys, settings.api_key_file,
                     on_reload=lambda outcome: metrics.api_key_reloads.labels(outcome).inc()),
        limiter=make_rate_limiter(settings, metrics),
        specs=SpecChecker(HelperPool("specs", settings.spec_helpers, settings.spec_timeout_s, settings.spec_wait_s,
                                     HelperMetrics(metrics.registry))),
        guard=ProgressGuard(table, metrics, settings.stream_progress_timeout_s, settings.failed_instance_silence_s,
                            settings.stream_first_message_timeout_s),
        resume_key=hashlib.sha256(settings.resume_key.encode()).digest() if settings.resume_key else new_key(),
        responses=make_store(settings.responses_store_path,
                             StoreLimits(settings.responses_ttl_s, settings.responses_max, settings.responses_max_bytes)),
        adapters=AdapterDirectory(table, channels, settings.lora_poll_interval_s),
        tracing=Tracing("mindmotor-coordinator", settings.otlp_traces_endpoint))


def make_source(settings: CoordinatorSettings, c: Coordinator):
    """Where the instances come from: the controller(s) when given, else the static workers."""
    if settings.controllers:
        from mindmotor.coordinator.routing.controller_source import ControllerSource

        return ControllerSource(settings.controllers, c.table, reporter=settings.coordinator_id,
                                on_traffic=c.router.set_table_traffic)
    return StaticWorkerSource(settings.workers, c.table, c.channels, settings.status_interval_s,
                              settings.status_timeout_s)


def create_app(settings: CoordinatorSettings, coordinator: Coordinator | None = None) -> FastAPI:
    c = coordinator or build_coordinator(settings)
    source = make_source(settings, c)
    discovery = ModelDiscovery(c.table, c.catalog, c.channels, c.metrics, settings)
    lag = LoopLagMonitor(c.metrics.loop_lag, settings.loop_lag_interval_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        lag.start()
        await asyncio.to_thread(c.catalog.load_local)
        await source.start()
        await discovery.start()
        await discovery.settle(settings.discovery_timeout_s)
        if c.adapters is not None:
            c.catalog.adapters = c.router.adapter_affinity.directory = c.adapters
            await c.adapters.start()
        c.started = True
        log.info("coordinator started", extra={
            "instances": len(c.table.all()), "models": c.catalog.names(), "policy": settings.policy,
            "auth": c.keys.enabled, "rate_limit_rpm": settings.rate_limit_rpm, "scheme": settings.scheme,
            "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            "http": resolve_protocol(settings.http_protocol), "access_log": settings.access_log})
        try:
            yield
        finally:
            await source.stop()
            await discovery.stop()
            if c.adapters is not None:
                await c.adapters.stop()
            await c.channels.close()
            await c.specs.pool.close()
            await lag.stop()
            if c.limiter is not None:
                await c.limiter.close()
            await asyncio.to_thread(c.tracing.shutdown)

    app = FastAPI(title="MindMotor Coordinator", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.coordinator = c
    install_handlers(app)
    app.router.routes.extend(api_routes())      # not include_router: see api_routes
    mount_assets(app)
    install_openapi(app, {"ResponsesRequest": ResponsesRequest})
    # one pure-ASGI layer: request id, API key and rate limit, body limit, headers, metrics, access log
    app.add_middleware(FrontDoor, metrics=c.metrics, keys=c.keys, limiter=c.limiter,
                       max_body_bytes=settings.max_body_bytes, in_flight=c.in_flight,
                       access_log=settings.access_log, access_log_sample=settings.access_log_sample)
    if settings.cors_allowed_origins:       # outermost: a preflight is answered before auth
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_allowed_origins,
                           allow_methods=settings.cors_allowed_methods, allow_headers=settings.cors_allowed_headers,
                           allow_credentials=settings.cors_allow_credentials)
    return app
