"""`HealthSweeper`: the leader's periodic pass over the registry — suspect and dead timeouts, and
forgetting long-dead records (see `states` for the rules) — and, every few heartbeat intervals,
the P/D ratio policy (`PDAutoscaler`, when `--pd-autoscale` is on)."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from mindmotor.common.store import StoreUnavailable

from . import states
from .config import ControllerConfig
from mindmotor.common.leader import LeaderElector
from .pd_autoscaler import PDAutoscaler
from .registry import DELETE, Registry

log = logging.getLogger("mindmotor.controller")


class HealthSweeper:
    def __init__(self, registry: Registry, elector: LeaderElector, config: ControllerConfig,
                 on_transition: Callable[[str, str, str], None] | None = None,
                 pd: PDAutoscaler | None = None):
        self.registry = registry
        self.pd = pd
        self.elector = elector
        self.config = config
        self.on_transition = on_transition    # (instance_id, old state, new state)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="health-sweeper")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            if not self.elector.is_leader:
                if self.pd:
                    self.pd.forget()
                continue
            try:
                await self.sweep()
                if self.pd and self.pd.due(self.registry.clock()):
                    await self.pd.evaluate(self.registry.clock())
            except StoreUnavailable as exc:
                log.warning("sweep failed: store unreachable", extra={"error": str(exc)})

    async def sweep(self) -> None:
        cfg = self.config
        for record in await self.registry.list():
            now = self.registry.clock()
            if states.should_forget(record, now, cfg.forget_after_s):
                await self.registry.update(record.instance_id,
                                           lambda r: DELETE if states.should_forget(r, now, cfg.forget_after_s) else None)
                continue
            probe = record.copy()
            if not states.on_sweep(probe, now, self.elector.leader_since, cfg.suspect_after_s, cfg.dead_after_s):
                continue                       # nothing to write: skip the compare-and-set
            result = await self.registry.update(
                record.instance_id,
                lambda r: states.on_sweep(r, now, self.elector.leader_since, cfg.suspect_after_s, cfg.dead_after_s))
            if result and result[1] and result[0].state != result[1].state:
                before, after = result
                log.info("instance state changed", extra={
                    "instance_id": after.instance_id, "from": before.state, "to": after.state,
                    "reason": after.reason})
                if self.on_transition:
                    self.on_transition(after.instance_id, before.state, after.state)
