"""`ControllerSource`: fills the routing table from the Controller's `Watch` stream instead of
static `--worker` addresses (`--controller ADDR`), and reports the instances this coordinator saw
fail (`ReportFailure`), so the controller marks them suspect for every coordinator.

The stream itself is `mindmotor.controller.client.RoutingTableWatcher` (reconnects, fails over
between controllers); this module only translates: each `RoutingTable` replaces the local table,
each `InstanceInfo` becomes an `InstanceView`, and the table's traffic weights (set by the
Deployer) go to `on_traffic` (the router) as model -> version -> weight.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Sequence

from mindmotor.common.roles import Role
from mindmotor.protocol import controller_pb2

from mindmotor.coordinator.routing.filters import adapter_key
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable

log = logging.getLogger("mindmotor.coordinator")


def view_from_info(info: controller_pb2.InstanceInfo) -> InstanceView:
    return InstanceView(
        instance_id=info.instance_id, address=info.address, model=info.model, role=Role.from_proto(info.role, Role.MIXED),
        healthy=info.routable, state=info.state, weight=info.weight if info.weight > 0 else 1.0,   # proto: 0 means 1
        deployment=info.deployment, version=info.version, max_model_len=info.max_model_len,
        block_size=info.block_size or 16, running=info.load.running, waiting=info.load.waiting,
        kv_usage=info.load.kv_usage, iteration_token_counts=tuple(info.load.iteration_token_counts),
        iteration_tokens_sum=info.load.iteration_tokens_sum)


def traffic_from_table(routing_table: controller_pb2.RoutingTable) -> dict[str, dict[str, float]]:
    """model -> version -> weight, and `adapter_key(model, adapter)` -> version -> weight for the
    split of one LoRA adapter's requests. Should two deployments name one model (the Deployer
    refuses that), their weights are merged, the later deployment's winning for a version both name."""
    traffic: dict[str, dict[str, float]] = {}
    for split in routing_table.traffic:
        key = adapter_key(split.model, split.adapter) if split.adapter else split.model
        traffic.setdefault(key, {}).update(split.weights)
    return traffic


def _default_watcher(addresses: Sequence[str], on_update: Callable) -> Any:
    from mindmotor.controller.client import RoutingTableWatcher   # only when a controller is used

    return RoutingTableWatcher(list(addresses), on_update=on_update)


class ControllerSource:
    def __init__(self, addresses: Sequence[str], table: RoutingTable, reporter: str,
                 first_table_timeout_s: float = 5.0, make_watcher: Callable = _default_watcher,
                 on_traffic: Callable[[dict[str, dict[str, float]]], None] | None = None):
        self.table = table
        self.on_traffic = on_traffic
        self.reporter = reporter
        self.first_table_timeout_s = first_table_timeout_s
        self.watcher = make_watcher(addresses, self._apply)
        self._reports: set[asyncio.Task] = set()
        table.on_failure(self._report)

    def _apply(self, routing_table: controller_pb2.RoutingTable) -> None:
        self.table.replace(view_from_info(info) for info in routing_table.instances)
        if self.on_traffic is not None:
            self.on_traffic(traffic_from_table(routing_table))

    def _report(self, view: InstanceView, reason: str) -> None:
        task = asyncio.get_running_loop().create_task(self._send_report(view.instance_id, reason))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _send_report(self, instance_id: str, reason: str) -> None:
        try:
            await self.watcher.report_failure(instance_id, reason, reporter=self.reporter)
        except Exception as exc:  # noqa: BLE001 - a report is best effort
            log.warning("could not report a failed instance", extra={"instance_id": instance_id,
                                                                    "error": str(exc)})

    async def start(self) -> None:
        """Start watching; wait (bounded) for the first table so the first requests find instances."""
        await self.watcher.start()
        try:
            await self.watcher.wait_for(lambda t: True, timeout=self.first_table_timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            log.warning("no routing table from the controller yet; serving 503 until one arrives")

    async def stop(self) -> None:
        await self.watcher.stop()
        for task in list(self._reports):
            task.cancel()
        await asyncio.gather(*self._reports, return_exceptions=True)
