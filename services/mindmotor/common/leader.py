"""`LeaderElector`: hold a store lease (e.g. the controllers' `controller:leader`, a deployer's
`owner`) while alive, so that of several processes sharing one store exactly one leads.

The leader renews every ttl/3; a standby tries to take the lease just as often, so when the
leader dies (its lease stops being renewed) a standby leads at most ttl + ttl/3 later — within two
lease periods. A leader that cannot renew (lost the lease, or the store is unreachable) steps down
at once. With a `MemoryStore` the single process always leads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from mindmotor.common.store import Store, StoreUnavailable

log = logging.getLogger("mindmotor.lease")


class LeaderElector:
    def __init__(self, store: Store, holder: str, ttl_s: float, lease_name: str,
                 on_change: Callable[[bool], None] | None = None):
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self.lease_name = lease_name
        self.on_change = on_change
        self.is_leader = False
        self.leader_since = 0.0          # unix seconds when this process last became leader
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leader-elector")

    async def stop(self) -> None:
        """Stop campaigning and give the lease up (so a standby takes over at once). The loop is
        asked to end between two store calls rather than cancelled in the middle of one (a Redis
        command cancelled mid-flight tears its connection down)."""
        self._stopping.set()
        if self._task:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.ttl_s)
            except asyncio.TimeoutError:
                self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.is_leader:
            try:
                await self.store.release_lease(self.lease_name, self.holder)
            except StoreUnavailable:
                pass
            self._set(False)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            await self.step()
            try:
                await asyncio.wait_for(self._stopping.wait(), self.ttl_s / 3)
            except asyncio.TimeoutError:
                pass

    async def step(self) -> None:
        try:
            if self.is_leader:
                held = await self.store.renew_lease(self.lease_name, self.holder, self.ttl_s)
                if not held:    # it lapsed while this process was late (a stalled loop): ours again if
                    # nobody took it meanwhile, without a flap that refuses calls in between
                    held = await self.store.try_acquire_lease(self.lease_name, self.holder, self.ttl_s)
            else:
                held = await self.store.try_acquire_lease(self.lease_name, self.holder, self.ttl_s)
        except StoreUnavailable as exc:
            if self.is_leader:
                log.warning("store unreachable; stepping down", extra={"lease": self.lease_name, "error": str(exc)})
            held = False
        self._set(held)

    def _set(self, leader: bool) -> None:
        if leader == self.is_leader:
            return
        self.is_leader = leader
        if leader:
            self.leader_since = time.time()
        log.info("leadership changed", extra={"lease": self.lease_name, "is_leader": leader, "holder": self.holder})
        if self.on_change:
            self.on_change(leader)
