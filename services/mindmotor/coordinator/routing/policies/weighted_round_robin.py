"""`weighted_round_robin`: smooth weighted round robin (nginx's): each pick adds every instance's
weight to its credit, picks the highest credit and takes the total weight off it. Weights 5, 1, 1
give a a b a c a a — spread out, not a burst of five a's."""

from __future__ import annotations

from typing import Sequence

from mindmotor.coordinator.routing.table import InstanceView
from mindmotor.coordinator.routing.policies.base import RouteRequest


class SmoothWeighted:
    """The smooth WRR state over keys (instance ids, or versions)."""

    def __init__(self) -> None:
        self.credit: dict[str, float] = {}

    def pick(self, weights: dict[str, float]) -> str:
        """A key with a positive weight (weights of at least one key must be > 0)."""
        total = 0.0
        best = None
        for key, weight in weights.items():
            if weight <= 0:
                continue
            self.credit[key] = self.credit.get(key, 0.0) + weight
            total += weight
            if best is None or self.credit[key] > self.credit[best]:
                best = key
        if best is None:
            raise ValueError("no positive weight")
        self.credit[best] -= total
        for gone in set(self.credit) - set(weights):
            del self.credit[gone]
        return best


class WeightedRoundRobin:
    def __init__(self) -> None:
        self._wrr = SmoothWeighted()

    def choose(self, candidates: Sequence[InstanceView], request: RouteRequest) -> InstanceView:
        by_id = {c.instance_id: c for c in candidates}
        weights = {c.instance_id: c.weight for c in candidates}
        if not any(w > 0 for w in weights.values()):
            weights = dict.fromkeys(weights, 1.0)
        return by_id[self._wrr.pick(weights)]

    def on_routed(self, instance: InstanceView, request: RouteRequest) -> None:
        pass
