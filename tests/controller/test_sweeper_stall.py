"""A controller that did not run for a while (SIGSTOP, swapped out) times heartbeats from when it
resumed: its first sweep after the stall declares no worker dead for heartbeats it could not read;
a worker that stays silent after that is still declared dead in time."""

from __future__ import annotations

import asyncio

from mindmotor.common.leader import LeaderElector
from mindmotor.common.store import MemoryStore
from mindmotor.vocabulary import InstanceState
from mindmotor.controller.config import ControllerConfig
from mindmotor.controller.registry import Registry
from mindmotor.controller.sweeper import HealthSweeper
from mindmotor.protocol import controller_pb2


def test_a_stalled_controller_does_not_declare_workers_dead_for_its_own_stall():
    async def scenario():
        now = [1000.0]
        store = MemoryStore(prefix="t:")
        registry = Registry(store, clock=lambda: now[0])
        config = ControllerConfig()
        elector = LeaderElector(store, "c1", ttl_s=5.0, lease_name="controller:leader")
        sweeper = HealthSweeper(registry, elector, config)
        await registry.register(controller_pb2.RegisterRequest(instance_id="w", address="h:1", model="m"))
        await registry.heartbeat(controller_pb2.HeartbeatRequest(instance_id="w", state="serving"), None)
        assert (await registry.get("w")).state == InstanceState.READY

        wake_at = now[0] + config.sweep_interval_s
        now[0] += config.dead_after_s + 3            # the controller was frozen this long
        sweeper.note_stall(wake_at)
        await sweeper.sweep()
        assert (await registry.get("w")).state == InstanceState.READY     # its heartbeats were not read

        now[0] += config.dead_after_s + 0.5          # the worker stays silent after the resume
        sweeper.note_stall(now[0] - 0.01)            # the sweeper woke on time: no stall
        await sweeper.sweep()
        assert (await registry.get("w")).state == InstanceState.DEAD

    asyncio.run(scenario())
