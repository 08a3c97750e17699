"""Routing policies, one per module; `make_policy` builds one by name (see `config.POLICY_NAMES`)."""

from __future__ import annotations

from .base import Policy, RouteRequest
from .cache_aware import CacheAware
from .least_load import LeastLoad
from .round_robin import RoundRobin
from .weighted_round_robin import WeightedRoundRobin


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
