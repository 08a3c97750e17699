"""Being known to the controller: register this worker and heartbeat its load (InstanceAgent).

The registered model name is the one the worker serves (Status): `--served-model-name` when given
(the Deployer gives every version of a deployment the same one, so that the coordinator splits one
model's traffic between them), else the checkpoint directory's name.

A `drain` command from the controller drains the worker exactly as SIGTERM's first phase does
(no new requests; in-flight ones finish) without exiting. Each heartbeat carries the p90 TTFT
and TPOT of the recent requests (`metrics.recent_ttft` / `recent_tpot`) for the P/D ratio policy.
A worker whose engine died heartbeats "draining" (not routable) until it exits.
"""

from __future__ import annotations

import logging
import socket

from mindmotor.common.roles import Role
from mindmotor.vocabulary import WorkerState
from mindmotor.controller.client import InstanceAgent, InstanceLoad
from mindmotor.protocol import controller_pb2

from .admission import Admission
from .config import WorkerConfig
from .service import WorkerService

log = logging.getLogger("mindmotor.worker")

REGISTER_TIMEOUT_S = 10.0


def advertised(config: WorkerConfig, port: int) -> str:
    if config.advertise_address:
        return config.advertise_address
    host = config.host if config.host not in ("0.0.0.0", "::", "") else socket.gethostname()
    return f"{host}:{port}"


async def start_agent(config: WorkerConfig, port: int, metrics_port: int, service: WorkerService,
                      admission: Admission) -> InstanceAgent:
    status = service.status()
    address = advertised(config, port)
    request = controller_pb2.RegisterRequest(
        instance_id=config.worker_id, address=address,
        metrics_address=f"{address.rsplit(':', 1)[0]}:{metrics_port}",
        model=status.model,
        role=status.role, device=status.device.device, max_model_len=status.max_model_len,
        block_size=status.block_size, deployment=config.deployment, version=config.version,
        weight=config.weight)

    def load() -> InstanceLoad:
        current = service.status()
        ttft_p90, ttft_n = service.metrics.recent_ttft.percentile(90)
        tpot_p90, tpot_n = service.metrics.recent_tpot.percentile(90)
        return InstanceLoad(running=current.load.running, waiting=current.load.waiting,
                            kv_usage=current.load.kv_usage, role=Role.from_proto(current.role),
                            # a failed worker (dead engine) is not routable: the controller knows DRAINING
                            state=WorkerState.DRAINING if admission.state == WorkerState.FAILED else admission.state,
                            ttft_p90_s=ttft_p90, tpot_p90_s=tpot_p90, ttft_samples=ttft_n, tpot_samples=tpot_n,
                            iteration_token_counts=list(current.load.iteration_token_counts),
                            iteration_tokens_sum=current.load.iteration_tokens_sum)

    async def on_drain(reason: str) -> None:
        log.info("drain commanded by the controller", extra={"reason": reason})
        await admission.start_drain()

    async def on_set_role(role: Role) -> None:
        log.info("role switch commanded by the controller", extra={"role": role})
        await service.set_role(role)

    agent = InstanceAgent(config.controller, request, load=load, on_drain=on_drain, on_set_role=on_set_role)
    service.roles.on_change(agent.heartbeat_now)
    await agent.start()
    await agent.wait_registered(timeout=REGISTER_TIMEOUT_S)
    log.info("registered with the controller", extra={"controller": config.controller, "address": address})
    return agent
