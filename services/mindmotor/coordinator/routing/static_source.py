"""`StaticWorkerSource`: fills the routing table from a fixed list of worker addresses.

Each worker's `Status` is read every `interval_s`: its model, limits, load and state. A worker
that does not answer (state "unreachable"), or is draining, is listed as not healthy until it
answers as serving.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from mindmotor.common.roles import Role
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.vocabulary import WorkerState

from mindmotor.coordinator.dispatch.channels import WorkerChannels
from mindmotor.coordinator.config import WorkerEntry
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable

log = logging.getLogger("mindmotor.coordinator")


def view_from_status(entry: WorkerEntry, status: pb.StatusResponse) -> InstanceView:
    return InstanceView(
        instance_id=entry.address, address=entry.address, model=status.model, role=Role.from_proto(status.role, Role.MIXED),
        healthy=status.state == WorkerState.SERVING, state=status.state, weight=entry.weight, deployment=entry.deployment,
        version=entry.version, max_model_len=status.max_model_len, block_size=status.block_size or 16,
        running=status.load.running, waiting=status.load.waiting, kv_usage=status.load.kv_usage,
        iteration_token_counts=tuple(status.load.iteration_token_counts),
        iteration_tokens_sum=status.load.iteration_tokens_sum)


class StaticWorkerSource:
    def __init__(self, entries: list[WorkerEntry], table: RoutingTable, channels: WorkerChannels,
                 interval_s: float = 1.0, timeout_s: float = 1.0):
        self.entries = entries
        self.table = table
        self.channels = channels
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Read every worker once (so the first requests find them), then keep polling."""
        await self.poll_once()
        self._task = asyncio.create_task(self._run(), name="static-source")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(entry) for entry in self.entries))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.poll_once()

    async def _poll(self, entry: WorkerEntry) -> None:
        try:
            status = await self.channels.stub(entry.address).Status(pb.StatusRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            old = self.table.get(entry.address)
            if old is None or old.healthy:
                log.warning("worker unreachable", extra={"address": entry.address, "code": exc.code().name})
            base = old or InstanceView(instance_id=entry.address, address=entry.address, weight=entry.weight,
                                       deployment=entry.deployment, version=entry.version)
            self.table.upsert(InstanceView(**{**base.__dict__, "healthy": False, "state": WorkerState.UNREACHABLE}))
            return
        view = view_from_status(entry, status)
        old = self.table.get(entry.address)
        if old is None or old.healthy != view.healthy:
            log.info("worker status", extra={"address": entry.address, "model": view.model,
                                             "state": status.state, "healthy": view.healthy})
        self.table.upsert(view)
