"""`TrafficTable`: the traffic weights between deployment versions that the Deployer sets
(`SetTraffic`), kept in the Store next to the instances so that every controller (and a restarted
one, with Redis) sends the same weights in its routing table.

A deployment has one entry for its model and may have one per LoRA adapter (the split of the
requests naming that adapter alone: a canary of a new adapter version, `docs/lora.md`).

Layout under the store prefix: hash `traffic` (deployment, or `deployment@adapter` → {"model",
"weights", "adapter"}). A change bumps
the routing table version and announces itself on `routing:changes`, like an instance change, so
every controller's Watch streams carry it at once.
"""

from __future__ import annotations

from mindmotor.common.store import Store
from mindmotor.protocol import controller_pb2

from .registry import Registry

TRAFFIC = "traffic"


def validate_traffic(request: controller_pb2.SetTrafficRequest) -> str | None:
    """The problem with a SetTraffic request, or None."""
    if not request.deployment:
        return "deployment is required"
    if "@" in request.deployment:
        return f"deployment: no '@' in a name, got {request.deployment!r}"
    if not request.weights:
        return None                                  # clearing needs nothing else
    if not request.model:
        return "model is required"
    negative = sorted(v for v, w in request.weights.items() if w < 0)
    if negative:
        return f"weights must be at least 0; negative for {', '.join(negative)}"
    if not any(w > 0 for w in request.weights.values()):
        return "at least one weight must be positive"
    return None


class TrafficTable:
    def __init__(self, store: Store, registry: Registry):
        self.store = store
        self.registry = registry

    async def set(self, deployment: str, model: str, weights: dict[str, float], adapter: str = "") -> int:
        """Store (empty `weights`: remove) the deployment's weights (of one LoRA adapter's requests
        if `adapter`); returns the routing version."""
        key = entry_key(deployment, adapter)
        if weights:
            await self.store.hset(TRAFFIC, key, {"model": model, "weights": dict(weights), "adapter": adapter,
                                                 "deployment": deployment})
        else:
            await self.store.hdel(TRAFFIC, key)
        return await self.registry.routing_changed(f"traffic:{key}")

    async def list(self) -> list[controller_pb2.TrafficSplit]:
        raw = await self.store.hgetall(TRAFFIC)
        return [controller_pb2.TrafficSplit(deployment=entry.get("deployment", key), model=entry["model"],
                                            weights=entry["weights"], adapter=entry.get("adapter", ""))
                for key, entry in sorted(raw.items())]


def entry_key(deployment: str, adapter: str = "") -> str:
    """The hash field of a deployment's entry (deployment names have no `@`)."""
    return f"{deployment}@{adapter}" if adapter else deployment
