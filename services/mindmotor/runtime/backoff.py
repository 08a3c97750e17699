"""`RestartBackoff`: how long a process that died waits before it is started again — doubling with
each death in a row that came soon after its start, up to a ceiling, so one that cannot start does
not spin the machine, and one that ran fine for a while and then died comes back after the initial
delay only. The Deployer's replicas (deployer/reconcile.py) and the supervised services
(supervisor.py) wait by it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartBackoff:
    initial_s: float = 0.5
    max_s: float = 30.0

    def delay(self, failures: int) -> float:
        """The wait after `failures` quick deaths in a row."""
        return min(self.max_s, self.initial_s * 2 ** max(0, failures - 1))

    def due(self, failures: int, died_at: float, now: float) -> bool:
        """Whether one that died at `died_at`, its `failures`-th quick death in a row, may start again."""
        return now >= died_at + self.delay(failures)
