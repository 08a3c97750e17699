"""`round_robin`: each instance in turn."""

from __future__ import annotations

from typing import Sequence

from mindmotor.coordinator.routing.table import InstanceView
from mindmotor.coordinator.routing.policies.base import RouteRequest


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, candidates: Sequence[InstanceView], request: RouteRequest) -> InstanceView:
        choice = candidates[self._next % len(candidates)]
        self._next += 1
        return choice

    def on_routed(self, instance: InstanceView, request: RouteRequest) -> None:
        pass
