"""`RoutingTableWatcher`: what a coordinator runs to keep a local copy of the routing table —
one Watch stream to a controller, re-opened on the next controller address (with backoff) when it
breaks. The last table stays available while reconnecting (`connected` tells whether it is live).

    watcher = RoutingTableWatcher("ctrl-a:50050,ctrl-b:50050", on_update=router.set_table)
    await watcher.start()
    table = await watcher.wait_for(lambda t: any(i.routable for i in t.instances), timeout=30)
    for info in watcher.instances(model="qwen2-7b", routable_only=True): ...
    await watcher.report_failure(info.instance_id, "connect refused", reporter="coord-1")
    await watcher.stop()

Tables arrive as `controller_pb2.RoutingTable` messages; within one stream their versions never go
back. A different controller (after a failover) sends its current table first, which replaces
the local copy whatever its version.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Callable, Sequence

import grpc

from mindmotor.protocol import controller_pb2, controller_pb2_grpc

from mindmotor.common import rpc

from .reconnect import Reconnector, parse_addresses

log = logging.getLogger("mindmotor.controller.watcher")


class RoutingTableWatcher:
    def __init__(self, controllers: str | Sequence[str], model: str = "",
                 on_update: Callable[[controller_pb2.RoutingTable], Any] | None = None,
                 rpc_timeout_s: float = 2.0, backoff_initial_s: float = 0.05, backoff_max_s: float = 2.0):
        self.addresses = parse_addresses(controllers)
        self.model = model
        self.on_update = on_update
        self.rpc_timeout_s = rpc_timeout_s
        self.reconnector = Reconnector(self.addresses, backoff_initial_s, backoff_max_s)
        self.table: controller_pb2.RoutingTable | None = None
        self.controller: str | None = None       # address of the live stream (None while reconnecting)
        self.updates = 0                         # tables received
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def connected(self) -> bool:
        return self.controller is not None

    @property
    def version(self) -> int:
        return self.table.version if self.table else 0

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="routing-table-watcher")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.controller = None

    def instances(self, model: str | None = None, routable_only: bool = False) -> list[controller_pb2.InstanceInfo]:
        if self.table is None:
            return []
        return [i for i in self.table.instances
                if (model is None or i.model == model) and (i.routable or not routable_only)]

    def get(self, instance_id: str) -> controller_pb2.InstanceInfo | None:
        return next((i for i in self.instances() if i.instance_id == instance_id), None)

    async def wait_for(self, predicate: Callable[[controller_pb2.RoutingTable], bool],
                       timeout: float) -> controller_pb2.RoutingTable:
        """The first table (the current one included) for which `predicate` holds; TimeoutError."""
        async with asyncio.timeout(timeout):
            while True:
                changed = self._changed
                if self.table is not None and predicate(self.table):
                    return self.table
                await changed.wait()

    async def report_failure(self, instance_id: str, reason: str, reporter: str = "") -> bool:
        """Tell a controller the instance failed (it becomes suspect). True if it was known."""
        request = controller_pb2.ReportFailureRequest(instance_id=instance_id, reason=reason, reporter=reporter)
        ordered = ([self.controller] if self.controller else []) + [a for a in self.addresses if a != self.controller]
        last_error: Exception | None = None
        for address in ordered:
            try:
                async with rpc.aio_channel(address) as channel:
                    stub = controller_pb2_grpc.ControllerStub(channel)
                    return (await stub.ReportFailure(request, timeout=self.rpc_timeout_s)).found
            except grpc.aio.AioRpcError as exc:
                last_error = exc
        raise ConnectionError(f"no controller took the failure report: {last_error}")

    # ---- the stream ---------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            address = self.reconnector.next_address()
            try:
                await self._stream(address)
                raise ConnectionError("the controller ended the Watch stream")
            except Exception as exc:  # noqa: BLE001 — any failure: next controller, after a pause
                detail = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                log.info("watch stream ended", extra={"controller": address, "error": detail})
            finally:
                self.controller = None
            await self.reconnector.failed()

    async def _stream(self, address: str) -> None:
        async with rpc.aio_channel(address) as channel:
            call = controller_pb2_grpc.ControllerStub(channel).Watch(controller_pb2.WatchRequest(model=self.model))
            async for table in call:
                if self.controller is None:
                    self.controller = address
                    self.reconnector.succeeded()
                    log.info("watching routing table", extra={"controller": address, "version": table.version})
                await self._apply(table)

    async def _apply(self, table: controller_pb2.RoutingTable) -> None:
        self.table = table
        self.updates += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if self.on_update:
            try:
                result = self.on_update(table)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001
                log.exception("routing table callback failed")
