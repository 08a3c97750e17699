"""`RoutingTableBroadcaster`: one controller's current routing table, rebuilt from the registry
(and the deployments' traffic weights) when any controller announces a routing change (store
channel `routing:changes`) and every refresh interval (fresher load; and a safety net for a lost
notification), then handed to every Watch stream. Rebuilds are coalesced: a burst of changes
yields one table, and a slow watcher skips straight to the newest table."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Callable

from mindmotor.common.store import StoreUnavailable
from mindmotor.protocol import controller_pb2

from . import states
from .records import InstanceRecord
from .registry import CHANGES_CHANNEL, Registry
from .traffic import TrafficTable

log = logging.getLogger("mindmotor.controller")

COALESCE_S = 0.02
RESUBSCRIBE_S = 0.5


def build_table(records: list[InstanceRecord], version: int, controller_id: str, from_leader: bool,
                traffic: list[controller_pb2.TrafficSplit] = ()) -> controller_pb2.RoutingTable:
    return controller_pb2.RoutingTable(
        version=version, controller_id=controller_id, from_leader=from_leader,
        instances=[r.to_info() for r in records if r.state in states.LISTED], traffic=traffic)


def for_model(table: controller_pb2.RoutingTable, model: str) -> controller_pb2.RoutingTable:
    if not model:
        return table
    filtered = controller_pb2.RoutingTable()
    filtered.CopyFrom(table)
    del filtered.instances[:]
    filtered.instances.extend(i for i in table.instances if i.model == model)
    del filtered.traffic[:]
    filtered.traffic.extend(t for t in table.traffic if t.model == model)
    return filtered


class RoutingTableBroadcaster:
    def __init__(self, registry: Registry, controller_id: str, is_leader: Callable[[], bool],
                 refresh_interval_s: float,
                 on_rebuild: Callable[[controller_pb2.RoutingTable, list[InstanceRecord]], None] | None = None,
                 traffic: TrafficTable | None = None):
        self.registry = registry
        self.traffic = traffic
        self.controller_id = controller_id
        self.is_leader = is_leader
        self.refresh_interval_s = refresh_interval_s
        self.on_rebuild = on_rebuild
        self.table = controller_pb2.RoutingTable(controller_id=controller_id)
        self._content = b""
        self._dirty = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        await self.rebuild()
        self._tasks = [asyncio.create_task(self._listen(), name="routing-listen"),
                       asyncio.create_task(self._run(), name="routing-rebuild")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def poke(self) -> None:
        """Something changed: rebuild soon."""
        self._dirty.set()

    async def updates(self) -> AsyncIterator[controller_pb2.RoutingTable]:
        """The current table, then each new one (only the newest if several came meanwhile)."""
        while True:
            table, changed = self.table, self._changed
            yield table
            await changed.wait()

    async def rebuild(self) -> None:
        records = await self.registry.list()
        version = await self.registry.version()
        splits = await self.traffic.list() if self.traffic else []
        table = build_table(records, version, self.controller_id, self.is_leader(), splits)
        if self.on_rebuild:
            self.on_rebuild(table, records)
        content = table.SerializeToString(deterministic=True)
        if content == self._content:
            return
        table.generated_at = time.time()
        self._content, self.table = content, table
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), timeout=self.refresh_interval_s)
                await asyncio.sleep(COALESCE_S)
            except asyncio.TimeoutError:
                pass
            self._dirty.clear()
            try:
                await self.rebuild()
            except StoreUnavailable as exc:
                log.warning("routing table rebuild failed: store unreachable", extra={"error": str(exc)})

    async def _listen(self) -> None:
        while True:
            try:
                async with self.registry.store.subscribe(CHANGES_CHANNEL) as messages:
                    self.poke()          # changes made while (re)subscribing
                    async for _ in messages:
                        self.poke()
            except StoreUnavailable as exc:
                log.warning("routing change subscription lost", extra={"error": str(exc)})
                await asyncio.sleep(RESUBSCRIBE_S)
