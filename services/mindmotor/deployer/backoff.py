"""`RestartBackoff`: how long a crashed replica waits before it is started again — doubling with
each crash in a row that came soon after its start (`Replica.failures`), up to a ceiling, so a
version that cannot start does not spin the machine, and a replica that ran fine for a while and
then crashed comes back after the initial delay only."""

from __future__ import annotations

from dataclasses import dataclass

from .backends.base import Replica


@dataclass(frozen=True)
class RestartBackoff:
    initial_s: float = 0.5
    max_s: float = 30.0

    def delay(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * 2 ** max(0, failures - 1))

    def due(self, replica: Replica, now: float) -> bool:
        return now >= replica.exited_at + self.delay(replica.failures)
