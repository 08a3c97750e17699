"""Run one deployer: the store, the backend, the link to the controller, the reconcile loop, the
gRPC server (Deployer + health, behind the admin token) and /metrics.

Lifecycle: open the store (a Redis that does not answer fails the start) → watch the controller →
first reconcile pass (a restarted deployer brings every stored deployment back here) → serve
(ready line on stdout) → SIGTERM or SIGINT → health NOT_SERVING, stop taking calls, stop the loop,
then the backend: local replicas drain (SIGTERM) in parallel, Kubernetes pods stay. The desired
state stays in the store.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from mindmotor.common.admin_token import AdminTokenInterceptor
from mindmotor.common.store import RedisStore, Store, open_store
from mindmotor.protocol import deployer_pb2, deployer_pb2_grpc

from .backends import Backend, make_backend
from .backoff import RestartBackoff
from .config import DeployerConfig, ready_line
from .controller_link import ControllerLink
from .metrics import DeployerMetrics
from .operations import Deployments
from .reconcile import Reconciler
from .service import DeployerService
from .store import DeploymentStore

log = logging.getLogger("mindmotor.deployer")

DEPLOYER_SERVICE_NAME = deployer_pb2.DESCRIPTOR.services_by_name["Deployer"].full_name
STOP_GRACE_S = 1.0


class DeployerServer:
    """Everything one deployer runs, startable and stoppable in any event loop."""

    def __init__(self, config: DeployerConfig, store: Store | None = None, backend: Backend | None = None):
        self.config = config
        self.store = store or open_store(config.redis_url, config.store_prefix)
        self.metrics = DeployerMetrics()
        self.backend = backend or make_backend(config)
        self.controller = ControllerLink(config.controllers, config.traffic_token, on_change=self._table_changed)
        self.reconciler = Reconciler(DeploymentStore(self.store), self.backend, self.controller, self.metrics,
                                     config.reconcile_interval_s,
                                     RestartBackoff(config.restart_initial_s, config.restart_max_s))
        self.deployments = Deployments(DeploymentStore(self.store), on_change=self.reconciler.poke,
                                       rollout_timeout_s=config.rollout_timeout_s)
        self.health = HealthServicer()
        self.grpc_server: grpc.aio.Server | None = None
        self.metrics_http = None
        self.port = 0
        self.metrics_port = 0

    def _table_changed(self) -> None:
        self.reconciler.poke()

    async def start(self) -> None:
        if isinstance(self.store, RedisStore):
            await self.store.ping()                     # fail fast: StoreUnavailable
        await self.controller.start()
        await self.reconciler.reconcile_once()
        await self.reconciler.start()
        interceptors = [AdminTokenInterceptor(self.config.admin_token)] if self.config.admin_token else []
        self.grpc_server = grpc.aio.server(interceptors=interceptors)
        deployer_pb2_grpc.add_DeployerServicer_to_server(DeployerService(self.deployments, self.reconciler),
                                                         self.grpc_server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        self.port = self.grpc_server.add_insecure_port(f"{self.config.host}:{self.config.port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {self.config.host}:{self.config.port}")
        await self.grpc_server.start()
        self.metrics_http, self.metrics_port = self.metrics.serve(self.config.host, self.config.metrics_port)
        for name in ("", DEPLOYER_SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if not self.config.admin_token:
            log.warning("the Deployer API is open: no admin token configured")

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        if self.grpc_server is not None:
            await self.grpc_server.stop(STOP_GRACE_S)
        await self.reconciler.stop()
        await self.backend.close()
        await self.controller.stop()
        if self.metrics_http is not None:
            self.metrics_http.shutdown()
        await self.store.close()


async def serve(config: DeployerConfig) -> int:
    server = DeployerServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except BaseException:
        await server.stop()
        raise
    log.info("deployer ready", extra={
        "port": server.port, "metrics_port": server.metrics_port, "backend": server.backend.kind,
        "controllers": config.controllers, "store": config.store_kind,
        "store_prefix": config.store_prefix if config.redis_url else None,
        "deployments": len(server.reconciler.status), "auth": bool(config.admin_token)})
    print(ready_line(server.port, server.metrics_port), file=sys.stdout, flush=True)
    await stop.wait()
    log.info("deployer stopping; draining its local replicas" if server.backend.kind == "local"
             else "deployer stopping; the pods keep serving")
    await server.stop()
    log.info("deployer stopped")
    return 0
