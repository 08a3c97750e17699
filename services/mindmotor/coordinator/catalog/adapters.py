"""`AdapterDirectory`: the LoRA adapters the workers serve, which base model each belongs to, and
which instances hold each (and have it in a device slot now).

It polls `ListLoraAdapters` on every routable instance each `lora_poll_interval_s` (concurrently,
bounded by `lora_poll_timeout_s`; an instance that does not answer keeps what it last said until
it leaves the table) — so adapters a worker serves from `--lora-modules`, or that another
coordinator loaded, are known without any coordinator being told. An adapter is served while at
least one instance holds it: its name then resolves to its base model (`ModelCatalog.resolve`),
it is listed in /v1/models with `parent` = that model, and its requests go only to the instances
holding it — those with it in a device slot first (`routing/filters.py`), then by load.

`load` and `unload` (the admin endpoints) fan out to the base model's instances: the adapter is
tried on one instance first, so an adapter that cannot be served (corrupt, for another base, rank
too high) is refused with that instance's reason and nothing changes anywhere; then the others.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc

from mindmotor.protocol import worker_pb2 as pb

from mindmotor.coordinator.dispatch.channels import WorkerChannels
from mindmotor.coordinator.http.errors import APIError, BadRequest, ModelNotFound, ServiceUnavailable
from mindmotor.coordinator.routing.table import RoutingTable

log = logging.getLogger("mindmotor.coordinator")


@dataclass
class _Held:
    model: str
    names: set[str] = field(default_factory=set)
    resident: set[str] = field(default_factory=set)


class AdapterDirectory:
    def __init__(self, table: RoutingTable, channels: WorkerChannels, interval_s: float = 1.0,
                 timeout_s: float = 2.0, call_timeout_s: float = 30.0):
        self.table, self.channels = table, channels
        self.interval_s, self.timeout_s, self.call_timeout_s = interval_s, timeout_s, call_timeout_s
        self._held: dict[str, _Held] = {}          # instance id -> what it holds
        self._task: asyncio.Task | None = None

    # ---- what is known --------------------------------------------------------------------
    def parent(self, name: str) -> str | None:
        """The base model of adapter `name` (None: no instance holds it)."""
        for held in self._held.values():
            if name in held.names:
                return held.model
        return None

    def adapters(self) -> dict[str, str]:
        """Every adapter an instance holds → its base model."""
        return {name: held.model for held in self._held.values() for name in held.names}

    def holders(self, name: str) -> set[str]:
        return {i for i, held in self._held.items() if name in held.names}

    def resident(self, name: str) -> set[str]:
        return {i for i, held in self._held.items() if name in held.resident}

    # ---- polling -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Polls in the background from now on (the first poll is not waited for: an instance that
        does not answer must not hold up the coordinator's start)."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - polling goes on
                log.exception("LoRA adapter poll failed")
            await asyncio.sleep(self.interval_s)

    async def refresh(self) -> None:
        instances = [v for v in self.table.all() if v.healthy]
        present = {v.instance_id for v in self.table.all()}
        for gone in set(self._held) - present:
            del self._held[gone]
        results = await asyncio.gather(*(self._list(v.address) for v in instances), return_exceptions=True)
        for view, result in zip(instances, results):
            if isinstance(result, pb.LoraAdapters):
                self._note(view.instance_id, view.model, result)

    async def _list(self, address: str) -> pb.LoraAdapters:
        return await self.channels.stub(address).ListLoraAdapters(pb.ListLoraAdaptersRequest(),
                                                                   timeout=self.timeout_s)

    def _note(self, instance_id: str, model: str, listing: pb.LoraAdapters) -> None:
        self._held[instance_id] = _Held(model, {a.name for a in listing.adapters},
                                        {a.name for a in listing.adapters if a.resident})

    # ---- the admin endpoints -----------------------------------------------------------------
    async def load(self, model: str, name: str, path: str) -> list[str]:
        """Load adapter `name` from `path` on every routable instance of `model`; the instance ids
        that loaded it. BadRequest with the worker's reason when the adapter cannot be served."""
        instances = [v for v in self.table.candidates(model)]
        if not instances:
            raise ServiceUnavailable(f"no healthy instance serves model {model!r} to load the adapter on",
                                     code="no_instance_available")
        other = self.parent(name)
        if other is not None and other != model:
            raise BadRequest(f"an adapter named {name!r} is already served on model {other!r}", param="lora_name")
        first, rest = instances[0], instances[1:]
        await self._load_on(first, name, path)              # refused here: nothing changed anywhere
        loaded = [first.instance_id]
        results = await asyncio.gather(*(self._load_on(v, name, path) for v in rest), return_exceptions=True)
        for view, result in zip(rest, results):
            if isinstance(result, BaseException):
                log.warning("LoRA adapter load failed on one instance", extra={
                    "instance": view.instance_id, "lora_name": name, "error": str(result)})
            else:
                loaded.append(view.instance_id)
        return loaded

    async def _load_on(self, view, name: str, path: str) -> None:
        try:
            listing = await self.channels.stub(view.address).LoadLoraAdapter(
                pb.LoadLoraAdapterRequest(lora_name=name, lora_path=path), timeout=self.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _api_error(exc, name) from None
        self._note(view.instance_id, view.model, listing)

    async def unload(self, name: str) -> list[str]:
        """Unload `name` from every instance holding it; NotFound if none does."""
        holders = [v for v in self.table.all() if v.instance_id in self.holders(name)]
        if not holders:
            raise ModelNotFound(f"the LoRA adapter {name!r} does not exist", param="lora_name",
                                code="model_not_found")
        done = []
        for view in holders:
            try:
                listing = await self.channels.stub(view.address).UnloadLoraAdapter(
                    pb.UnloadLoraAdapterRequest(lora_name=name), timeout=self.call_timeout_s)
                self._note(view.instance_id, view.model, listing)
                done.append(view.instance_id)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    self._held[view.instance_id].names.discard(name)
                else:
                    log.warning("LoRA adapter unload failed on one instance", extra={
                        "instance": view.instance_id, "lora_name": name, "error": exc.details()})
        return done


def _api_error(exc: grpc.aio.AioRpcError, name: str) -> APIError:
    code = exc.code()
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        return BadRequest(exc.details() or f"the LoRA adapter {name!r} cannot be loaded", param="lora_path",
                          code="invalid_lora_adapter")
    return ServiceUnavailable(f"loading the LoRA adapter {name!r} failed: {code.name}: {exc.details()}",
                              code="lora_load_failed")
