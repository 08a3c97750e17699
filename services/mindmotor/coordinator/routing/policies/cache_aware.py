"""`cache_aware`: the instance holding the longest prefix of the prompt's blocks, unless that
would unbalance the load; then (and when no instance holds any of it) `least_load`.

The load is unbalanced when the busiest candidate has more than `balance_abs_tokens` outstanding
tokens above the idlest AND more than `balance_rel` times the idlest's (SGLang's router uses
the same two-threshold test). Ties on the match length go to the less loaded instance.
"""

from __future__ import annotations

from typing import Sequence

from mindmotor.coordinator.routing.table import InstanceView
from mindmotor.coordinator.routing.policies.base import RouteRequest
from mindmotor.coordinator.routing.policies.least_load import LeastLoad, load_key
from mindmotor.coordinator.routing.policies.prefix_index import PrefixIndex


class CacheAware:
    def __init__(self, max_blocks: int = 200_000, balance_abs_tokens: int = 16384, balance_rel: float = 1.5):
        self.index = PrefixIndex(max_blocks)
        self.balance_abs_tokens = balance_abs_tokens
        self.balance_rel = balance_rel
        self._fallback = LeastLoad()

    def imbalanced(self, candidates: Sequence[InstanceView]) -> bool:
        loads = [c.outstanding_tokens for c in candidates]
        low, high = min(loads), max(loads)
        return high - low > self.balance_abs_tokens and high > self.balance_rel * low

    def choose(self, candidates: Sequence[InstanceView], request: RouteRequest) -> InstanceView:
        if not self.imbalanced(candidates):
            best, best_match = None, 0
            for c in candidates:
                match = self.index.match(c.instance_id, request.block_hashes(c.block_size))
                if match > best_match or (match == best_match and best is not None
                                          and match > 0 and load_key(c) < load_key(best)):
                    best, best_match = c, match
            if best is not None:
                return best
        return self._fallback.choose(candidates, request)

    def on_routed(self, instance: InstanceView, request: RouteRequest) -> None:
        self.index.add(instance.instance_id, request.block_hashes(instance.block_size))
