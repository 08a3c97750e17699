"""`least_load`: the instance with the fewest outstanding tokens (prompt + max_tokens of the
requests this coordinator has in flight there); among equals, the shortest queue the instance
reported; among those still equal, each in turn."""

from __future__ import annotations

from typing import Sequence

from mindmotor.coordinator.routing.table import InstanceView
from mindmotor.coordinator.routing.policies.base import RouteRequest


def load_key(view: InstanceView) -> tuple[int, int]:
    return view.outstanding_tokens, view.reported_queue


class LeastLoad:
    def __init__(self) -> None:
        self._turn = 0

    def choose(self, candidates: Sequence[InstanceView], request: RouteRequest) -> InstanceView:
        lowest = min(load_key(c) for c in candidates)
        tied = [c for c in candidates if load_key(c) == lowest]
        choice = tied[self._turn % len(tied)]
        self._turn += 1
        return choice

    def on_routed(self, instance: InstanceView, request: RouteRequest) -> None:
        pass
