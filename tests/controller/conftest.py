"""Controller test helpers: fake instances (an `InstanceAgent` with a canned load), a routing
table watcher, and waiting on a condition. Real controller processes (`spawn_controller`) and a
Redis key prefix per test (`redis_prefix`) are the suite's fixtures (tests/conftest.py,
tests/support/service_processes.py), with short timeouts: heartbeat 0.2 s, suspect after 3 misses
(0.6 s), dead after 1.5 s, leader lease 1 s.
"""

from __future__ import annotations

import asyncio
import time

import pytest_asyncio

from mindmotor.common.ports import free_port
from mindmotor.common.roles import Role
from mindmotor.controller.client import InstanceAgent, InstanceLoad, RoutingTableWatcher
from mindmotor.protocol import controller_pb2


class FakeInstance:
    """An `InstanceAgent` with a settable load and a record of the commands it obeyed."""

    def __init__(self, controllers, instance_id: str, model: str = "tiny", role: str = "mixed", **fields):
        self.load = InstanceLoad()
        self.drains: list[str] = []
        self.roles: list[str] = []
        registration = controller_pb2.RegisterRequest(
            instance_id=instance_id, address=fields.pop("address", f"127.0.0.1:{free_port()}"), model=model,
            role=Role(role).to_proto(), device="910B3", max_model_len=2048, block_size=16, **fields)
        self.agent = InstanceAgent(controllers, registration, load=lambda: self.load,
                                   on_drain=self._drain, on_set_role=self._set_role)

    def _drain(self, reason: str) -> None:
        self.drains.append(reason)
        self.load.state = "draining"

    def _set_role(self, role: str) -> None:
        self.roles.append(role)
        self.load.role = role


@pytest_asyncio.fixture
async def make_instance():
    """await make_instance(controllers, instance_id, ...) -> FakeInstance, registered."""
    made: list[FakeInstance] = []

    async def make(controllers, instance_id: str, wait: bool = True, **kwargs) -> FakeInstance:
        instance = FakeInstance(controllers, instance_id, **kwargs)
        made.append(instance)
        await instance.agent.start()
        if wait:
            await instance.agent.wait_registered(timeout=10)
        return instance

    yield make
    for instance in made:
        await instance.agent.stop(deregister=False)


@pytest_asyncio.fixture
async def make_watcher():
    """await make_watcher(controllers) -> RoutingTableWatcher, with a first table received."""
    made: list[RoutingTableWatcher] = []

    async def make(controllers, **kwargs) -> RoutingTableWatcher:
        kwargs.setdefault("backoff_max_s", 0.5)
        watcher = RoutingTableWatcher(controllers, **kwargs)
        made.append(watcher)
        await watcher.start()
        await watcher.wait_for(lambda t: True, timeout=10)
        return watcher

    yield make
    for watcher in made:
        await watcher.stop()


def state_of(table: controller_pb2.RoutingTable, instance_id: str) -> str | None:
    """The instance's state in a routing table; None if it is not listed (dead or unknown)."""
    return next((i.state for i in table.instances if i.instance_id == instance_id), None)


async def eventually(check, timeout: float, interval: float = 0.05):
    """Poll `check()` (sync or async) until it returns a truthy value; that value. TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
