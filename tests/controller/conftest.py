"""Controller test helpers: real controller processes (`python -m mindmotor.cli controller`),
fake instances (an `InstanceAgent` with a canned load), a routing table watcher, and a unique
Redis key prefix per test (deleted at teardown).

Short timeouts everywhere: heartbeat 0.2 s, suspect after 3 misses (0.6 s), dead after 1.5 s,
leader lease 1 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from mindmotor.common.ports import free_port
from mindmotor.common.roles import Role
from mindmotor.controller.client import InstanceAgent, InstanceLoad, RoutingTableWatcher
from mindmotor.protocol import controller_pb2

REDIS_URL = os.environ.get("MINDMOTOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
FAST = {"--heartbeat-interval": "0.2", "--suspect-misses": "3", "--dead-after": "1.5", "--lease-ttl": "1"}
HEARTBEAT_S, SUSPECT_S, DEAD_S, LEASE_S = 0.2, 0.6, 1.5, 1.0


def redis_available() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


class ControllerProcess:
    """One `mindmotor controller` process on 127.0.0.1."""

    def __init__(self, log_dir: Path, port: int = 0, admin_token: str | None = None,
                 redis_prefix: str | None = None, extra: dict[str, str | None] | None = None):
        self.log_path = log_dir / f"controller-{uuid.uuid4().hex[:6]}.log"
        self.requested_port = port
        self.admin_token = admin_token
        self.redis_prefix = redis_prefix
        self.extra = {**FAST, **(extra or {})}
        self.proc: subprocess.Popen | None = None
        self.port = self.admin_port = 0

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "mindmotor.cli", "controller", "--host", "127.0.0.1",
               "--admin-host", "127.0.0.1", "--port", str(self.requested_port), "--admin-port", "0",
               "--log-level", "DEBUG"]
        if self.admin_token:
            cmd += ["--admin-token", self.admin_token]
        if self.redis_prefix is not None:
            cmd += ["--redis-url", REDIS_URL, "--redis-prefix", self.redis_prefix]
        for flag, value in self.extra.items():
            cmd += [flag] if value is None else [flag, value]      # None: a flag without a value
        return cmd

    def start(self, timeout: float = 20.0) -> "ControllerProcess":
        env = {k: v for k, v in os.environ.items() if k not in ("MINDMOTOR_REDIS_URL", "MINDMOTOR_ADMIN_TOKEN")}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith("MINDMOTOR_CONTROLLER_READY"):
            self.kill()
            raise RuntimeError(f"controller did not start: {line!r}\n{self.log_path.read_text()[-3000:]}")
        fields = dict(part.split("=") for part in line[0].split()[1:])
        self.port, self.admin_port = int(fields["port"]), int(fields["admin_port"])
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.admin_url + path, headers=self.headers(), timeout=5)

    def post(self, path: str, json: dict | None = None) -> httpx.Response:
        return httpx.post(self.admin_url + path, headers=self.headers(), json=json, timeout=5)

    def instances(self) -> dict[str, dict]:
        response = self.get("/v1/instances")
        response.raise_for_status()
        return {r["instance_id"]: r for r in response.json()["data"]}

    def is_leader(self) -> bool:
        return httpx.get(self.admin_url + "/health", timeout=5).json()["is_leader"]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, the lease stays until it expires."""
        if self.running:
            self.proc.kill()
        self._reap()

    def terminate(self, timeout: float = 10.0) -> int:
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
        return self._reap(timeout)

    def _reap(self, timeout: float = 10.0) -> int:
        if self.proc is None:
            return 0
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()
        return code


@pytest.fixture
def spawn_controller(tmp_path):
    """spawn_controller(port=0, admin_token=None, redis_prefix=None, extra=None) -> ControllerProcess"""
    started: list[ControllerProcess] = []

    def spawn(**kwargs) -> ControllerProcess:
        process = ControllerProcess(tmp_path, **kwargs)
        started.append(process)
        return process.start()

    yield spawn
    for process in started:
        process.kill()


@pytest.fixture
def redis_prefix():
    """A fresh key prefix in the test Redis; every key under it is deleted afterwards."""
    if not redis_available():
        pytest.fail(f"no Redis at {REDIS_URL}: these tests need a real Redis (.ci/run starts one)")
    import redis

    prefix = f"mmtest:{uuid.uuid4().hex[:10]}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=prefix + "*"):
        client.delete(key)
    client.close()


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
