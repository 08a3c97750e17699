"""Per-key rate limits: a token bucket per key (capacity `burst`, refilled at `rpm`/60 per second).

`MemoryRateLimiter` keeps the buckets in this process; `RedisRateLimiter` (rate_limit_redis.py)
keeps them in Redis so that several coordinators share one limit per key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_s: float = 0.0          # when not allowed: until one token is back


class RateLimiter(Protocol):
    async def acquire(self, key: str) -> Decision: ...

    async def close(self) -> None: ...


class MemoryRateLimiter:
    def __init__(self, rpm: float, burst: int | None = None, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000):
        self.rate = rpm / 60.0
        self.capacity = float(burst or max(1, round(rpm)))
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}     # key -> (tokens, last refill)

    def _take(self, key: str) -> Decision:
        now = self.clock()
        tokens, last = self._buckets.get(key, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self._store(key, tokens - 1.0, now)
            return Decision(True)
        self._store(key, tokens, now)
        return Decision(False, (1.0 - tokens) / self.rate)

    def _store(self, key: str, tokens: float, now: float) -> None:
        if key not in self._buckets and len(self._buckets) >= self.max_keys:
            self._buckets.pop(next(iter(self._buckets)))        # forget the oldest key
        self._buckets[key] = (tokens, now)

    async def acquire(self, key: str) -> Decision:
        return self._take(key)

    async def close(self) -> None:
        pass
