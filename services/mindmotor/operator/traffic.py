"""Where an InferenceService's traffic weights go: the controller's routing table, through the
Deployer's own `ControllerLink` (the same path as `mindmotor deploy traffic`: Controller.SetTraffic
with the admin token; docs/architecture.md, "The traffic path"), or nowhere when the operator runs
without `--controller` (the weights are then only in the status).

`sync` is called every reconcile pass: it pushes the weights when the routing table shows others
(a controller restarted without Redis gets them again) and says how it stands, as an
(routed, reason, message) triple for the `TrafficRouted` condition.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from mindmotor.deployer.controller_link import ControllerLink, TrafficRefused
from mindmotor.deployer.reconcile import REPUSH_S
from mindmotor.vocabulary import ServiceReason

log = logging.getLogger("mindmotor.operator")

Verdict = tuple[bool, ServiceReason, str]


class NoTraffic:
    """No controller: the weights stay in the status."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def sync(self, name: str, model: str, weights: dict[str, float]) -> Verdict:
        return False, ServiceReason.NO_CONTROLLER, "the operator runs without --controller: weights are not routed"

    async def clear(self, name: str) -> None:
        return None


class ControllerTraffic:
    def __init__(self, link: ControllerLink, clock: Callable[[], float] = time.monotonic):
        self.link = link
        self.clock = clock
        self._pushed: dict[str, tuple[str, dict[str, float], float]] = {}

    async def start(self) -> None:
        await self.link.start()

    async def stop(self) -> None:
        await self.link.stop()

    async def sync(self, name: str, model: str, weights: dict[str, float]) -> Verdict:
        if not self.link.connected:
            return False, ServiceReason.CONTROLLER_UNREACHABLE, f"no routing table from {', '.join(self.link.addresses)} yet"
        if self.link.traffic(name) == (model, weights):
            self._pushed.pop(name, None)
            return True, ServiceReason.WEIGHTS_AT_CONTROLLER, "the controller routes by these weights"
        pushed = self._pushed.get(name)
        now = self.clock()
        if pushed is not None and pushed[:2] == (model, weights) and now - pushed[2] < REPUSH_S:
            return False, ServiceReason.PUSHING, "pushed; waiting for the routing table to show them"
        self._pushed[name] = (model, dict(weights), now)
        try:
            version = await self.link.set_traffic(name, model, weights)
        except TrafficRefused as exc:
            log.warning("traffic not pushed; trying again", extra={"deployment": name, "error": str(exc)})
            return False, ServiceReason.TRAFFIC_REFUSED, str(exc)
        log.info("traffic pushed to the controller", extra={"deployment": name, "model": model, "weights": weights,
                                                             "routing_version": version})
        return False, ServiceReason.PUSHING, f"pushed (routing version {version}); waiting for the routing table"

    async def clear(self, name: str) -> None:
        """Remove the deployment's entry (its InferenceService is deleted); best effort."""
        self._pushed.pop(name, None)
        if self.link.connected and self.link.traffic(name) is None:
            return
        try:
            await self.link.set_traffic(name, "", {})
        except TrafficRefused as exc:
            log.warning("traffic entry not cleared", extra={"deployment": name, "error": str(exc)})
