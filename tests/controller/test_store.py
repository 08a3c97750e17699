"""One contract for every Store: MemoryStore and RedisStore (real Redis, a unique key prefix).

Expiry (TTLs, leases): the memory store runs on a `FakeClock` that the test moves past the TTL; a
Redis key expires on the server's clock, so there the test waits until Redis reports it gone."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from fake_clock import FakeClock
from mindmotor.common.store import MemoryStore, RedisStore, StoreUnavailable, open_store

from service_processes import REDIS_URL

from .conftest import eventually

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture(params=["memory", "redis"])
async def store(request):
    if request.param == "memory":
        s = MemoryStore(prefix="t:", clock=FakeClock())
        yield s
        return
    prefix = request.getfixturevalue("redis_prefix")
    s = RedisStore(REDIS_URL, prefix=prefix)
    yield s
    await s.clear()
    await s.close()


async def after(store, seconds: float, expired) -> None:
    """Let `seconds` pass for the store, then `expired()` (async) must hold: the memory store's fake
    clock is moved on; Redis expires keys on its own clock, so it is given until then (and a margin)."""
    if isinstance(store, MemoryStore):
        store.clock.advance(seconds)
        assert await expired()
    else:
        await eventually(expired, timeout=seconds + 5, interval=0.02)


async def test_values_and_counters(store):
    assert await store.get("k") is None
    await store.set("k", {"a": [1, 2.5, "x"], "b": None})
    assert await store.get("k") == {"a": [1, 2.5, "x"], "b": None}
    assert await store.delete("k") is True
    assert await store.delete("k") is False
    assert await store.incr("n") == 1
    assert await store.incr("n", 5) == 6
    assert await store.get("n") == 6


async def test_value_ttl(store):
    await store.set("short", "v", ttl_s=0.1)
    assert await store.get("short") == "v"
    await after(store, 0.1, lambda: _is_none(store.get("short")))


async def _is_none(value) -> bool:
    return await value is None


async def test_hashes(store):
    assert await store.hgetall("h") == {}
    await store.hset("h", "a", {"x": 1})
    await store.hset("h", "b", 2)
    assert await store.hget("h", "a") == {"x": 1}
    assert await store.hgetall("h") == {"a": {"x": 1}, "b": 2}
    assert await store.hdel("h", "a") is True
    assert await store.hdel("h", "a") is False
    assert await store.hgetall("h") == {"b": 2}


async def test_compare_and_set(store):
    assert await store.hcompare_and_set("h", "f", None, {"v": 1}) is True      # create if absent
    assert await store.hcompare_and_set("h", "f", None, {"v": 9}) is False     # exists now
    assert await store.hcompare_and_set("h", "f", {"v": 2}, {"v": 3}) is False  # stale
    current = await store.hget("h", "f")
    assert await store.hcompare_and_set("h", "f", current, {"v": 2, "a": "b"}) is True
    # key order of the expected value does not matter: values are compared canonically
    assert await store.hcompare_and_set("h", "f", {"a": "b", "v": 2}, None) is True  # delete
    assert await store.hget("h", "f") is None


async def test_publish_subscribe(store):
    async with store.subscribe("ch") as messages:
        await store.publish("ch", {"version": 1})
        await store.publish("other", "ignored")
        await store.publish("ch", {"version": 2})
        received = [await asyncio.wait_for(anext(messages), 2) for _ in range(2)]
    assert received == [{"version": 1}, {"version": 2}]


async def test_leases(store):
    assert await store.lease_holder("L") is None
    assert await store.try_acquire_lease("L", "a", ttl_s=0.3) is True
    assert await store.try_acquire_lease("L", "b", ttl_s=0.3) is False
    assert await store.try_acquire_lease("L", "a", ttl_s=0.3) is True        # ours: renewed
    assert await store.lease_holder("L") == "a"
    assert await store.renew_lease("L", "b", ttl_s=0.3) is False
    assert await store.release_lease("L", "b") is False
    assert await store.renew_lease("L", "a", ttl_s=0.15) is True
    await after(store, 0.15, lambda: _is_none(store.lease_holder("L")))     # expired
    assert await store.renew_lease("L", "a", ttl_s=0.3) is False
    assert await store.try_acquire_lease("L", "b", ttl_s=5) is True
    assert await store.release_lease("L", "a") is False
    assert await store.release_lease("L", "b") is True
    assert await store.lease_holder("L") is None


async def test_clear(store):
    await store.set("a", 1)
    await store.hset("h", "f", 1)
    assert await store.clear() >= 2
    assert await store.get("a") is None and await store.hgetall("h") == {}


async def test_redis_prefixes_are_isolated(redis_prefix):
    one, two = RedisStore(REDIS_URL, prefix=redis_prefix + "one:"), RedisStore(REDIS_URL, prefix=redis_prefix + "two:")
    try:
        await one.set("k", 1)
        await one.hset("h", "f", 1)
        assert await two.get("k") is None and await two.hgetall("h") == {}
        await two.clear()
        assert await one.get("k") == 1
    finally:
        await one.clear()
        await one.close()
        await two.close()


async def test_unreachable_redis_raises_store_unavailable():
    from mindmotor.common.ports import free_port

    s = RedisStore(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.5)
    with pytest.raises(StoreUnavailable):
        await s.get("k")
    await s.close()


async def test_open_store_selects_the_backend():
    assert isinstance(open_store(None), MemoryStore)
    assert isinstance(open_store("memory://"), MemoryStore)
    redis_store = open_store("redis://127.0.0.1:6379/0", prefix="p:")
    assert isinstance(redis_store, RedisStore) and redis_store.prefix == "p:"
    with pytest.raises(ValueError):
        open_store("etcd://x")


async def test_a_hung_redis_raises_store_unavailable_after_the_timeout(monkeypatch):
    """SIGSTOPped redis-server: it accepts the connection but never answers; every call gives up."""
    from mindmotor.common.redis_testing import RedisServer

    monkeypatch.setenv("MINDMOTOR_REDIS_TIMEOUT_S", "0.3")
    with RedisServer() as server:
        s = open_store(server.url, prefix="hung:")
        assert s.timeout_s == 0.3
        await s.set("k", 1)
        server.freeze()
        try:
            for call in (s.get("k"), s.hgetall("h"), s.try_acquire_lease("l", "me", 1.0), s.incr("n")):
                with pytest.raises(StoreUnavailable, match="Timeout"):
                    await call
        finally:
            server.thaw()
        assert await s.get("k") == 1                           # and it works again once Redis does
        await s.close()


async def test_the_redis_timeout_setting_is_checked(monkeypatch):
    from mindmotor.common.store import DEFAULT_TIMEOUT_S, redis_timeout_s

    monkeypatch.delenv("MINDMOTOR_REDIS_TIMEOUT_S", raising=False)
    assert redis_timeout_s() == DEFAULT_TIMEOUT_S == 2.0
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("MINDMOTOR_REDIS_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match="MINDMOTOR_REDIS_TIMEOUT_S"):
            redis_timeout_s()
