"""Run one deployer: the store, the backend, the link to the controller, the reconcile loop, the
gRPC server (Deployer + health, behind the admin token) and /metrics.

Lifecycle: open the store (a Redis that does not answer fails the start) → watch the controller →
campaign for the owner lease → as owner, a first reconcile pass (a restarted deployer brings every
stored deployment back here) → serve (ready line on stdout) → SIGTERM or SIGINT → health
NOT_SERVING, stop taking calls, stop the loop, then the backend: local replicas drain (SIGTERM) in
parallel, Kubernetes pods stay; then the lease is released, so a standby takes over at once. The
desired state stays in the store.

Several deployers may share one store (Redis, same prefix): the holder of the owner lease acts
and answers the API; the others stand by (API calls: UNAVAILABLE naming the owner; the Deployer
health service NOT_SERVING) and the first to take the lease after the owner is gone carries on.
An owner that sees another deployer holding the lease drains its local replicas (the new owner
cannot see them and starts its own); one that merely lost the store keeps them running and only
stops acting.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from mindmotor.common import rpc
from mindmotor.common.leader import LeaderElector
from mindmotor.common.lifecycle import run_until_signal
from mindmotor.common.store import RedisStore, Store, StoreUnavailable, open_store
from mindmotor.protocol import deployer_pb2, deployer_pb2_grpc
from mindmotor.runtime.backoff import RestartBackoff

from .backends import Backend, make_backend
from .config import OWNER_LEASE, DeployerConfig, ready_line
from .controller_link import ControllerLink
from .coordinator_metrics import CoordinatorFigures
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
        self.store = store or open_store(config.store_url, config.store_prefix)
        self.metrics = DeployerMetrics()
        self.backend = backend or make_backend(config)
        self.controller = ControllerLink(config.controllers, config.traffic_token, on_change=self._table_changed)
        self.elector = LeaderElector(self.store, config.deployer_id, config.lease_ttl_s, OWNER_LEASE,
                                     on_change=self._ownership_changed)
        self.coordinator_figures = CoordinatorFigures(
            list(config.coordinators), on_read=lambda outcome: self.metrics.coordinator_reads.labels(outcome).inc())
        self.reconciler = Reconciler(DeploymentStore(self.store), self.backend, self.controller, self.metrics,
                                     config.reconcile_interval_s,
                                     RestartBackoff(config.restart_initial_s, config.restart_max_s),
                                     active=lambda: self.elector.is_leader,
                                     coordinator_figures=self.coordinator_figures,
                                     orphan_grace_s=config.orphan_grace_s)
        self.deployments = Deployments(DeploymentStore(self.store), on_change=self.reconciler.poke,
                                       rollout_timeout_s=config.rollout_timeout_s,
                                       analysis=config.analysis_defaults)
        self.health = HealthServicer()
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
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
        await self.elector.step()                       # owner now, or a standby
        if self.elector.is_leader:
            await self.reconciler.reconcile_once()
        else:
            log.info("standing by: another deployer owns the deployments",
                     extra={"owner": await self.store.lease_holder(OWNER_LEASE)})
        self.elector.start()
        await self.reconciler.start()
        self.grpc_server, self.port = rpc.make_server(self.config.host, self.config.port, rpc.DEPLOYER_POLICY,
                                                      admin_token=self.config.admin_token,
                                                      registry=self.metrics.registry,
                                                      allow_open=self.config.allow_open_admin)
        deployer_pb2_grpc.add_DeployerServicer_to_server(
            DeployerService(self.deployments, self.reconciler, owner=lambda: self.elector.is_leader), self.grpc_server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        await self.grpc_server.start()
        self.metrics_http, self.metrics_port = self.metrics.serve(self.config.host, self.config.metrics_port)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._set_service_health()
        if not self.config.admin_token:
            log.warning("the Deployer API is open: no admin token configured")

    # ---- the owner lease ----------------------------------------------------------------------
    def _ownership_changed(self, owner: bool) -> None:
        if self._stopping:                   # the lease given up on the way out: nothing to react to
            return
        task = asyncio.get_running_loop().create_task(self._on_ownership(owner))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_ownership(self, owner: bool) -> None:
        self.metrics.owner.set(1 if owner else 0)
        await self._set_service_health()
        if owner:
            log.info("this deployer owns the deployments now", extra={"deployer_id": self.config.deployer_id})
            self.reconciler.poke()
            return
        holder = await self._lease_holder()
        if holder is not None and holder != self.config.deployer_id:
            log.warning("another deployer owns the deployments now; draining this one's local replicas",
                        extra={"owner": holder, "backend": self.backend.kind})
            await self.backend.yield_replicas()
        else:
            log.warning("lost the owner lease (store unreachable?); replicas keep running, nothing is acted on")

    async def _lease_holder(self) -> str | None:
        try:
            return await self.store.lease_holder(OWNER_LEASE)
        except StoreUnavailable:
            return None

    async def _set_service_health(self) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if self.elector.is_leader \
            else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set(DEPLOYER_SERVICE_NAME, status)

    async def stop(self) -> None:
        self._stopping = True
        await self.health.enter_graceful_shutdown()
        if self.grpc_server is not None:
            await self.grpc_server.stop(STOP_GRACE_S)
        await self.reconciler.stop()
        await self.coordinator_figures.close()
        await self.backend.close()
        await self.elector.stop()                      # after the drain: no two owners' replicas at once
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.controller.stop()
        if self.metrics_http is not None:
            self.metrics_http.shutdown()
        await self.store.close()


async def serve(config: DeployerConfig) -> int:
    server = DeployerServer(config)

    def ready() -> None:
        log.info("deployer ready", extra={
            "port": server.port, "metrics_port": server.metrics_port, "backend": server.backend.kind,
            "controllers": config.controllers, "store": config.store_kind,
            "store_prefix": config.store_prefix if config.redis_url else None,
            **({"store_file": str(config.store_file)} if config.store_file else {}),
            "deployments": len(server.reconciler.status), "auth": bool(config.admin_token),
            "deployer_id": config.deployer_id, "owner": server.elector.is_leader})
        print(ready_line(server.port, server.metrics_port), file=sys.stdout, flush=True)

    def stopping() -> None:
        log.info("deployer stopping; draining its local replicas" if server.backend.kind == "local"
                 else "deployer stopping; the pods keep serving")

    await run_until_signal(server, ready, stopping)
    log.info("deployer stopped")
    return 0
