"""Run one controller: the store, the leader lease, the health sweeper, the routing table, the
gRPC server (Controller + health) and the HTTP admin API.

Lifecycle: open the store (a Redis that does not answer fails the start) → campaign for the
lease → serve (ready line on stdout) → SIGTERM or SIGINT → stop taking registrations, give the
lease up (a standby leads at once), close the streams (workers and coordinators fail over), exit.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from mindmotor.common import rpc
from mindmotor.common.store import RedisStore, Store, open_store
from mindmotor.protocol import controller_pb2, controller_pb2_grpc

from .admin import create_admin_app
from .config import ControllerConfig, ready_line
from mindmotor.common.leader import LeaderElector
from mindmotor.common.lifecycle import run_until_signal
from .metrics import ControllerMetrics
from .pd_autoscaler import PDAutoscaler
from .registry import Registry
from .table_broadcaster import RoutingTableBroadcaster
from .service import ControllerService
from .sweeper import HealthSweeper
from .traffic import TrafficTable

log = logging.getLogger("mindmotor.controller")

LEASE_NAME = "controller:leader"      # the store lease the leading controller holds

CONTROLLER_SERVICE_NAME = controller_pb2.DESCRIPTOR.services_by_name["Controller"].full_name
STOP_GRACE_S = 0.5


class ControllerServer:
    """Everything one controller runs, startable and stoppable in any event loop."""

    def __init__(self, config: ControllerConfig, store: Store | None = None):
        self.config = config
        self.store = store or open_store(config.redis_url, config.redis_prefix)
        self.metrics = ControllerMetrics(config.controller_id)
        self.registry = Registry(self.store)
        self.traffic = TrafficTable(self.store, self.registry)
        self.elector = LeaderElector(self.store, config.controller_id, config.lease_ttl_s, LEASE_NAME,
                                     on_change=self._leadership_changed)
        self.broadcaster = RoutingTableBroadcaster(self.registry, config.controller_id,
                                                   lambda: self.elector.is_leader, config.heartbeat_interval_s,
                                                   on_rebuild=self.metrics.on_rebuild, traffic=self.traffic,
                                                   keep_last_good_s=config.dead_after_s,
                                                   on_store_reset=self.metrics.store_resets.inc)
        self.sweeper = HealthSweeper(self.registry, self.elector, config,
                                     on_transition=lambda _id, _old, new: self.metrics.transitions.labels(new).inc(),
                                     pd=PDAutoscaler(self.registry, config, self.metrics))
        self.service = ControllerService(self.registry, self.broadcaster, self.elector, self.metrics, config,
                                         self.traffic)
        self.health = HealthServicer()
        self.grpc_server: grpc.aio.Server | None = None
        self.admin: _AdminServer | None = None
        self.port = 0
        self.admin_port = 0

    def _leadership_changed(self, leader: bool) -> None:
        self.metrics.set_leader(leader)
        self.broadcaster.poke()

    async def start(self) -> None:
        if isinstance(self.store, RedisStore):
            await self.store.ping()                   # fail fast: StoreUnavailable
        await self.elector.step()
        self.elector.start()
        await self.broadcaster.start()
        self.sweeper.start()
        self.grpc_server, self.port = rpc.make_server(self.config.host, self.config.port, rpc.CONTROLLER_POLICY,
                                                      admin_token=self.config.admin_token,
                                                      registry=self.metrics.registry)
        controller_pb2_grpc.add_ControllerServicer_to_server(self.service, self.grpc_server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        await self.grpc_server.start()
        app = create_admin_app(self.config, self.registry, self.elector, self.metrics)
        self.admin = _AdminServer(app, self.config.admin_host, self.config.admin_port)
        self.admin_port = await self.admin.start()
        for name in ("", CONTROLLER_SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if not self.config.admin_token:
            log.warning("the admin API is open: no admin token configured")

    async def stop(self) -> None:
        """Release the lease first (a standby leads at once), then close everything; each step is
        bounded, so one that hangs cannot keep the process from exiting."""
        self.service.accepting = False
        await _bounded("lease", self.elector.stop())
        await _bounded("health", self.health.enter_graceful_shutdown())
        await _bounded("sweeper", self.sweeper.stop())
        if self.grpc_server:
            await _bounded("grpc", self.grpc_server.stop(STOP_GRACE_S))
        if self.admin:
            await _bounded("admin", self.admin.stop())
        await _bounded("broadcaster", self.broadcaster.stop())
        await _bounded("store", self.store.close())


STOP_STEP_TIMEOUT_S = 3.0


async def _bounded(step: str, awaitable) -> None:
    try:
        await asyncio.wait_for(awaitable, STOP_STEP_TIMEOUT_S)
    except asyncio.TimeoutError:
        log.warning("shutdown step timed out; going on", extra={"step": step, "timeout_s": STOP_STEP_TIMEOUT_S})


# The admin API's HTTP limits: a connection that never sends its request (or its body) is cut off,
# and open connections are capped, so nobody can hold the controller's descriptors (its gRPC port
# shares them); over TLS, the handshake has the header deadline too (common/asgi_server.py).
ADMIN_LIMITS = dict(header_timeout_s=10.0, body_timeout_s=10.0, max_connections=256)


class _AdminServer:
    """uvicorn in this event loop, on a socket we bind (so port 0 works), without its own
    signal handling (the controller's handles SIGTERM), with the HTTP limits above."""

    def __init__(self, app, host: str, port: int):
        import uvicorn

        from mindmotor.common.asgi_server import Server
        from mindmotor.common.http_limits import HTTPLimits, limited_h11
        from mindmotor.common.https_side import uvicorn_tls

        # IPPROTO_TCP so that asyncio sets TCP_NODELAY on accepted connections (see coordinator/http/server.py)
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                                  socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        limits = HTTPLimits(**ADMIN_LIMITS)
        self.server = Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                            http=limited_h11(limits), **uvicorn_tls()),
                             handshake_timeout_s=limits.header_timeout_s)
        self.task: asyncio.Task | None = None

    async def start(self) -> int:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name="admin-http")
        while not self.server.started:
            if self.task.done():
                self.task.result()                    # raises what failed
                raise OSError("admin server exited")
            await asyncio.sleep(0.01)
        return self.sock.getsockname()[1]

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task:
            await asyncio.gather(self.task, return_exceptions=True)
        self.sock.close()


async def serve(config: ControllerConfig) -> int:
    server = ControllerServer(config)

    def ready() -> None:
        log.info("controller ready", extra={
            "controller_id": config.controller_id, "port": server.port, "admin_port": server.admin_port,
            "store": config.store_kind, "redis_prefix": config.redis_prefix if config.redis_url else None,
            "is_leader": server.elector.is_leader, "heartbeat_interval_s": config.heartbeat_interval_s,
            "suspect_after_s": config.suspect_after_s, "dead_after_s": config.dead_after_s,
            "lease_ttl_s": config.lease_ttl_s, "pd_autoscale": config.pd.enabled})
        print(ready_line(server.port, server.admin_port), file=sys.stdout, flush=True)

    await run_until_signal(server, ready, lambda: log.info("controller stopping",
                                                           extra={"controller_id": config.controller_id}))
    log.info("controller stopped", extra={"controller_id": config.controller_id})
    return 0
