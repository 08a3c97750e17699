"""`Admission`: at most `max_requests` outstanding choices per model (MindIE's `max_requests`), and
per SLO class at most its `max_share` of them (slo_classes.py). Beyond that a request is refused
with 429 and `Retry-After` — at once, or (with `admission_wait_s`) after waiting that long for room
in a queue served most urgent class first, first come first served within a class: batch work
queues here while interactive work is admitted. Never queued unboundedly: the wait is bounded and
the waiters count in `mindmotor_pending_queue_size{class}`. A request whose choices alone exceed the
limit could never be admitted: `planning` answers it 400 first (`request_rules.check_choices`)."""

from __future__ import annotations

import asyncio
import itertools
import math

from mindmotor.coordinator.http.errors import TooManyRequests
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.slo_classes import SLOClass

STANDARD = SLOClass()


class Admission:
    def __init__(self, max_requests: int, retry_after_s: float, metrics: CoordinatorMetrics,
                 classes: dict[str, SLOClass] | None = None, wait_s: float = 0.0):
        self.max_requests = max_requests
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.classes = classes or {}
        self.wait_s = wait_s
        self.outstanding: dict[str, int] = {}
        self.by_class: dict[tuple[str, str], int] = {}
        self._waiters: dict[str, list[tuple[int, int, str, int, asyncio.Future]]] = {}   # model -> sorted
        self._order = itertools.count()

    def class_limit(self, slo_class: str) -> int:
        share = self.classes.get(slo_class, STANDARD).max_share
        return self.max_requests if share >= 1 else max(1, math.floor(share * self.max_requests))

    def _fits(self, model: str, choices: int, slo_class: str) -> bool:
        return (self.outstanding.get(model, 0) + choices <= self.max_requests
                and self.by_class.get((model, slo_class), 0) + choices <= self.class_limit(slo_class))

    async def acquire(self, model: str, choices: int = 1, slo_class: str = "standard") -> "Ticket":
        """Count `choices` against the model's and the class's limits until the ticket is released.
        When they do not fit now (or a request at least as urgent waits): 429 at once, or with
        `wait_s` after waiting up to that long for room (most urgent class first)."""
        waiting = self._waiters.get(model)
        if self._fits(model, choices, slo_class) and not (waiting and waiting[0][0] <= self._priority(slo_class)):
            return self._take(model, choices, slo_class)
        if self.wait_s <= 0:
            self._refuse(model, slo_class)
        future = asyncio.get_running_loop().create_future()
        entry = (self._priority(slo_class), next(self._order), slo_class, choices, future)
        queue = self._waiters.setdefault(model, [])
        queue.append(entry)
        queue.sort(key=lambda e: e[:2])
        self.metrics.pending.labels(slo_class).inc()
        try:
            await asyncio.wait_for(asyncio.shield(future), self.wait_s)
            return future.result()
        except asyncio.TimeoutError:
            if future.done() and not future.cancelled():     # admitted just as the wait ran out
                return future.result()
            self._refuse(model, slo_class)
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():     # the client left as it was admitted
                future.result().release()
            raise
        finally:
            if entry in queue:
                queue.remove(entry)
            self.metrics.pending.labels(slo_class).dec()
            if not future.done():
                future.cancel()
            self._wake(model)

    def _priority(self, slo_class: str) -> int:
        return self.classes.get(slo_class, STANDARD).priority

    def _refuse(self, model: str, slo_class: str):
        self.metrics.rejected.labels("queue_full").inc()
        current = self.outstanding.get(model, 0)
        raise TooManyRequests(
            f"model {model!r} has {current} requests outstanding (limit {self.max_requests}; class "
            f"{slo_class!r}: {self.by_class.get((model, slo_class), 0)} of {self.class_limit(slo_class)}); "
            "retry later", retry_after_s=self.retry_after_s, code="queue_full")

    def _take(self, model: str, choices: int, slo_class: str) -> "Ticket":
        self.outstanding[model] = self.outstanding.get(model, 0) + choices
        self.by_class[(model, slo_class)] = self.by_class.get((model, slo_class), 0) + choices
        self.metrics.outstanding.labels(model).set(self.outstanding[model])
        return Ticket(self, model, choices, slo_class)

    def _release(self, model: str, choices: int, slo_class: str) -> None:
        self.outstanding[model] -= choices
        self.by_class[(model, slo_class)] -= choices
        self.metrics.outstanding.labels(model).set(self.outstanding[model])
        self._wake(model)

    def _wake(self, model: str) -> None:
        """Admit waiters in order while the first fits (the first one that does not blocks the
        rest: a less urgent request never overtakes a more urgent one)."""
        queue = self._waiters.get(model, [])
        while queue:
            _, _, slo_class, choices, future = queue[0]
            if future.done():
                queue.pop(0)
                continue
            if not self._fits(model, choices, slo_class):
                return
            queue.pop(0)
            future.set_result(self._take(model, choices, slo_class))


class Ticket:
    """An admitted request's place; `release` (idempotent) gives it back."""

    def __init__(self, admission: Admission, model: str, choices: int, slo_class: str = "standard"):
        self._admission = admission
        self._model = model
        self._choices = choices
        self._class = slo_class
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release(self._model, self._choices, self._class)
