"""`Admission`: at most `max_requests` outstanding choices per model (MindIE's `max_requests`), and
per SLO class at most its `max_share` of them, per API key within a class at most the class's
`max_key_share` of that (one key's burst cannot take the whole class; slo_classes.py). Beyond that a request is refused
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
        self.by_key: dict[tuple[str, str, str], int] = {}       # (model, class, caller) -> choices
        self._waiters: dict[str, list[tuple[int, int, str, int, str, asyncio.Future]]] = {}   # model -> sorted
        self._order = itertools.count()

    def class_limit(self, slo_class: str) -> int:
        share = self.classes.get(slo_class, STANDARD).max_share
        return self.max_requests if share >= 1 else max(1, math.floor(share * self.max_requests))

    def key_limit(self, slo_class: str) -> int:
        share = self.classes.get(slo_class, STANDARD).max_key_share
        limit = self.class_limit(slo_class)
        return limit if share >= 1 else max(1, math.floor(share * limit))

    def _fits(self, model: str, choices: int, slo_class: str, caller: str = "") -> bool:
        return (self.outstanding.get(model, 0) + choices <= self.max_requests
                and self.by_class.get((model, slo_class), 0) + choices <= self.class_limit(slo_class)
                and (not caller or self.by_key.get((model, slo_class, caller), 0) + choices
                     <= self.key_limit(slo_class)))

    async def acquire(self, model: str, choices: int = 1, slo_class: str = "standard", caller: str = "") -> "Ticket":
        """Count `choices` against the model's, the class's and the caller's (its API key's digest;
        "": no key) limits until the ticket is released.
        When they do not fit now (or a request at least as urgent waits): 429 at once, or with
        `wait_s` after waiting up to that long for room (most urgent class first)."""
        waiting = self._waiters.get(model)
        if self._fits(model, choices, slo_class, caller) and \
                not (waiting and waiting[0][0] <= self._priority(slo_class)):
            return self._take(model, choices, slo_class, caller)
        if self.wait_s <= 0:
            self._refuse(model, slo_class, caller)
        future = asyncio.get_running_loop().create_future()
        entry = (self._priority(slo_class), next(self._order), slo_class, choices, caller, future)
        queue = self._waiters.setdefault(model, [])
        queue.append(entry)
        queue.sort(key=lambda e: e[:2])
        self.metrics.pending.labels(slo_class).inc()
        self._wake(model)                     # room may be there for it (those ahead held by their keys)
        try:
            await asyncio.wait_for(asyncio.shield(future), self.wait_s)
            return future.result()
        except asyncio.TimeoutError:
            if future.done() and not future.cancelled():     # admitted just as the wait ran out
                return future.result()
            self._refuse(model, slo_class, caller)
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

    def _refuse(self, model: str, slo_class: str, caller: str = ""):
        self.metrics.rejected.labels("queue_full").inc()
        current = self.outstanding.get(model, 0)
        mine = f"; this key: {self.by_key.get((model, slo_class, caller), 0)} of {self.key_limit(slo_class)}" \
            if caller else ""
        raise TooManyRequests(
            f"model {model!r} has {current} requests outstanding (limit {self.max_requests}; class "
            f"{slo_class!r}: {self.by_class.get((model, slo_class), 0)} of {self.class_limit(slo_class)}{mine}); "
            "retry later", retry_after_s=self.retry_after_s, code="queue_full")

    def _take(self, model: str, choices: int, slo_class: str, caller: str = "") -> "Ticket":
        self.outstanding[model] = self.outstanding.get(model, 0) + choices
        self.by_class[(model, slo_class)] = self.by_class.get((model, slo_class), 0) + choices
        if caller:
            self.by_key[(model, slo_class, caller)] = self.by_key.get((model, slo_class, caller), 0) + choices
        self.metrics.outstanding.labels(model).set(self.outstanding[model])
        return Ticket(self, model, choices, slo_class, caller)

    def _release(self, model: str, choices: int, slo_class: str, caller: str = "") -> None:
        self.outstanding[model] -= choices
        self.by_class[(model, slo_class)] -= choices
        if caller:
            key = (model, slo_class, caller)
            self.by_key[key] -= choices
            if not self.by_key[key]:
                del self.by_key[key]               # callers come and go: keep only those holding some
        self.metrics.outstanding.labels(model).set(self.outstanding[model])
        self._wake(model)

    def _wake(self, model: str) -> None:
        """Admit waiters in order while the first fits (the first one that does not blocks the
        rest: a less urgent request never overtakes a more urgent one). A waiter held back by its
        own key's limit is skipped, not blocking: that limit is its key's, not the class's."""
        queue = self._waiters.get(model, [])
        i = 0
        while i < len(queue):
            _, _, slo_class, choices, caller, future = queue[i]
            if future.done():
                queue.pop(i)
                continue
            if not self._fits(model, choices, slo_class):
                return
            if not self._fits(model, choices, slo_class, caller):
                i += 1
                continue
            queue.pop(i)
            future.set_result(self._take(model, choices, slo_class, caller))


class Ticket:
    """An admitted request's place; `release` (idempotent) gives it back."""

    def __init__(self, admission: Admission, model: str, choices: int, slo_class: str = "standard",
                 caller: str = ""):
        self._admission = admission
        self._model = model
        self._choices = choices
        self._class = slo_class
        self._caller = caller
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release(self._model, self._choices, self._class, self._caller)
