"""`RoutingTableBroadcaster`: one controller's current routing table, rebuilt from the registry
(and the deployments' traffic weights) when any controller announces a routing change (store
channel `routing:changes`) and every refresh interval (fresher load; and a safety net for a lost
notification), then handed to every Watch stream. Rebuilds are coalesced: a burst of changes
yields one table, and a slow watcher skips straight to the newest table.

A store that comes back without its data (the store's epoch changed) does not empty the table:
the last good table's instances are kept until they re-register (`LastGoodTable`), and the routing
version is moved past the last one sent, so versions never go back."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Callable

from mindmotor.common.store import StoreUnavailable
from mindmotor.vocabulary import INSTANCE_STATES_LISTED
from mindmotor.protocol import controller_pb2

from .records import InstanceRecord
from .last_good import LastGoodTable
from .registry import CHANGES_CHANNEL, VERSION_KEY, Registry
from .traffic import TrafficTable

log = logging.getLogger("mindmotor.controller")

COALESCE_S = 0.02
RESUBSCRIBE_S = 0.5


def build_table(records: list[InstanceRecord], version: int, controller_id: str, from_leader: bool,
                traffic: list[controller_pb2.TrafficSplit] = ()) -> controller_pb2.RoutingTable:
    return controller_pb2.RoutingTable(
        version=version, controller_id=controller_id, from_leader=from_leader,
        instances=[r.to_info() for r in records if r.state in INSTANCE_STATES_LISTED], traffic=traffic)


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
                 traffic: TrafficTable | None = None, keep_last_good_s: float | None = None,
                 on_store_reset: Callable[[], None] | None = None):
        self.registry = registry
        self.keep_last_good_s = 5 * refresh_interval_s if keep_last_good_s is None else keep_last_good_s
        self.on_store_reset = on_store_reset
        self._epoch: str | None = None
        self.last_good: LastGoodTable | None = None      # set while the store recovers from a data loss
        self.store_resets = 0
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
        epoch = await self.registry.epoch()
        if self._epoch is not None and epoch != self._epoch:
            await self._store_lost_its_data()
        self._epoch = epoch
        records = await self.registry.list()
        version = await self.registry.version()
        splits = await self.traffic.list() if self.traffic else []
        table = build_table(records, version, self.controller_id, self.is_leader(), splits)
        if self.last_good is not None:
            self.last_good.merge(table, time.monotonic())
            if self.last_good.done:
                self.last_good = None
                log.info("routing table rebuilt from the store again", extra={"instances": len(table.instances)})
        if self.on_rebuild:
            self.on_rebuild(table, records)
        content = table.SerializeToString(deterministic=True)
        if content == self._content:
            return
        table.generated_at = time.time()
        self._content, self.table = content, table
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _store_lost_its_data(self) -> None:
        self.store_resets += 1
        if self.on_store_reset:
            self.on_store_reset()
        if self.table.instances:
            self.last_good = LastGoodTable(self.table, time.monotonic(), self.keep_last_good_s)
        behind = self.table.version - await self.registry.version()
        if behind >= 0:
            await self.registry.store.incr(VERSION_KEY, behind + 1)
        log.warning("the store lost its data (its epoch changed): keeping the last routing table until its "
                    "instances re-register", extra={"instances": len(self.table.instances),
                                                    "keep_s": self.keep_last_good_s, "version": self.table.version})

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
