"""`RedisRateLimiter`: the token buckets in Redis, one hash per key under `prefix`, updated by
one Lua script (read, refill, take, write, expire — atomic, on Redis's own clock, so every
coordinator sees the same bucket). If Redis cannot be reached the request is let through (and
logged): a rate limit must not take the service down."""

from __future__ import annotations

import logging

from .rate_limit import Decision

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
    def __init__(self, url: str, rpm: float, burst: int | None = None, prefix: str = "mindmotor:ratelimit:"):
        import redis.asyncio as redis

        self.rate = rpm / 60.0
        self.capacity = float(burst or max(1, round(rpm)))
        self.prefix = prefix
        self._redis = redis.from_url(url)
        self._script = self._redis.register_script(TOKEN_BUCKET_LUA)

    async def acquire(self, key: str) -> Decision:
        try:
            allowed, retry = await self._script(keys=[self.prefix + key], args=[self.rate, self.capacity])
        except Exception as exc:  # redis.RedisError, OSError: fail open
            log.warning("rate limit store unavailable; request let through", extra={"error": repr(exc)})
            return Decision(True)
        return Decision(bool(int(allowed)), float(retry))

    async def close(self) -> None:
        await self._redis.aclose()
