"""`InstanceView` and `RoutingTable`: the instances the router may choose from.

A source (the static `--worker` poller, or the controller's routing-table stream) writes views
into the table: `upsert` one instance or `replace` them all; `on_change` listeners (model
discovery) hear of every write. The table adds what only this coordinator knows: the tokens of
the requests it has in flight on each instance (for `least_load`), and instances it saw fail
(skipped for `suspect_s` whatever the source says). A failure mark belongs to the instance at the
address it failed at: a replacement that registers under the same id at another address (a
restarted replica gets new ports) starts unmarked.

`failed_reason` says whether the table's source holds an instance (at an address) to have
*failed* — gone from the table, replaced at another address, in a failed state (the controller's
`suspect`: missed heartbeats or a reported failure; `failed`) — as opposed to merely not routable
(`starting`, `draining`, a role switch). The progress guard (`progress.py`) gives up the silent
streams of such an instance early. Not counted: a static worker's `unreachable` (a Status poll that
timed out — what a worker busy with thousands of requests also does) and this coordinator's own
marks (one stalled stream of a busy worker must not make every other stream of it look stalled:
under a burst that cascaded into every instance marked and a 503).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Collection, Iterable

from mindmotor.common.roles import Role
from mindmotor.vocabulary import InstanceState, WorkerState

log = logging.getLogger("mindmotor.coordinator")



@dataclass(frozen=True)
class InstanceView:
    instance_id: str
    address: str
    model: str = ""
    role: Role = Role.MIXED
    healthy: bool = True                 # the source's word: reachable and taking requests
    state: str = ""                      # the source's state word: "ready", "suspect", "draining", ...
    weight: float = 1.0
    deployment: str = ""
    version: str = ""
    max_model_len: int = 0
    block_size: int = 16
    running: int = 0                     # as the instance last reported
    waiting: int = 0
    kv_usage: float = 0.0
    iteration_token_counts: tuple[int, ...] = ()   # vLLM's iteration_tokens_total, as last reported
    iteration_tokens_sum: float = 0.0
    outstanding_tokens: int = 0          # filled in by the table: this coordinator's in-flight tokens
    in_flight: int = 0                   # ... and requests

    @property
    def reported_queue(self) -> int:
        return self.running + self.waiting


# Instance states (a controller's, or the static source's) that say the instance failed.
FAILED_STATES = frozenset({InstanceState.SUSPECT, WorkerState.FAILED})      # the controller's verdicts (failed_reason)


@dataclass
class _Local:
    outstanding_tokens: int = 0
    in_flight: int = 0
    suspect_until: float = 0.0
    suspect_address: str = ""            # where the instance was when it failed (the mark is for that one)


class RoutingTable:
    def __init__(self, suspect_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.suspect_s = suspect_s
        self.clock = clock
        self._views: dict[str, InstanceView] = {}
        self._local: dict[str, _Local] = {}
        self._failure_listeners: list[Callable[[InstanceView, str], None]] = []
        self._change_listeners: list[Callable[[], None]] = []

    # ---- written by a source --------------------------------------------------------------
    def upsert(self, view: InstanceView) -> None:
        self._views[view.instance_id] = view
        self._changed()

    def replace(self, views: Iterable[InstanceView]) -> None:
        """The whole table at once (a controller's routing table): instances not in it are gone."""
        self._views = {v.instance_id: v for v in views}
        for gone in set(self._local) - set(self._views):
            if self._local[gone].in_flight == 0:
                del self._local[gone]
        self._changed()

    def remove(self, instance_id: str) -> None:
        self._views.pop(instance_id, None)
        self._changed()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every write (it must return at once: it runs in the writer's call)."""
        self._change_listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._change_listeners:
            listener()

    # ---- read by the router and the routes -----------------------------------------------
    def get(self, instance_id: str) -> InstanceView | None:
        return self._views.get(instance_id)

    def all(self) -> list[InstanceView]:
        return sorted(self._views.values(), key=lambda v: v.instance_id)

    def is_routable(self, view: InstanceView) -> bool:
        local = self._local.get(view.instance_id)
        return view.healthy and (local is None or not self._suspect(local, view))

    def _suspect(self, local: _Local, view: InstanceView) -> bool:
        return local.suspect_until > self.clock() and local.suspect_address == view.address

    def candidates(self, model: str, roles: Collection[str] | None = None) -> list[InstanceView]:
        """Routable instances of `model` (of one of `roles`, if given), sorted by id, with this
        coordinator's load filled in."""
        out = []
        for view in self.all():
            if view.model != model or not self.is_routable(view) or (roles is not None and view.role not in roles):
                continue
            local = self._local.get(view.instance_id)
            if local is not None and (local.outstanding_tokens or local.in_flight):
                view = dataclasses.replace(view, outstanding_tokens=local.outstanding_tokens,
                                           in_flight=local.in_flight)
            out.append(view)
        return out

    def models(self) -> dict[str, list[InstanceView]]:
        """Every model any known instance serves (routable or not) -> its instances."""
        by_model: dict[str, list[InstanceView]] = {}
        for view in self.all():
            if view.model:
                by_model.setdefault(view.model, []).append(view)
        return by_model

    def has_routable(self, model: str | None = None, role: str | None = None) -> bool:
        return any(self.is_routable(v) and (model is None or v.model == model) and (role is None or v.role == role)
                   for v in self._views.values())

    # ---- this coordinator's own bookkeeping ---------------------------------------------
    def begin(self, instance_id: str, tokens: int) -> None:
        local = self._local.setdefault(instance_id, _Local())
        local.outstanding_tokens += tokens
        local.in_flight += 1

    def end(self, instance_id: str, tokens: int) -> None:
        local = self._local.get(instance_id)
        if local is not None:
            local.outstanding_tokens = max(0, local.outstanding_tokens - tokens)
            local.in_flight = max(0, local.in_flight - 1)

    def failed_reason(self, instance_id: str, address: str) -> str | None:
        """Why the instance that was at `address` counts as failed, or None when it does not (it
        is listed there, in no failed state, not marked failed here)."""
        view = self._views.get(instance_id)
        if view is None:
            return "the routing table no longer lists the instance"
        if view.address != address:
            return f"the instance was replaced (now at {view.address})"
        if view.state in FAILED_STATES:
            return f"the routing table lists the instance as {view.state}"
        return None

    def mark_failed(self, instance_id: str, reason: str) -> None:
        """Skip the instance for `suspect_s` — at its present address: one that comes back under the
        same id elsewhere is another process — and tell the listeners (e.g. the controller)."""
        local = self._local.setdefault(instance_id, _Local())
        view = self._views.get(instance_id)
        local.suspect_until = self.clock() + self.suspect_s
        local.suspect_address = view.address if view is not None else ""
        log.warning("instance failed; not routed to for a while",
                    extra={"instance_id": instance_id, "reason": reason, "suspect_s": self.suspect_s})
        if view is not None:
            for listener in self._failure_listeners:
                listener(view, reason)

    def on_failure(self, listener: Callable[[InstanceView, str], None]) -> None:
        self._failure_listeners.append(listener)
