"""Run one worker: load the engine, serve gRPC (Worker + health) and /metrics, drain on SIGTERM.

Lifecycle: load → serve (health SERVING, ready line on stdout) → SIGTERM or SIGINT → drain
(health NOT_SERVING, Generate answers UNAVAILABLE, in-flight requests finish, bounded by the drain
timeout; a second signal cuts it short) → stop the server, the metrics port and the engine.
If the engine dies instead, the worker stops serving at once (health NOT_SERVING, Status state
"failed", heartbeats "draining", then deregisters) and exits with status 1 to be replaced.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from mindmotor.common import rpc
from mindmotor.common.roles import Role
from mindmotor.common.tracing import Tracing
from mindmotor.engine.async_engine import AsyncLLMEngine
from mindmotor.protocol import worker_pb2, worker_pb2_grpc

from .admission import Admission, server_options
from .config import WorkerConfig, parse_injected_delay, ready_line
from .metrics import WorkerMetrics
from .recall import OutputRecall
from .registration import start_agent
from mindmotor.sandbox.pool import HelperMetrics, HelperPool
from mindmotor.sandbox.spec_check import SpecChecker
from .service import WorkerService

log = logging.getLogger("mindmotor.worker")

WORKER_SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name  # "mindmotor.v1.Worker"
STOP_GRACE_S = 1.0     # after the drain: time for the last responses (or aborts) to flush


async def serve(config: WorkerConfig) -> int:
    engine = AsyncLLMEngine(config.engine, stall_after_s=config.engine_stall_timeout_s)
    admission = Admission(config.max_concurrent_requests)
    model_name = config.served_model_name or engine.info.model_name
    metrics = WorkerMetrics(engine, admission, model_name=model_name)
    specs = SpecChecker(HelperPool("specs", config.spec_helpers, config.spec_timeout_s,
                                   metrics=HelperMetrics(metrics.registry)))
    service = WorkerService(engine, admission, metrics, config.worker_id, model_name, config.role,
                            node=config.node, kv_pull_timeout_s=config.kv_pull_timeout_s,
                            role_drain_timeout_s=config.role_drain_timeout_s, specs=specs,
                            stream_keepalive_s=config.stream_keepalive_s,
                            recall=OutputRecall(config.resume_retention_s),
                            tracing=Tracing("mindmotor-worker", config.otlp_traces_endpoint),
                            injected_delay=parse_injected_delay(config.inject_delay))
    metrics.collector.role = lambda: service.role
    shared = None
    if config.kv_shared:
        from .kv_shared import SharedKVTier

        shared = SharedKVTier(engine, config.redis_url, ttl_s=config.kv_shared_ttl_s, metrics=metrics,
                              tracing=service.tracing)
        shared.start()
    health = HealthServicer()
    server, port = rpc.make_server(config.host, config.port, rpc.WORKER_POLICY, registry=metrics.registry,
                                   options=server_options(config.max_concurrent_requests))
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await server.start()
    metrics_http, metrics_port = metrics.serve(config.host, config.metrics_port)
    signals = ShutdownSignals(asyncio.get_running_loop())
    admission.on_drain(lambda: set_health(health, serving=False))
    await set_health(health, serving=True)
    announce_ready(config, port, metrics_port, service)
    agent = await start_agent(config, port, metrics_port, service, admission) if config.controller else None

    engine_died = await wait_for_stop(signals.drain, engine)
    if engine_died:
        log.critical("the engine died; the worker stops serving and exits",
                     extra={"error": repr(engine.dead), "in_flight": len(admission.in_flight)})
        admission.fail()
        await set_health(health, serving=False)
        drained = False
    else:
        log.info("draining", extra={"in_flight": len(admission.in_flight), "timeout_s": config.drain_timeout_s})
        await admission.start_drain()
        drained = await wait_drained(admission, config.drain_timeout_s, signals.now)
        if not drained:
            await abort_in_flight(engine, admission)
    await health.enter_graceful_shutdown()
    if agent is not None:
        await agent.stop()
    await server.stop(STOP_GRACE_S)
    await service.kv.close()
    if shared is not None:
        await shared.close()
    await specs.pool.close()
    metrics_http.shutdown()
    engine.shutdown()
    service.tracing.shutdown()
    log.info("worker stopped", extra={"drained": drained, "engine_died": engine_died})
    return 1 if engine_died else 0


async def wait_for_stop(drain: asyncio.Event, engine: AsyncLLMEngine) -> bool:
    """Until a signal asks for a drain (False) or the engine thread dies (True)."""
    loop = asyncio.get_running_loop()
    died = asyncio.Event()
    engine.on_dead(lambda _error: loop.call_soon_threadsafe(died.set))
    waits = [asyncio.ensure_future(drain.wait()), asyncio.ensure_future(died.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    return died.is_set()


async def abort_in_flight(engine: AsyncLLMEngine, admission: Admission) -> None:
    """End every remaining stream with finish_reason "abort" (the client may resubmit elsewhere)."""
    log.warning("drain cut short; aborting the requests still in flight",
                extra={"in_flight": len(admission.in_flight)})
    for request_id in list(admission.in_flight):
        engine.abort(request_id)
    await admission.wait_idle(STOP_GRACE_S)


async def set_health(health: HealthServicer, serving: bool) -> None:
    status = (health_pb2.HealthCheckResponse.SERVING if serving
              else health_pb2.HealthCheckResponse.NOT_SERVING)
    for name in ("", WORKER_SERVICE_NAME):
        await health.set(name, status)


def announce_ready(config: WorkerConfig, port: int, metrics_port: int, service: WorkerService) -> None:
    status = service.status()
    log.info("worker ready", extra={
        "worker_id": config.worker_id, "host": config.host, "port": port, "metrics_port": metrics_port,
        "model": status.model, "device": status.device.device, "emulated_profile": status.emulated_profile,
        "timing": status.timing, "num_blocks": status.load.num_blocks, "max_model_len": status.max_model_len,
        "role": Role.from_proto(status.role), "node": status.node})
    print(ready_line(port, metrics_port), file=sys.stdout, flush=True)


class ShutdownSignals:
    """SIGTERM or SIGINT: the first asks for a drain, a second one cuts the drain short."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.drain = asyncio.Event()
        self.now = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: signal.Signals) -> None:
        log.info("signal received", extra={"signal": sig.name})
        (self.now if self.drain.is_set() else self.drain).set()


async def wait_drained(admission: Admission, timeout_s: float, cut_short: asyncio.Event) -> bool:
    """True once no request is in flight; False when the timeout or `cut_short` comes first."""
    idle = asyncio.ensure_future(admission.wait_idle(timeout_s))
    cut = asyncio.ensure_future(cut_short.wait())
    await asyncio.wait({idle, cut}, return_when=asyncio.FIRST_COMPLETED)
    for task in (idle, cut):
        task.cancel()
    return idle.done() and not idle.cancelled() and idle.result()
