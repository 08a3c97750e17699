"""`Store`: the small shared state the services keep — JSON values, hashes, counters, change
notifications and leases — in memory (one process) or in Redis (several processes).

    store = open_store(os.environ.get("MINDMOTOR_REDIS_URL"), prefix="mindmotor:")
    await store.hset("instances", "w-1", {"address": "10.0.0.5:50051"})
    ok = await store.hcompare_and_set("instances", "w-1", old, new)  # optimistic update
    async with store.subscribe("routing") as messages:
        async for message in messages: ...
    if await store.try_acquire_lease("controller:leader", my_id, ttl_s=2.0): ...

Values are anything `json.dumps` takes; they are serialized canonically (sorted keys), so a
compare-and-set compares the stored text with the canonical text of the expected value. Every key
and channel lives under the store's prefix (Redis default `mindmotor:`), so several deployments
(or tests) can share one Redis. Errors talking to the backend raise `StoreUnavailable`; so does a
Redis that does not answer within the timeout (connecting and each command; default
`DEFAULT_TIMEOUT_S`, or `MINDMOTOR_REDIS_TIMEOUT_S` in the environment), so a Redis that hangs
never hangs a service.

`MemoryStore` is atomic because every operation completes without yielding to the event loop;
`RedisStore` is atomic per command and uses Lua scripts for compare-and-set and the leases
(`SET NX PX` to acquire; compare-the-holder-then-`PEXPIRE`/`DEL` to renew/release).
"""

from __future__ import annotations

import abc
import asyncio
import json
import os
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from .redact import redact, register_url

DEFAULT_PREFIX = "mindmotor:"
DEFAULT_TIMEOUT_S = 2.0
TIMEOUT_ENV = "MINDMOTOR_REDIS_TIMEOUT_S"


def redis_timeout_s() -> float:
    """The Redis timeout of the stores: `MINDMOTOR_REDIS_TIMEOUT_S`, else `DEFAULT_TIMEOUT_S`."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be positive, got {text!r}")
    return value


class StoreUnavailable(RuntimeError):
    """The backend did not answer (Redis down, connection lost)."""


def dumps(value: Any) -> str:
    """The canonical text of a value: what is stored and what compare-and-set compares."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Store(abc.ABC):
    """Async key/value, hash, counter, pub/sub and lease operations under one key prefix."""

    prefix: str

    # ---- plain values -------------------------------------------------------------------
    @abc.abstractmethod
    async def get(self, key: str) -> Any | None: ...

    @abc.abstractmethod
    async def set(self, key: str, value: Any, ttl_s: float | None = None) -> None: ...

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """True if the key existed."""

    @abc.abstractmethod
    async def incr(self, key: str, amount: int = 1) -> int:
        """Add to an integer counter (missing: 0) and return the new value."""

    # ---- hashes -------------------------------------------------------------------------
    @abc.abstractmethod
    async def hget(self, key: str, field: str) -> Any | None: ...

    @abc.abstractmethod
    async def hgetall(self, key: str) -> dict[str, Any]: ...

    @abc.abstractmethod
    async def hset(self, key: str, field: str, value: Any) -> None: ...

    @abc.abstractmethod
    async def hdel(self, key: str, field: str) -> bool:
        """True if the field existed."""

    @abc.abstractmethod
    async def hcompare_and_set(self, key: str, field: str, expected: Any | None, new: Any | None) -> bool:
        """Write `new` (None: delete the field) only if the field now holds `expected`
        (None: the field must not exist). True if written."""

    # ---- change notification ------------------------------------------------------------
    @abc.abstractmethod
    async def publish(self, channel: str, message: Any) -> None: ...

    @abc.abstractmethod
    def subscribe(self, channel: str):
        """`async with store.subscribe(ch) as messages: async for m in messages`. Only messages
        published after the subscription is open arrive."""

    # ---- leases -------------------------------------------------------------------------
    @abc.abstractmethod
    async def try_acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take the lease if it is free (or already ours: then it is renewed). True if held."""

    @abc.abstractmethod
    async def renew_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Extend our lease by `ttl_s` from now. False if it is not (or no longer) ours."""

    @abc.abstractmethod
    async def release_lease(self, name: str, holder: str) -> bool:
        """Give the lease up if it is ours. True if it was."""

    @abc.abstractmethod
    async def lease_holder(self, name: str) -> str | None: ...

    # ---- lifecycle ----------------------------------------------------------------------
    @abc.abstractmethod
    async def clear(self) -> int:
        """Delete every key under the prefix; returns how many. For tests and resets."""

    async def close(self) -> None:
        return None

    @property
    @abc.abstractmethod
    def kind(self) -> str:
        """"memory" or "redis"."""


# ================================================================================================


class MemoryStore(Store):
    """One process's store: nothing to install; lost when the process exits."""

    kind = "memory"

    def __init__(self, prefix: str = DEFAULT_PREFIX, clock: Callable[[], float] = time.monotonic):
        self.prefix = prefix
        self.clock = clock                                        # what TTLs and leases expire by
        self._values: dict[str, tuple[str, float | None]] = {}   # key -> (text, expiry on `clock`)
        self._hashes: dict[str, dict[str, str]] = {}
        self._subscribers: dict[str, set[asyncio.Queue]] = {}

    def _live_value(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        text, expires = entry
        if expires is not None and self.clock() >= expires:
            del self._values[key]
            return None
        return text

    async def get(self, key):
        text = self._live_value(key)
        return None if text is None else json.loads(text)

    async def set(self, key, value, ttl_s=None):
        self._values[key] = (dumps(value), None if ttl_s is None else self.clock() + ttl_s)

    async def delete(self, key):
        existed = self._live_value(key) is not None or key in self._hashes
        self._values.pop(key, None)
        self._hashes.pop(key, None)
        return existed

    async def incr(self, key, amount=1):
        value = int(json.loads(self._live_value(key) or "0")) + amount
        self._values[key] = (dumps(value), None)
        return value

    async def hget(self, key, field):
        text = self._hashes.get(key, {}).get(field)
        return None if text is None else json.loads(text)

    async def hgetall(self, key):
        return {f: json.loads(t) for f, t in self._hashes.get(key, {}).items()}

    async def hset(self, key, field, value):
        self._hashes.setdefault(key, {})[field] = dumps(value)

    async def hdel(self, key, field):
        fields = self._hashes.get(key, {})
        existed = fields.pop(field, None) is not None
        if not fields:
            self._hashes.pop(key, None)
        return existed

    async def hcompare_and_set(self, key, field, expected, new):
        current = self._hashes.get(key, {}).get(field)
        if current != (None if expected is None else dumps(expected)):
            return False
        if new is None:
            await self.hdel(key, field)
        else:
            await self.hset(key, field, new)
        return True

    async def publish(self, channel, message):
        text = dumps(message)
        for queue in self._subscribers.get(channel, ()):
            queue.put_nowait(text)

    @asynccontextmanager
    async def subscribe(self, channel):
        queue: asyncio.Queue = asyncio.Queue()
        self._subscribers.setdefault(channel, set()).add(queue)

        async def messages() -> AsyncIterator[Any]:
            while True:
                yield json.loads(await queue.get())

        try:
            yield messages()
        finally:
            self._subscribers[channel].discard(queue)

    def _lease_key(self, name: str) -> str:
        return f"lease:{name}"

    async def try_acquire_lease(self, name, holder, ttl_s):
        current = self._live_value(self._lease_key(name))
        if current is not None and json.loads(current) != holder:
            return False
        await self.set(self._lease_key(name), holder, ttl_s)
        return True

    async def renew_lease(self, name, holder, ttl_s):
        current = self._live_value(self._lease_key(name))
        if current is None or json.loads(current) != holder:
            return False
        await self.set(self._lease_key(name), holder, ttl_s)
        return True

    async def release_lease(self, name, holder):
        current = self._live_value(self._lease_key(name))
        if current is None or json.loads(current) != holder:
            return False
        self._values.pop(self._lease_key(name), None)
        return True

    async def lease_holder(self, name):
        current = self._live_value(self._lease_key(name))
        return None if current is None else json.loads(current)

    async def clear(self):
        count = len(self._values) + len(self._hashes)
        self._values.clear()
        self._hashes.clear()
        return count


# ================================================================================================

# KEYS[1] = hash; ARGV = field, expect_present ("1"/"0"), expected, write ("1"/"0"), new
_CAS_SCRIPT = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  if current ~= ARGV[3] then return 0 end
elseif current then
  return 0
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[5])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
"""

# KEYS[1] = lease key; ARGV = holder, ttl ms
_RENEW_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] = lease key; ARGV = holder
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisStore(Store):
    """The store in Redis (redis.asyncio), every key under `prefix`. Leases are plain keys
    holding the holder's id with a millisecond expiry."""

    kind = "redis"

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, socket_timeout_s: float | None = None):
        import redis.asyncio as redis_asyncio

        register_url(url)             # its password is masked in any log line or error from now on
        self.url = url
        self.prefix = prefix
        socket_timeout_s = redis_timeout_s() if socket_timeout_s is None else socket_timeout_s
        self.timeout_s = socket_timeout_s
        self._redis = redis_asyncio.from_url(url, decode_responses=True, socket_timeout=socket_timeout_s,
                                             socket_connect_timeout=socket_timeout_s)
        self._cas = self._redis.register_script(_CAS_SCRIPT)
        self._renew = self._redis.register_script(_RENEW_SCRIPT)
        self._release = self._redis.register_script(_RELEASE_SCRIPT)

    def _k(self, key: str) -> str:
        return self.prefix + key

    @asynccontextmanager
    async def _errors(self):
        import redis

        try:
            yield
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(redact(f"redis at {self.url}: {type(exc).__name__}: {exc}")) from exc

    async def ping(self) -> None:
        async with self._errors():
            await self._redis.ping()

    async def get(self, key):
        async with self._errors():
            text = await self._redis.get(self._k(key))
        return None if text is None else json.loads(text)

    async def set(self, key, value, ttl_s=None):
        px = None if ttl_s is None else max(1, int(ttl_s * 1000))
        async with self._errors():
            await self._redis.set(self._k(key), dumps(value), px=px)

    async def delete(self, key):
        async with self._errors():
            return bool(await self._redis.delete(self._k(key)))

    async def incr(self, key, amount=1):
        async with self._errors():
            return int(await self._redis.incrby(self._k(key), amount))

    async def hget(self, key, field):
        async with self._errors():
            text = await self._redis.hget(self._k(key), field)
        return None if text is None else json.loads(text)

    async def hgetall(self, key):
        async with self._errors():
            raw = await self._redis.hgetall(self._k(key))
        return {f: json.loads(t) for f, t in raw.items()}

    async def hset(self, key, field, value):
        async with self._errors():
            await self._redis.hset(self._k(key), field, dumps(value))

    async def hdel(self, key, field):
        async with self._errors():
            return bool(await self._redis.hdel(self._k(key), field))

    async def hcompare_and_set(self, key, field, expected, new):
        args = [field, "0" if expected is None else "1", "" if expected is None else dumps(expected),
                "0" if new is None else "1", "" if new is None else dumps(new)]
        async with self._errors():
            return bool(await self._cas(keys=[self._k(key)], args=args))

    async def publish(self, channel, message):
        async with self._errors():
            await self._redis.publish(self._k(channel), dumps(message))

    @asynccontextmanager
    async def subscribe(self, channel):
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        async with self._errors():
            await pubsub.subscribe(self._k(channel))

        async def messages() -> AsyncIterator[Any]:
            while True:
                async with self._errors():
                    message = await pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    yield json.loads(message["data"])

        try:
            yield messages()
        finally:
            try:
                await pubsub.aclose()
            except Exception:  # noqa: BLE001 — the connection may already be gone
                pass

    def _lease_key(self, name: str) -> str:
        return self._k(f"lease:{name}")

    async def try_acquire_lease(self, name, holder, ttl_s):
        async with self._errors():
            if await self._redis.set(self._lease_key(name), holder, nx=True, px=max(1, int(ttl_s * 1000))):
                return True
        return await self.renew_lease(name, holder, ttl_s)

    async def renew_lease(self, name, holder, ttl_s):
        async with self._errors():
            return bool(await self._renew(keys=[self._lease_key(name)], args=[holder, max(1, int(ttl_s * 1000))]))

    async def release_lease(self, name, holder):
        async with self._errors():
            return bool(await self._release(keys=[self._lease_key(name)], args=[holder]))

    async def lease_holder(self, name):
        async with self._errors():
            return await self._redis.get(self._lease_key(name))

    async def clear(self):
        count = 0
        async with self._errors():
            async for key in self._redis.scan_iter(match=_glob_escape(self.prefix) + "*", count=500):
                count += await self._redis.delete(key)
        return count

    async def close(self):
        try:
            await self._redis.aclose()
        except Exception:  # noqa: BLE001
            pass


def open_store(url: str | None, prefix: str = DEFAULT_PREFIX) -> Store:
    """`None`, "" or "memory://": a `MemoryStore`; "redis://…" / "rediss://…" / "unix://…": a
    `RedisStore` (nothing is contacted until the first operation); "file:PATH": a `FileStore`
    (one process's state kept in a file: common/file_store.py)."""
    if not url or url.startswith("memory:"):
        return MemoryStore(prefix)
    if url.startswith("file:"):
        from .file_store import FileStore

        return FileStore(url[len("file:"):], prefix)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url, prefix)
    raise ValueError(f"unsupported store URL {url!r} (expected redis://host:port/db, file:PATH or memory://)")
