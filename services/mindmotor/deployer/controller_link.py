"""`ControllerLink`: the deployer's two ways into the controller.

- It watches the routing table (`RoutingTableWatcher`, every model): which instances of a
  deployment's version are routable (a rollout waits for that), and which traffic weights the
  controller holds for each deployment (the reconcile loop compares them with the desired ones, so
  a controller that restarted without Redis gets them again).
- It sets a deployment's weights with `Controller.SetTraffic` (the admin token in the metadata
  when the controller has one), trying the controller of the live Watch stream first.
"""

from __future__ import annotations

import logging
from typing import Callable

import grpc

from mindmotor.common import rpc
from mindmotor.common.admin_token import bearer_metadata
from mindmotor.controller.client import RoutingTableWatcher
from mindmotor.controller.reconnect import parse_addresses
from mindmotor.protocol import controller_pb2, controller_pb2_grpc

log = logging.getLogger("mindmotor.deployer")


class TrafficRefused(RuntimeError):
    """No controller took the weights (unreachable, or it refused them: the message says which)."""


class ControllerLink:
    def __init__(self, controllers: str, admin_token: str | None = None, on_change: Callable[[], None] | None = None,
                 rpc_timeout_s: float = 3.0):
        self.addresses = parse_addresses(controllers)
        self.admin_token = admin_token
        self.on_change = on_change
        self.rpc_timeout_s = rpc_timeout_s
        self.watcher = RoutingTableWatcher(self.addresses, on_update=self._updated, backoff_max_s=1.0)
        self._signature: tuple = ()

    async def start(self) -> None:
        await self.watcher.start()

    async def stop(self) -> None:
        await self.watcher.stop()

    @property
    def connected(self) -> bool:
        return self.watcher.connected and self.watcher.table is not None

    def _updated(self, table: controller_pb2.RoutingTable) -> None:
        """Tell the deployer when what it reads changed (membership, readiness, weights), not on
        every table: most tables only carry fresher load."""
        signature = (tuple((i.instance_id, i.deployment, i.version, i.routable) for i in table.instances),
                     tuple((t.deployment, t.adapter, t.model, tuple(sorted(t.weights.items()))) for t in table.traffic))
        if signature != self._signature and self.on_change is not None:
            self.on_change()
        self._signature = signature

    # ---- reads (the latest routing table) ---------------------------------------------------
    def ready(self, deployment: str, version: str) -> int:
        """Routable instances of the deployment's version."""
        return sum(1 for i in self.watcher.instances(routable_only=True)
                   if i.deployment == deployment and i.version == version)

    def traffic(self, deployment: str, adapter: str = "") -> tuple[str, dict[str, float]] | None:
        """(model, weights) the controller holds for the deployment (that LoRA adapter's split of
        it, if `adapter`); None: no entry."""
        return self.traffic_entries(deployment).get(adapter)

    def traffic_entries(self, deployment: str) -> dict[str, tuple[str, dict[str, float]]]:
        """Every entry the controller holds for the deployment: adapter ("" : the model's) ->
        (model, weights)."""
        table = self.watcher.table
        return {t.adapter: (t.model, dict(t.weights)) for t in (table.traffic if table else ())
                if t.deployment == deployment}

    # ---- writes -----------------------------------------------------------------------------
    async def set_traffic(self, deployment: str, model: str, weights: dict[str, float], adapter: str = "") -> int:
        """Store the weights (empty: clear the entry) at a controller; the routing table version
        that carries them. TrafficRefused if no controller took them."""
        request = controller_pb2.SetTrafficRequest(deployment=deployment, model=model, weights=weights,
                                                   adapter=adapter)
        live = self.watcher.controller
        errors = []
        for address in ([live] if live else []) + [a for a in self.addresses if a != live]:
            try:
                async with rpc.aio_channel(address) as channel:
                    response = await controller_pb2_grpc.ControllerStub(channel).SetTraffic(
                        request, timeout=self.rpc_timeout_s, metadata=bearer_metadata(self.admin_token))
                return response.version
            except grpc.aio.AioRpcError as exc:
                errors.append(f"{address}: {exc.code().name}: {exc.details()}")
                if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT):
                    break                              # another controller would say the same
        raise TrafficRefused("; ".join(errors))
