"""`ProgressGuard`: no worker call is waited on for ever.

A worker can be alive to the kernel and say nothing: SIGSTOPped, a stuck process, a host that
stopped scheduling it. Its TCP connection stays open, so gRPC never fails the call, and a stream
on it would hang as long as the worker does. Workers send a `keepalive` message on a Generate
stream that has been silent for their `--stream-keepalive` (1 s) while their engine makes
progress, so silence itself means something. Every worker call the coordinator reads gets a
`StreamWatch`; the clock runs only while the coordinator waits for the worker (not while it
waits for a slow HTTP client), and the call is given up — cancelled, `failure` set to an
instance failure with the reason "STALLED" — when it has been silent

- for `deadline_s` (`stream_progress_timeout_s`, 5 s; 0: never) — before the call's first message
  for `first_message_s` (`stream_first_message_timeout_s`, 30 s) at least: a worker with
  thousands of calls queued takes seconds to start each one, and its keepalives come from a
  started call (a frozen worker is caught sooner by the rule below, once the controller sees its
  heartbeats stop) — or
- for `failed_silence_s` (`failed_instance_silence_s`, 2 s) while the routing table holds the
  instance to have failed (`RoutingTable.failed_reason`: gone from the controller's table or
  replaced, `suspect`/`failed` there). A stream that still delivers is left alone whatever the table
  says: the worker evidently serves it (a restarted controller's first tables lack instances that
  are fine; a draining instance finishes its streams).

The caller (`Generation`) then treats the failure like any other instance failure: the
instance is marked and reported to the controller, and the request continues elsewhere. Unary
calls (Prefill; GenerateUnary, a non-streamed request's call) carry no keepalives: they are watched
for the table's word only (`deadline=False`) — a frozen worker is caught once the controller (or
the static source's Status polls) stops hearing from it; Prefill's own timeout bounds it otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from mindmotor.coordinator.dispatch.failures import WorkerFailure
from mindmotor.vocabulary import FailureKind
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable

log = logging.getLogger("mindmotor.coordinator")

STALLED = "STALLED"      # the reason's prefix (the `reason` label of retries_total)
LATE_S = 0.25            # a check this late means the coordinator's own loop is behind: no verdict yet


class StreamWatch:
    """The progress of one worker call. `waiting()` before each wait for the worker,
    `received()` after it; `failure` is set once the call was given up (and cancelled)."""

    def __init__(self, guard: "ProgressGuard", instance: InstanceView, cancel: Callable[[], object],
                 model: str, request_id: str, deadline: bool):
        self.guard = guard
        self.instance = instance
        self.model = model
        self.request_id = request_id
        self.deadline_s = guard.deadline_s if deadline else 0.0
        self.heard = False                       # a first message came: the worker is on it
        self.failure: WorkerFailure | None = None
        self._cancel = cancel
        self._loop = asyncio.get_running_loop()
        self._waiting_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._suspect = guard.table.failed_reason(instance.instance_id, instance.address) is not None

    # ---- called by the reader ---------------------------------------------------------------
    def waiting(self) -> None:
        self._waiting_since = self._loop.time()
        self._arm()

    def received(self) -> None:
        self._waiting_since = None
        self.heard = True

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guard._forget(self)

    # ---- called by the guard ----------------------------------------------------------------
    def table_changed(self, suspect: bool) -> None:
        """The table now holds this instance to have failed (`suspect`), or not."""
        if suspect != self._suspect:
            self._suspect = suspect
            self._arm()

    # ---- the clock ----------------------------------------------------------------------------
    def _deadline(self) -> float:
        """Until its first message a call may wait longer: a worker with thousands of calls queued
        takes seconds to start each (its handler, which sends the keepalives, has not run yet)."""
        if self.deadline_s <= 0:
            return 0.0
        return self.deadline_s if self.heard else max(self.deadline_s, self.guard.first_message_s)

    def _limit(self) -> float | None:
        deadline = self._deadline()
        limits = [limit for limit, on in ((deadline, deadline > 0),
                                          (self.guard.failed_silence_s, self._suspect)) if on]
        return min(limits) if limits else None

    def _arm(self) -> None:
        limit = self._limit()
        if limit is None or self._waiting_since is None or self.failure is not None:
            return
        due = self._waiting_since + limit
        if self._timer is not None:
            if self._timer.when() <= due:
                return                                   # it fires first and re-arms if need be
            self._timer.cancel()
        self._timer = self._loop.call_at(due, self._check, due)

    def _check(self, due: float) -> None:
        self._timer = None
        if self.failure is not None or self._waiting_since is None:
            return
        late = self._loop.time() - due
        if late > LATE_S:
            # This loop ran the check late: it is itself overloaded (thousands of streams at once),
            # and the worker's messages may be waiting in it unread. Silence is not evidence until
            # the loop keeps time again: look again once it has caught up.
            self._timer = self._loop.call_at(self._loop.time() + late, self._check, self._loop.time() + late)
            return
        silent = self._loop.time() - self._waiting_since
        if silent >= self.guard.failed_silence_s:
            reason = self.guard.table.failed_reason(self.instance.instance_id, self.instance.address)
            self._suspect = reason is not None
            if reason is not None:
                return self._give_up(f"{STALLED}: no message for {silent:.1f} s and {reason}", "routing_table",
                                     silent)
        deadline = self._deadline()
        if deadline > 0 and silent >= deadline:
            return self._give_up(f"{STALLED}: no message from the worker for {silent:.1f} s "
                                 f"({'stream_progress_timeout_s' if self.heard else 'stream_first_message_timeout_s'} "
                                 f"{deadline:g})", "deadline", silent)
        self._arm()

    def _give_up(self, reason: str, cause: str, silent: float) -> None:
        self.failure = WorkerFailure(reason, FailureKind.INSTANCE)
        self.guard.metrics.stream_stalls.labels(self.model, cause).inc()
        log.warning("worker call silent; giving it up", extra={
            "request_id": self.request_id, "instance_id": self.instance.instance_id,
            "address": self.instance.address, "cause": cause, "silent_s": round(silent, 3), "reason": reason})
        self._cancel()


class ProgressGuard:
    """Makes the `StreamWatch`es, and re-judges those of an instance whenever the routing table
    changes or the instance is marked failed."""

    def __init__(self, table: RoutingTable, metrics: CoordinatorMetrics, deadline_s: float = 5.0,
                 failed_silence_s: float = 2.0, first_message_s: float = 30.0):
        self.table = table
        self.metrics = metrics
        self.deadline_s = deadline_s
        self.failed_silence_s = failed_silence_s
        self.first_message_s = first_message_s
        self._watches: dict[str, set[StreamWatch]] = {}
        table.on_change(self._table_changed)
        table.on_failure(lambda view, reason: self._instance_changed(view.instance_id))

    def watch(self, instance: InstanceView, cancel: Callable[[], object], model: str, request_id: str,
              deadline: bool = True) -> StreamWatch:
        """Watch a call on `instance`; `cancel` ends it when it is given up. `deadline`: False for a
        call that sends no keepalives (only the table's word applies)."""
        watch = StreamWatch(self, instance, cancel, model, request_id, deadline)
        self._watches.setdefault(instance.instance_id, set()).add(watch)
        return watch

    def in_flight(self, instance_id: str) -> int:
        return len(self._watches.get(instance_id, ()))

    def _forget(self, watch: StreamWatch) -> None:
        watches = self._watches.get(watch.instance.instance_id)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[watch.instance.instance_id]

    def _table_changed(self) -> None:
        for instance_id in list(self._watches):
            self._instance_changed(instance_id)

    def _instance_changed(self, instance_id: str) -> None:
        by_address: dict[str, bool] = {}
        for watch in list(self._watches.get(instance_id, ())):
            address = watch.instance.address
            if address not in by_address:
                by_address[address] = self.table.failed_reason(instance_id, address) is not None
            watch.table_changed(by_address[address])


class _Unwatched:
    """A watch that never gives up (no guard: e.g. a Generation built without one)."""
    failure = None

    def waiting(self) -> None:
        pass

    def received(self) -> None:
        pass

    def close(self) -> None:
        pass


UNWATCHED = _Unwatched()
