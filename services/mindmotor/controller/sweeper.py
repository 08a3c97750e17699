"""`HealthSweeper`: the leader's periodic pass over the registry — suspect and dead timeouts, and
forgetting long-dead records (see `states` for the rules) — and, every few heartbeat intervals,
the P/D ratio policy (`PDAutoscaler`, when `--pd-autoscale` is on).

Heartbeats are timed from the latest of an instance's last heartbeat, its registration, when this
controller became leader, and when this controller last came back from a stall: a controller that
did not run (frozen, swapped out, paused in a debugger) for longer than the suspect time has not
read the heartbeats sent meanwhile — their lateness is its own, not the workers'. Without that, a
controller resuming after a 5 s SIGSTOP declared every worker dead in its first sweep, before the
heartbeats waiting in its sockets were read, and routing had no instance until they re-registered."""

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
        self.resumed_at = 0.0                 # registry clock when this controller last resumed from a stall
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="health-sweeper")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            wake_at = self.registry.clock() + self.config.sweep_interval_s
            await asyncio.sleep(self.config.sweep_interval_s)
            self.note_stall(wake_at)
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

    def note_stall(self, wake_at: float) -> None:
        """Record a stall of this controller: its event loop woke the sweeper later than `wake_at`
        by more than the suspect time (the process did not run; a sweep merely waiting for the
        store does not count — the loop reads heartbeats meanwhile)."""
        now = self.registry.clock()
        if now - wake_at > self.config.suspect_after_s:
            self.resumed_at = now
            log.warning("this controller did not run for a while; heartbeats are timed from now",
                        extra={"stalled_s": round(now - wake_at, 3)})

    @property
    def baseline(self) -> float:
        """No instance's heartbeat is counted late from before this (see the module docstring)."""
        return max(self.elector.leader_since, self.resumed_at)

    async def sweep(self) -> None:
        cfg = self.config
        for record in await self.registry.list():
            now = self.registry.clock()
            if states.should_forget(record, now, cfg.forget_after_s):
                await self.registry.update(record.instance_id,
                                           lambda r: DELETE if states.should_forget(r, now, cfg.forget_after_s) else None)
                continue
            probe = record.copy()
            if not states.on_sweep(probe, now, self.baseline, cfg.suspect_after_s, cfg.dead_after_s):
                continue                       # nothing to write: skip the compare-and-set
            result = await self.registry.update(
                record.instance_id,
                lambda r: states.on_sweep(r, now, self.baseline, cfg.suspect_after_s, cfg.dead_after_s))
            if result and result[1] and result[0].state != result[1].state:
                before, after = result
                log.info("instance state changed", extra={
                    "instance_id": after.instance_id, "from": before.state, "to": after.state,
                    "reason": after.reason})
                if self.on_transition:
                    self.on_transition(after.instance_id, before.state, after.state)
