"""`Registry`: the instance records in the Store, changed only by compare-and-set, so that
several controllers (and the leader's sweeps) can update the same record without losing writes.

Layout under the store prefix: hash `instances` (instance id → record JSON), counter
`routing:version` (grows on every routing change), channel `routing:changes` (a message per
routing change, for every controller's Watch streams), and hash `store` field `epoch` (a random id
written once into an empty store: when it changes, the store lost its data — a Redis restarted
empty or flushed — see `RoutingTableBroadcaster`).

Times in records are wall-clock unix seconds written by whichever controller took the heartbeat
and compared by the leader, so controllers' clocks must agree (NTP) to well within the suspect
timeout.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from mindmotor.common.roles import Role
from mindmotor.common.store import Store
from mindmotor.common.store_epoch import store_epoch
from mindmotor.vocabulary import InstanceState, WorkerState
from mindmotor.protocol import controller_pb2

from . import states
from .records import InstanceRecord, record_from_register

log = logging.getLogger("mindmotor.controller")

INSTANCES = "instances"
VERSION_KEY = "routing:version"
CHANGES_CHANNEL = "routing:changes"
MAX_ATTEMPTS = 50
DELETE = object()   # returned by an update function: remove the record


class RegistryConflict(RuntimeError):
    """A record kept changing under an update (should not happen outside a storm of writers)."""


class RegistrationRefused(PermissionError):
    """A live instance id registered again by another identity or from another address."""


@dataclass
class HeartbeatOutcome:
    known: bool                      # False: unknown or dead — the worker must re-register
    record: InstanceRecord | None = None
    commands: list[dict] = field(default_factory=list)


class Registry:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time):
        self.store = store
        self.clock = clock

    # ---- reads --------------------------------------------------------------------------
    async def list(self) -> list[InstanceRecord]:
        raw = await self.store.hgetall(INSTANCES)
        return sorted((InstanceRecord.from_dict(v) for v in raw.values()), key=lambda r: r.instance_id)

    async def get(self, instance_id: str) -> InstanceRecord | None:
        raw = await self.store.hget(INSTANCES, instance_id)
        return None if raw is None else InstanceRecord.from_dict(raw)

    async def version(self) -> int:
        return int(await self.store.get(VERSION_KEY) or 0)

    async def epoch(self) -> str:
        """The store's epoch; written (a new random id) if the store has none (common/store_epoch.py,
        the one mechanism: the deployer watches its own store's the same way)."""
        return (await store_epoch(self.store))[0]

    # ---- writes -------------------------------------------------------------------------
    async def update(self, instance_id: str, change: Callable[[InstanceRecord], object]
                     ) -> tuple[InstanceRecord, InstanceRecord | None] | None:
        """Apply `change` to a copy of the record and write it back if nobody else wrote in
        between (else retry on the fresh record). Returns (before, after — None if deleted), or
        None if there is no such record. Publishes a routing change if one happened."""
        for _ in range(MAX_ATTEMPTS):
            raw = await self.store.hget(INSTANCES, instance_id)
            if raw is None:
                return None
            before = InstanceRecord.from_dict(raw)
            after = before.copy()
            result = change(after)
            new_raw = None if result is DELETE else after.to_dict()
            if new_raw == raw:
                return before, after
            if await self.store.hcompare_and_set(INSTANCES, instance_id, raw, new_raw):
                if result is DELETE or before.routing_key() != after.routing_key():
                    await self.routing_changed(instance_id)
                return before, (None if result is DELETE else after)
        raise RegistryConflict(f"instance {instance_id} kept changing")

    async def register(self, request: controller_pb2.RegisterRequest, owner: str = "") -> InstanceRecord:
        """Add the instance, or refresh it: a live record at the same address keeps its health.
        The record is bound to `owner` (who registered it); a live record of another owner or
        at another address is not replaced (RegistrationRefused) until it is dead."""
        for _ in range(MAX_ATTEMPTS):
            now = self.clock()
            raw = await self.store.hget(INSTANCES, request.instance_id)
            fresh = record_from_register(request, now)
            fresh.owner = owner
            old = None if raw is None else InstanceRecord.from_dict(raw)
            if old is not None and old.state != InstanceState.DEAD and \
                    (old.owner != owner or old.address != fresh.address):
                raise RegistrationRefused(
                    f"instance {request.instance_id} is live and registered by another identity or address; "
                    "a new registration of it is taken once it is deregistered or dead")
            if old is not None and old.state != InstanceState.DEAD and old.address == fresh.address:
                keep = old.to_dict()
                for name in ("metrics_address", "model", "role", "device", "max_model_len", "block_size",
                             "deployment", "version", "weight"):
                    keep[name] = getattr(fresh, name)
                new = InstanceRecord.from_dict(keep)
            else:
                if old is not None:
                    log.info("replacing instance record", extra={
                        "instance_id": request.instance_id, "old_address": old.address, "old_state": old.state})
                new = fresh
            if await self.store.hcompare_and_set(INSTANCES, request.instance_id, raw, new.to_dict()):
                if old is None or old.routing_key() != new.routing_key():
                    await self.routing_changed(request.instance_id)
                return new
        raise RegistryConflict(f"instance {request.instance_id} kept changing")

    async def heartbeat(self, request: controller_pb2.HeartbeatRequest,
                        cached_hashes: list[bytes] | None) -> HeartbeatOutcome:
        """Record the load, move the state machine, take the pending commands."""
        now = self.clock()
        taken: list[dict] = []

        def apply(record: InstanceRecord):
            taken.clear()
            if record.state == InstanceState.DEAD:
                return None
            states.on_heartbeat(record, now, request.state or WorkerState.SERVING)
            record.heartbeats += 1
            record.running, record.waiting = request.running, request.waiting
            record.kv_usage, record.outstanding_tokens = request.kv_usage, request.outstanding_tokens
            record.ttft_p90_s, record.ttft_samples = request.ttft_p90_s, request.ttft_samples
            record.tpot_p90_s, record.tpot_samples = request.tpot_p90_s, request.tpot_samples
            record.iteration_token_counts = list(request.iteration_token_counts)
            record.iteration_tokens_sum = request.iteration_tokens_sum
            role = Role.from_proto(request.role)         # unspecified: unchanged
            if role is not None:
                record.role = role.value
            if cached_hashes is not None:
                record.cached_block_hashes = [h.hex() for h in cached_hashes]
            taken.extend(record.commands)
            record.commands = []
            return None

        result = await self.update(request.instance_id, apply)
        if result is None or result[1] is None or result[1].state == InstanceState.DEAD:
            return HeartbeatOutcome(known=False)
        return HeartbeatOutcome(known=True, record=result[1], commands=list(taken))

    async def report_failure(self, instance_id: str, reason: str, hold_s: float) -> InstanceRecord | None:
        now = self.clock()
        result = await self.update(instance_id, lambda r: states.on_failure_report(r, now, reason, hold_s))
        return None if result is None else result[1]

    async def command_drain(self, instance_id: str, reason: str = "") -> InstanceRecord | None:
        now = self.clock()

        def apply(record: InstanceRecord):
            if record.state != InstanceState.DEAD:
                states.on_drain_command(record, now, reason)
                record.commands.append({"drain": {"reason": reason}})

        result = await self.update(instance_id, apply)
        return None if result is None else result[1]

    async def command_set_role(self, instance_id: str, role: Role | str) -> InstanceRecord | None:
        """Queue a role switch for the worker's next heartbeat (ValueError: not a role)."""
        role = Role.parse(role)
        result = await self.update(instance_id, lambda r: r.commands.append({"set_role": {"role": role.value}}))
        return None if result is None else result[1]

    async def remove(self, instance_id: str) -> bool:
        return await self.update(instance_id, lambda r: DELETE) is not None

    async def routing_changed(self, instance_id: str) -> int:
        version = await self.store.incr(VERSION_KEY)
        await self.store.publish(CHANGES_CHANNEL, {"version": version, "instance_id": instance_id})
        return version
