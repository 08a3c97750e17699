"""Redis-backed controllers: recovery after a restart, and a standby taking over from a leader
killed with SIGKILL (within two lease periods), with instances and watchers failing over."""

from __future__ import annotations

import time

import httpx
import redis

import pytest

from mindmotor.common.ports import free_port
from mindmotor.common.store import RedisStore
from mindmotor.controller.registry import INSTANCES

from service_processes import DEAD_S, LEASE_S, REDIS_URL

from .conftest import eventually, state_of

pytestmark = pytest.mark.asyncio
SLACK = 2.0


async def silent_longer_than_dead_timeout(store: RedisStore, instance_id: str) -> bool:
    """Whether the stored record's last heartbeat is older than the dead timeout."""
    record = await store.hget(INSTANCES, instance_id)
    return time.time() - record["last_heartbeat"] > DEAD_S + 0.1


async def test_restart_recovers_the_registry(spawn_controller, make_instance, make_watcher, redis_prefix):
    port = free_port()
    ctrl = spawn_controller(port=port, redis_prefix=redis_prefix)
    assert ctrl.is_leader()
    a = await make_instance(ctrl.address, "a", model="m", deployment="d", version="v1")
    b = await make_instance(ctrl.address, "b")
    watcher = await make_watcher(ctrl.address)
    await watcher.wait_for(lambda t: state_of(t, "a") == state_of(t, "b") == "ready", timeout=3)

    ctrl.kill()
    await b.agent.stop(deregister=False)          # b dies while no controller runs...
    store = RedisStore(REDIS_URL, prefix=redis_prefix)
    try:                                          # ...for longer than the dead timeout
        await eventually(lambda: silent_longer_than_dead_timeout(store, "b"), timeout=DEAD_S + SLACK)
    finally:
        await store.close()
    started = time.monotonic()                    # before: its dead timeout runs from its own start
    restarted = spawn_controller(port=port, redis_prefix=redis_prefix)   # same address: clients reconnect

    records = restarted.instances()
    # state kept (a heartbeat late on a loaded host may already have made one suspect, never dead)
    assert records["a"]["deployment"] == "d" and records["a"]["state"] in ("ready", "suspect")
    assert records["b"]["state"] in ("ready", "suspect")   # not declared dead at once: a full timeout first
    await eventually(restarted.is_leader, timeout=LEASE_S * 2 + SLACK)   # the killed one's lease expires

    await watcher.wait_for(lambda t: t.controller_id != "" and state_of(t, "b") is None, timeout=DEAD_S * 2 + SLACK)
    assert time.monotonic() - started >= DEAD_S * 0.9
    assert state_of(watcher.table, "a") == "ready"
    assert a.agent.registered.is_set() and a.agent.sessions >= 2
    assert restarted.instances()["b"]["state"] == "dead"


async def test_standby_takes_over_when_the_leader_is_killed(spawn_controller, make_instance, make_watcher,
                                                            redis_prefix):
    first = spawn_controller(redis_prefix=redis_prefix)
    second = spawn_controller(redis_prefix=redis_prefix)
    assert first.is_leader() and not second.is_leader()
    addresses = [first.address, second.address]

    a = await make_instance(addresses, "a")
    b = await make_instance(addresses, "b")
    assert a.agent.controller == first.address
    watcher = await make_watcher(addresses)
    standby_watcher = await make_watcher(second.address)     # every controller serves Watch
    await standby_watcher.wait_for(lambda t: state_of(t, "a") == state_of(t, "b") == "ready", timeout=3)
    assert not standby_watcher.table.from_leader

    first.kill()
    killed = time.monotonic()
    await eventually(second.is_leader, timeout=2 * LEASE_S + SLACK)
    assert time.monotonic() - killed <= 2 * LEASE_S + 0.5         # within two lease periods (+ polling)

    # instances and the watcher fail over to the new leader; the table stays current
    await eventually(lambda: a.agent.controller == second.address and a.agent.registered.is_set(), timeout=5)
    await watcher.wait_for(lambda t: t.controller_id and watcher.controller == second.address
                           and t.from_leader, timeout=5)
    assert state_of(watcher.table, "a") == "ready"

    await b.agent.stop(deregister=False)                           # the new leader runs the timeouts
    await watcher.wait_for(lambda t: state_of(t, "b") is None, timeout=DEAD_S + SLACK)
    c = await make_instance(addresses, "c")                        # and registrations
    await watcher.wait_for(lambda t: state_of(t, "c") == "ready", timeout=3)
    assert c.agent.controller == second.address
    assert state_of(watcher.table, "a") == "ready"


async def test_sigterm_releases_the_lease(spawn_controller, redis_prefix):
    first = spawn_controller(redis_prefix=redis_prefix)
    second = spawn_controller(redis_prefix=redis_prefix)
    assert first.is_leader()
    first_id = httpx.get(first.admin_url + "/health", timeout=5).json()["controller_id"]
    assert first.terminate() == 0
    # released on the way out: the lease key is gone (or already the standby's) the moment the
    # process has exited, rather than left to expire
    holder = redis.Redis.from_url(REDIS_URL).get(f"{redis_prefix}lease:controller:leader")
    assert holder is None or first_id.encode() not in holder
    await eventually(second.is_leader, timeout=LEASE_S + SLACK)
