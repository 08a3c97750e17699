"""The router's filter steps: each takes the candidate instances of a pick and the pick's
`RouteContext` and returns those that stay, in order (llm-d's scheduler has the same shape:
filters, then a picker — here the model's policy). A step that leaves none makes the pick fail.

- `Excluded`: not an instance this request already tried or found busy;
- `OfVersions`: of the versions the request was tokenized for (when its versions tokenize
  differently: `ModelCatalog.resolve`);
- `AdapterAffinity`: for a request naming a LoRA adapter, the instances holding it — those with it
  in a device slot now if any (no slot load before its first token), else all holders; the policy
  then picks among them by load (affinity, then load);
- `TrafficSplit`: of the one version the model's traffic weights (canary, A/B) pick now — stateful,
  per model (or per model and version group), a smooth weighted round robin (`VersionSplit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Protocol

from mindmotor.coordinator.routing.policies import RouteRequest
from mindmotor.coordinator.routing.policies.versions import VersionSplit
from mindmotor.coordinator.routing.table import InstanceView


@dataclass(frozen=True)
class RouteContext:
    model: str
    request: RouteRequest
    exclude: Collection[str] = ()
    versions: Collection[str] | None = None


class Filter(Protocol):
    def __call__(self, candidates: list[InstanceView], ctx: RouteContext) -> list[InstanceView]: ...


def excluded(candidates: list[InstanceView], ctx: RouteContext) -> list[InstanceView]:
    return [c for c in candidates if c.instance_id not in ctx.exclude] if ctx.exclude else candidates


def of_versions(candidates: list[InstanceView], ctx: RouteContext) -> list[InstanceView]:
    return candidates if ctx.versions is None else [c for c in candidates if c.version in ctx.versions]


class AdapterAffinity:
    """See the module docstring; `directory`: catalog/adapters.py's `AdapterDirectory` (None: no
    adapters known, requests naming one find no instance)."""

    def __init__(self):
        self.directory = None

    def __call__(self, candidates: list[InstanceView], ctx: RouteContext) -> list[InstanceView]:
        lora = getattr(ctx.request, "lora", None)
        if not lora:
            return candidates
        if self.directory is None:
            return []
        holders = self.directory.holders(lora)
        holding = [c for c in candidates if c.instance_id in holders]
        resident = self.directory.resident(lora)
        warm = [c for c in holding if c.instance_id in resident]
        return warm or holding


class TrafficSplit:
    """The candidates of the version the traffic weights pick (all of them when the model has no
    weights or only one version is left)."""

    def __init__(self, weights_of: Callable[[str], dict[str, float]]):
        self.weights_of = weights_of
        self._splits: dict[str, VersionSplit] = {}

    def split(self, key: str, weights: dict[str, float]) -> VersionSplit:
        """The split state of `key`: a model, or a model's group of versions (a request already
        assigned to a group must not disturb the state of the model's own split)."""
        split = self._splits.get(key)
        if split is None or split.weights != weights:
            split = self._splits[key] = VersionSplit(weights)
        return split

    def __call__(self, candidates: list[InstanceView], ctx: RouteContext) -> list[InstanceView]:
        weights = self.weights_of(ctx.model)
        if not weights or len({c.version for c in candidates}) <= 1:
            return candidates
        key = ctx.model if ctx.versions is None else f"{ctx.model}\0{','.join(sorted(ctx.versions))}"
        return self.split(key, weights).choose(candidates)
