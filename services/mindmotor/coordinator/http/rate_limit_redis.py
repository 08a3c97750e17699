"""`RedisRateLimiter`: the token buckets in Redis, one hash per key under `prefix`, updated by
one Lua script (read, refill, take, write, expire — atomic, on Redis's own clock, so every
coordinator sees the same bucket).

A rate limit must not take the service down, nor slow it: every call has a short timeout
(`timeout_s`, connecting included); a request whose call fails is let through ("fails open"); after
a failure Redis is skipped for `open_s` (a circuit breaker, then one probe at a time), so a Redis
that hangs costs one timeout per `open_s`, not one per request. Each request let through is
counted (`on_fail_open(reason)`: "error" — the call failed — or "skipped" — the breaker was open);
the outage is logged once when it starts and once when Redis answers again.
"""

from __future__ import annotations

import logging
from typing import Callable

from mindmotor.common.circuit_breaker import CircuitBreaker

from mindmotor.coordinator.http.rate_limit import Decision

log = logging.getLogger("mindmotor.coordinator")

TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
local retry = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  retry = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)
return {allowed, tostring(retry)}
"""


class RedisRateLimiter:
    def __init__(self, url: str, rpm: float, burst: int | None = None, prefix: str = "mindmotor:ratelimit:",
                 timeout_s: float = 0.5, open_s: float = 5.0,
                 on_fail_open: Callable[[str], None] | None = None):
        import redis.asyncio as redis

        self.rate = rpm / 60.0
        self.capacity = float(burst or max(1, round(rpm)))
        self.prefix = prefix
        self.on_fail_open = on_fail_open
        self.breaker = CircuitBreaker(open_s)
        self.let_through = 0                  # requests let through during the current outage
        self._redis = redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._script = self._redis.register_script(TOKEN_BUCKET_LUA)

    async def acquire(self, key: str) -> Decision:
        if not self.breaker.allow():
            return self._fail_open("skipped")
        try:
            allowed, retry = await self._script(keys=[self.prefix + key], args=[self.rate, self.capacity])
        except Exception as exc:  # noqa: BLE001 — redis.RedisError, OSError, a timeout: fail open
            if self.breaker.failed():
                log.warning("rate limit store unavailable; letting requests through until it answers",
                            extra={"error": f"{type(exc).__name__}: {exc}", "skip_s": self.breaker.open_s})
            return self._fail_open("error")
        if self.breaker.succeeded():
            log.info("rate limit store answers again", extra={"let_through": self.let_through})
            self.let_through = 0
        return Decision(bool(int(allowed)), float(retry))

    def _fail_open(self, reason: str) -> Decision:
        self.let_through += 1
        if self.on_fail_open is not None:
            self.on_fail_open(reason)
        return Decision(True)

    async def close(self) -> None:
        await self._redis.aclose()
