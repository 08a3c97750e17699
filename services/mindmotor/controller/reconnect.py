"""`Reconnector`: which controller address to try next and how long to wait first — round robin
over the addresses (a session that breaks moves on to the next controller: the failover), and
exponential backoff with jitter while they keep failing, reset by a session that works."""

from __future__ import annotations

import asyncio
import random
from typing import Sequence


def parse_addresses(controllers: str | Sequence[str]) -> list[str]:
    """"h1:p1,h2:p2" or a list of addresses."""
    items = controllers.split(",") if isinstance(controllers, str) else list(controllers)
    addresses = [a.strip() for a in items if a and a.strip()]
    if not addresses:
        raise ValueError("at least one controller address is required")
    return addresses


class Reconnector:
    def __init__(self, addresses: Sequence[str], initial_s: float = 0.05, max_s: float = 2.0):
        self.addresses = list(addresses)
        self.initial_s = initial_s
        self.max_s = max_s
        self.failures = 0
        self._index = -1

    def next_address(self) -> str:
        self._index = (self._index + 1) % len(self.addresses)
        return self.addresses[self._index]

    def succeeded(self) -> None:
        self.failures = 0

    def delay_s(self) -> float:
        if self.failures == 0:
            return 0.0
        base = min(self.max_s, self.initial_s * 2 ** (self.failures - 1))
        return base * random.uniform(0.5, 1.0)

    async def failed(self) -> None:
        """Count a failure and wait before the next attempt."""
        self.failures += 1
        await asyncio.sleep(self.delay_s())
