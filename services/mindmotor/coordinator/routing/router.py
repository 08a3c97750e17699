"""`Router`: picks the instance for one request of a model — a deployment version by its traffic
weight first (when the model has weights), then an instance of it by the model's policy — and
keeps this coordinator's per-instance load (outstanding tokens) while the request runs.

When a model's versions tokenize differently, the version is picked first (`choose_version`, by
the same weights), the request is tokenized for it, and every pick of that request (retries
included) is limited to the versions sharing that tokenizer (`pick(versions=...)`).

Traffic weights come from two places: the static `traffic` setting, and the controller's routing
table (`set_table_traffic`, as the Deployer set them). For a model the table names, the table's
weights win; the static ones apply to the other models. A LoRA adapter's requests follow the adapter's own weights
when the table has some (the Deployer's canary of a new adapter version), else the model's.

A pick runs in two stages: the candidates (the routable instances of the model, of `roles` if
given) go through the filter steps of `filters.py` — not excluded, of the allowed versions, holding
the request's adapter, of the version the traffic split picks, with the adapter in a slot — then the model's policy picks one (`policies/`). Each (model,
version, role group) keeps its own policy state; decode picks use `least_load` whatever the model's
policy (a decode instance's prefix cache only saves a transfer, its load decides the TPOT)."""

from __future__ import annotations

from typing import Callable, Collection

from mindmotor.coordinator.http.errors import ServiceUnavailable
from mindmotor.coordinator.routing.filters import (AdapterAffinity, Filter, RouteContext, TrafficSplit, adapter_key,
                                                   excluded, of_versions)
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable
from mindmotor.coordinator.routing.policies import LeastLoad, Policy, RouteRequest

from mindmotor.common.roles import Role


class NoInstanceAvailable(ServiceUnavailable):
    def __init__(self, model: str):
        super().__init__(f"no healthy instance serves model {model!r} right now; retry later",
                         code="no_instance_available")
        self.model = model


class Router:
    def __init__(self, table: RoutingTable, make_policy: Callable[[str], Policy],
                 traffic: dict[str, dict[str, float]] | None = None,
                 on_routed: Callable[[str, InstanceView], None] | None = None):
        self.table = table
        self._make_policy = make_policy
        self._static_traffic = traffic or {}
        self._table_traffic: dict[str, dict[str, float]] = {}
        self._policies: dict[tuple[str, str, str], Policy] = {}
        self.traffic_split = TrafficSplit(self.traffic)
        self.adapter_affinity = AdapterAffinity()
        self.filters: list[Filter] = [excluded, of_versions, self.adapter_affinity, self.traffic_split,
                                      AdapterAffinity(warm=True, source=self.adapter_affinity)]
        self._on_routed = on_routed
        self._versions: dict[str, str] = {}      # instance id -> its version, as last routed to

    def policy(self, model: str, version: str = "", group: str = "") -> Policy:
        key = (model, version, group)
        policy = self._policies.get(key)
        if policy is None:
            policy = self._policies[key] = LeastLoad() if group == Role.DECODE else self._make_policy(model)
        return policy

    def set_table_traffic(self, traffic: dict[str, dict[str, float]]) -> None:
        """The weights of the controller's latest routing table: model -> version -> weight."""
        self._table_traffic = traffic

    def traffic(self, model: str, lora: str = "") -> dict[str, float]:
        """The version weights that apply to `model` now (empty: no version split) — to its requests
        naming LoRA adapter `lora`, that adapter's own weights when the table has them."""
        if lora:
            weights = self._table_traffic.get(adapter_key(model, lora))
            if weights:
                return weights
        return self._table_traffic.get(model) or self._static_traffic.get(model) or {}

    def choose_version(self, model: str, versions: Collection[str]) -> str | None:
        """The version (one of `versions`, with a routable instance) a request of `model` goes to,
        by the traffic weights — picked before the request is tokenized when its versions
        tokenize differently (`ModelCatalog.resolve`); None if none is routable."""
        candidates = [c for c in self.table.candidates(model) if c.version in versions]
        if not candidates:
            return None
        weights = self.traffic(model)
        if weights:
            candidates = self.traffic_split.split(model, weights).choose(candidates)
        return candidates[0].version

    def version_of(self, instance_id: str) -> str:
        """The version of an instance this router sent requests to (it may have left the table)."""
        view = self.table.get(instance_id)
        return view.version if view is not None else self._versions.get(instance_id, "")

    def pick(self, model: str, request: RouteRequest, exclude: Collection[str] = (),
             roles: Collection[str] | None = None, versions: Collection[str] | None = None) -> InstanceView:
        """The instance to send `request` to (not one of `exclude`; of one of `roles` if given; of
        one of `versions` if given: a request tokenized for them); NoInstanceAvailable if none."""
        ctx = RouteContext(model, request, exclude, versions)
        candidates = list(self.table.candidates(model, roles))
        for step in self.filters:
            candidates = step(candidates, ctx)
            if not candidates:
                raise NoInstanceAvailable(model)
        version = candidates[0].version if self.traffic(model, getattr(request, "lora", None) or "") else ""
        policy = self.policy(model, version, ",".join(sorted(roles)) if roles is not None else "")
        choice = policy.choose(candidates, request)
        self._versions[choice.instance_id] = choice.version
        policy.on_routed(choice, request)
        if self._on_routed is not None:
            self._on_routed(model, choice)
        return choice
