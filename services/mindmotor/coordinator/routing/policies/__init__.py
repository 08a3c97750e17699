"""Routing policies, one per module; `make_policy` builds one by name (see `config.POLICY_NAMES`)."""

from __future__ import annotations

from mindmotor.coordinator.routing.policies.base import Policy, RouteRequest
from mindmotor.coordinator.routing.policies.cache_aware import CacheAware
from mindmotor.coordinator.routing.policies.least_load import LeastLoad
from mindmotor.coordinator.routing.policies.round_robin import RoundRobin
from mindmotor.coordinator.routing.policies.weighted_round_robin import WeightedRoundRobin


def make_policy(name: str, settings=None) -> Policy:
    if name == "round_robin":
        return RoundRobin()
    if name == "weighted_round_robin":
        return WeightedRoundRobin()
    if name == "least_load":
        return LeastLoad()
    if name == "cache_aware":
        if settings is None:
            return CacheAware()
        return CacheAware(settings.cache_aware_max_blocks, settings.cache_aware_balance_abs_tokens,
                          settings.cache_aware_balance_rel)
    raise ValueError(f"unknown routing policy {name!r}")


__all__ = ["Policy", "RouteRequest", "make_policy", "RoundRobin", "WeightedRoundRobin", "LeastLoad",
           "CacheAware"]
