"""The router's filter steps: each takes the candidate instances of a pick and the pick's
`RouteContext` and returns those that stay, in order (llm-d's scheduler has the same shape:
filters, then a picker — here the model's policy). A step that leaves none makes the pick fail.

- `Excluded`: not an instance this request already tried or found busy;
- `OfVersions`: of the versions the request was tokenized for (when its versions tokenize
  differently: `ModelCatalog.resolve`);
- `AdapterAffinity`: for a request naming a LoRA adapter, the instances holding it;
- `TrafficSplit`: of the one version the model's traffic weights (canary, A/B) pick now — stateful,
  per model (or per model and version group), a smooth weighted round robin (`VersionSplit`). A
  request naming a LoRA adapter that has weights of its own (`adapter_key`: the Deployer's canary
  of a new adapter version) follows those instead of the model's;
- `AdapterAffinity(warm=True)`: of those, the ones with the adapter in a device slot now if any
  (no slot load before its first token), else all; the policy then picks among them by load
  (affinity, then load). After the split, so that a version whose copy of the adapter is not in a
  slot yet still gets its share.
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


def adapter_key(model: str, adapter: str) -> str:
    """The traffic weights' key of one LoRA adapter's split (model names hold no NUL)."""
    return f"{model}\0{adapter}"


def lora_of(ctx: RouteContext) -> str:
    return getattr(ctx.request, "lora", None) or ""


class AdapterAffinity:
    """See the module docstring; `directory`: catalog/adapters.py's `AdapterDirectory` (None: no
    adapters known, requests naming one find no instance). `warm`: the second stage (resident
    holders first); `source`: the first stage, whose directory this one reads."""

    def __init__(self, warm: bool = False, source: "AdapterAffinity | None" = None):
        self.warm = warm
        self.source = source
        self.directory = None

    def __call__(self, candidates: list[InstanceView], ctx: RouteContext) -> list[InstanceView]:
        lora = lora_of(ctx)
        if not lora:
            return candidates
        directory = self.source.directory if self.source is not None else self.directory
        if directory is None:
            return []
        if not self.warm:
            holders = directory.holders(lora)
            return [c for c in candidates if c.instance_id in holders]
        resident = directory.resident(lora)
        return [c for c in candidates if c.instance_id in resident] or candidates


class TrafficSplit:
    """The candidates of the version the traffic weights pick (all of them when the model has no
    weights or only one version is left)."""

    def __init__(self, weights_of: Callable[[str, str], dict[str, float]]):
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
        lora = lora_of(ctx)
        weights = self.weights_of(ctx.model, lora)
        if not weights or len({c.version for c in candidates}) <= 1:
            return candidates
        key = ctx.model if ctx.versions is None else f"{ctx.model}\0{','.join(sorted(ctx.versions))}"
        if lora:
            key = f"{key}\0{lora}"
        return self.split(key, weights).choose(candidates)
