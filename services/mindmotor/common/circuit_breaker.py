"""`CircuitBreaker`: stop calling a dependency that just failed, for a while.

    breaker = CircuitBreaker(open_s=5.0)
    if breaker.allow():              # closed; or open long enough that one probe may go
        try:
            result = await call()
        except Failure:
            if breaker.failed():     # True: this failure opened it (a new outage)
                log.warning(...)
        else:
            if breaker.succeeded():  # True: this success closed it (the outage is over)
                log.info(...)
    else:
        ...                          # skipped: the fallback, without waiting for a timeout

While open, `allow` is False except for one probe at a time once `open_s` has passed since the last
failure; a failed probe keeps it open for another `open_s`, a successful one closes it. A probe that
never reports back (its caller was cancelled) is replaced by another after `open_s`.
"""

from __future__ import annotations

import time
from typing import Callable


class CircuitBreaker:
    def __init__(self, open_s: float, clock: Callable[[], float] = time.monotonic):
        self.open_s = open_s
        self.clock = clock
        self.is_open = False
        self._failed_at = 0.0
        self._probe_at: float | None = None   # when the current probe was let through

    def allow(self) -> bool:
        if not self.is_open:
            return True
        now = self.clock()
        if now - self._failed_at < self.open_s:
            return False
        if self._probe_at is not None and now - self._probe_at < self.open_s:
            return False                      # a probe is out
        self._probe_at = now
        return True

    def failed(self) -> bool:
        """Record a failure; True if it opened the breaker."""
        opened = not self.is_open
        self.is_open, self._failed_at, self._probe_at = True, self.clock(), None
        return opened

    def succeeded(self) -> bool:
        """Record a success; True if it closed the breaker."""
        closed = self.is_open
        self.is_open, self._probe_at = False, None
        return closed
