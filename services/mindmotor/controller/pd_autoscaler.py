"""`PDAutoscaler`: the leader runs the P/D ratio policy (`pd_ratio.decide`) over the registry and
turns its decisions into `set_role` commands.

Every `pd_interval_s` (a few heartbeat intervals), for each (model, deployment) whose routable
instances include at least one prefill and one decode instance:

1. measure: TTFT p90 of the prefill side and TPOT p90 of the decode side — each instance reports
   the p90 of its own recent window in its heartbeat; the side's figure is their mean weighted by
   the instances' sample counts (mixed instances are neither measured nor switched);
2. decide with the deployment's SLO (`PDAutoscaleSettings.slo_for`) and the group's `RatioState`;
3. a switch is a `set_role` command in the instance's record: the worker gets it with its next
   heartbeat answer, drains, switches (`worker/roles.py`) and reports the new role — only then does
   the routing table show it;
4. every decision is logged (JSON line with its reason) and counted in
   `mindmotor_controller_pd_decisions_total{action,reason}`; the ratio and the measured p90s are
   gauges.

The policy's memory (wish, time of the last switch) lives in this controller: a new leader starts
with none, so it waits a full `sustain_s` before its first switch.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .metrics import ControllerMetrics
from .pd_ratio import Decision, Measurement, RatioState, decide
from .records import InstanceRecord
from .registry import Registry

from mindmotor.common.roles import Role
from mindmotor.vocabulary import RatioReason

if TYPE_CHECKING:                  # the settings (pydantic) are not needed by the simulator, which uses this
    from .config import ControllerConfig

log = logging.getLogger("mindmotor.controller.pd")

Group = tuple[str, str]    # (model, deployment)


@dataclass
class SideLatency:
    p90_s: float
    samples: int


def weighted_p90(records: list[InstanceRecord], kind: str) -> SideLatency:
    """The sample-weighted mean of the instances' p90 `kind` ("ttft" | "tpot")."""
    total = sum(getattr(r, f"{kind}_samples") for r in records)
    if total == 0:
        return SideLatency(0.0, 0)
    return SideLatency(sum(getattr(r, f"{kind}_p90_s") * getattr(r, f"{kind}_samples") for r in records) / total,
                       total)


def pd_groups(records: list[InstanceRecord]) -> dict[Group, list[InstanceRecord]]:
    """Routable prefill and decode instances by (model, deployment), for groups that have both."""
    groups: dict[Group, list[InstanceRecord]] = defaultdict(list)
    for record in records:
        if record.routable and record.role in (Role.PREFILL, Role.DECODE):
            groups[(record.model, record.deployment)].append(record)
    return {key: members for key, members in groups.items()
            if {r.role for r in members} == {Role.PREFILL, Role.DECODE}}


def load_of(record: InstanceRecord) -> float:
    return record.running + record.waiting + record.kv_usage


class PDAutoscaler:
    def __init__(self, registry: Registry, config: ControllerConfig, metrics: ControllerMetrics):
        self.registry = registry
        self.config = config
        self.settings = config.pd
        self.metrics = metrics
        self.states: dict[Group, RatioState] = defaultdict(RatioState)
        self.last_run = float("-inf")

    def due(self, now: float) -> bool:
        return self.settings.enabled and now - self.last_run >= self.config.pd_interval_s

    def forget(self) -> None:
        """Leadership lost: the next leader decides from scratch (and so do we if we lead again)."""
        self.states.clear()

    async def evaluate(self, now: float) -> list[Decision]:
        self.last_run = now
        decisions = []
        for group, members in pd_groups(await self.registry.list()).items():
            decision = await self.evaluate_group(group, members, now)
            if decision is not None:
                decisions.append(decision)
        return decisions

    async def evaluate_group(self, group: Group, members: list[InstanceRecord], now: float) -> Decision | None:
        model, deployment = group
        prefill = [r for r in members if r.role == Role.PREFILL]
        decode = [r for r in members if r.role == Role.DECODE]
        self.metrics.pd_instances.labels(model, deployment, Role.PREFILL).set(len(prefill))
        self.metrics.pd_instances.labels(model, deployment, Role.DECODE).set(len(decode))
        self.metrics.pd_ratio.labels(model, deployment).set(len(prefill) / len(decode))
        ttft, tpot = weighted_p90(prefill, "ttft"), weighted_p90(decode, "tpot")
        state = self.states[group]
        if ttft.samples == 0 or tpot.samples == 0:
            state.wish = None                        # no traffic on a side: no evidence for a switch
            self.metrics.pd_decisions.labels("none", RatioReason.NO_MEASUREMENTS).inc()
            log.debug("pd ratio: no measurements", extra={"model": model, "deployment": deployment,
                                                          "ttft_samples": ttft.samples, "tpot_samples": tpot.samples})
            return None
        self.metrics.pd_ttft_p90.labels(model, deployment).set(ttft.p90_s)
        self.metrics.pd_tpot_p90.labels(model, deployment).set(tpot.p90_s)
        decision = decide({r.instance_id: r.role for r in members}, {r.instance_id: load_of(r) for r in members},
                          Measurement(ttft.p90_s, tpot.p90_s), self.settings.slo_for(model, deployment),
                          state, now, self.settings.policy)
        await self.act(group, decision, len(prefill), len(decode), ttft, tpot)
        return decision

    async def act(self, group: Group, decision: Decision, prefill: int, decode: int,
                  ttft: SideLatency, tpot: SideLatency) -> None:
        action = f"to_{decision.switch[1]}" if decision.switch else "none"
        self.metrics.pd_decisions.labels(action, decision.code).inc()
        fields = {"model": group[0], "deployment": group[1], "action": action, "reason_code": decision.code,
                  "reason": decision.reason, "wish": decision.wish, "pressures": decision.pressures,
                  "prefill": prefill, "decode": decode, "ttft_p90_s": round(ttft.p90_s, 6),
                  "tpot_p90_s": round(tpot.p90_s, 6), "ttft_samples": ttft.samples, "tpot_samples": tpot.samples}
        if decision.switch is None:
            log.log(logging.INFO if decision.wish else logging.DEBUG, "pd ratio decision", extra=fields)
            return
        instance_id, role = decision.switch
        record = await self.registry.command_set_role(instance_id, role)
        log.info("pd ratio decision: switching a role", extra={
            **fields, "instance_id": instance_id, "role": role, "commanded": record is not None})
