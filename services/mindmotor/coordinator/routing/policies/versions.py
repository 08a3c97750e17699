"""`VersionSplit`: deployment traffic weights (canary, A/B). Among the versions of a model that
have routable instances, one is picked by smooth weighted round robin on the configured weights;
versions without a weight get none of the traffic, unless no weighted version is available
(then every available version shares it equally, so requests are not refused)."""

from __future__ import annotations

from typing import Sequence

from mindmotor.coordinator.routing.table import InstanceView
from mindmotor.coordinator.routing.policies.weighted_round_robin import SmoothWeighted


class VersionSplit:
    def __init__(self, weights: dict[str, float]):
        self.weights = dict(weights)
        self._wrr = SmoothWeighted()

    def choose(self, candidates: Sequence[InstanceView]) -> list[InstanceView]:
        """The candidates of the picked version."""
        present = sorted({c.version for c in candidates})
        weighted = {v: self.weights.get(v, 0.0) for v in present}
        if not any(w > 0 for w in weighted.values()):
            weighted = dict.fromkeys(present, 1.0)
        version = self._wrr.pick(weighted)
        return [c for c in candidates if c.version == version]
