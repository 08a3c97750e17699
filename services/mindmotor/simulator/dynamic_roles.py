"""A dynamic prefill:decode ratio in the simulator: the controller's own policy
(`controller.pd_ratio.decide`) fed with windowed latencies measured in emulated time, and role
switches that drain first — what `PDAutoscaler` and the workers' `RoleSwitch` do in a deployment.

- every instance keeps the workers' sliding windows (`worker.latency_window.LatencyWindow`, the same
  length and sample cap, on the emulated clock) and fills them as a worker's `RequestTimer` does:
  one TTFT per request whose first token it produced, and per request it finished one TPOT timed
  from the first token *it* produced (a decode instance's excludes the KV handoff);
- every `interval_s` (the controller's `pd_interval_s`: heartbeat × `every_heartbeats`) the
  routable prefill and decode instances are measured as `PDAutoscaler` measures them
  (`weighted_p90`: the instances' p90s weighted by sample count; no samples on a side, no
  decision) and `decide` runs with the controller's default hysteresis (`RatioPolicyConfig`);
- a switch takes the instance out of routing (draining: routers move away), waits until it holds
  no request and no pinned KV — or the worker's drain timeout, after which what is left simply
  finishes there, as a worker serves every RPC whatever its role — then gives it the new role.

The simulator calls `attach` once and `after_event` after every event it processes; evaluations are
due on a fixed period and run at the first event at or after their time (events are at most one
step apart while requests are in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mindmotor.common.roles import Role
from mindmotor.controller.pd_autoscaler import load_of, weighted_p90
from mindmotor.controller.pd_ratio import SLO, Measurement, RatioPolicyConfig, RatioState, decide
from mindmotor.worker.latency_window import MAX_SAMPLES, WINDOW_S, LatencyWindow


# The services' defaults (not the environment's), their settings classes imported when first needed.
def _controller_pd_interval_s() -> float:
    from mindmotor.controller.config import ControllerConfig

    return ControllerConfig.model_construct().pd_interval_s


def _worker_role_drain_timeout_s() -> float:
    from mindmotor.worker.config import WorkerConfig

    return WorkerConfig.model_construct().role_drain_timeout_s


@dataclass(frozen=True)
class DynamicRolesConfig:
    slo: SLO                                               # the deployment's targets (p90 TTFT, p90 TPOT)
    policy: RatioPolicyConfig = RatioPolicyConfig()       # the controller's defaults
    interval_s: float = field(default_factory=_controller_pd_interval_s)
    window_s: float = WINDOW_S
    max_samples: int = MAX_SAMPLES
    drain_timeout_s: float = field(default_factory=_worker_role_drain_timeout_s)   # a worker's default


@dataclass
class InstanceReport:
    """What one instance's heartbeat would carry: the fields `weighted_p90` and `load_of` read."""
    instance_id: str
    role: str
    ttft_p90_s: float
    ttft_samples: int
    tpot_p90_s: float
    tpot_samples: int
    running: int
    waiting: int
    kv_usage: float


@dataclass
class Switch:
    instance: int
    old_role: str
    new_role: str
    decided_s: float
    reason: str
    done_s: float | None = None
    drained: bool | None = None            # False: the drain timed out


@dataclass
class DynamicRoles:
    config: DynamicRolesConfig
    state: RatioState = field(default_factory=RatioState)
    switches: list[Switch] = field(default_factory=list)
    now: float = 0.0

    # ---- wiring ---------------------------------------------------------------------------------
    def attach(self, cluster) -> None:
        """Take over `cluster`'s routing lists (`entry`, `decoders`) and start measuring (afresh:
        the policy's memory and the switch log start empty for every run)."""
        if not cluster.split:
            raise ValueError("dynamic roles need a P/D split to start from")
        self.cluster = cluster
        self.state, self.switches = RatioState(), []
        clock = lambda: self.now  # noqa: E731
        c = self.config
        self.ttft = [LatencyWindow(c.window_s, c.max_samples, clock) for _ in cluster.instances]
        self.tpot = [LatencyWindow(c.window_s, c.max_samples, clock) for _ in cluster.instances]
        self.draining: dict[int, Switch] = {}
        self.first_here: dict[tuple[int, int], tuple[float, int]] = {}   # (instance, request) -> (time, tokens)
        self.next_eval = c.interval_s
        self._route()

    def after_event(self, now: float, produced=None, inst=None) -> None:
        """After the simulator processed an event at `now` (a step's end: `inst`, `produced`)."""
        self.now = now
        if produced is not None:
            self._record(inst, produced)
        while self.next_eval <= now:
            self.evaluate(self.next_eval)
            self.next_eval += self.config.interval_s
        self._finish_drains(now)

    # ---- measuring ------------------------------------------------------------------------------
    def _record(self, inst, produced) -> None:
        for req in produced.tokens:
            if req.tokens_done == 1:
                self.ttft[inst.index].add(req.first_token_s - req.arrival_s)
            self.first_here.setdefault((inst.index, req.index), (req.last_token_s, req.tokens_done))
        for req in produced.prefilled:
            del self.first_here[(inst.index, req.index)]
        for req in produced.finished:
            started, tokens = self.first_here.pop((inst.index, req.index))
            if req.tokens_done > tokens:
                self.tpot[inst.index].add((req.finished_s - started) / (req.tokens_done - tokens))

    def report(self, inst) -> InstanceReport:
        ttft, ttft_n = self.ttft[inst.index].percentile(90)
        tpot, tpot_n = self.tpot[inst.index].percentile(90)
        return InstanceReport(self.cluster.view(inst).instance_id, inst.role, ttft, ttft_n, tpot, tpot_n,
                              len(inst.scheduler.running), len(inst.scheduler.waiting), inst.block_manager.usage)

    # ---- deciding -------------------------------------------------------------------------------
    def evaluate(self, now: float):
        """One `PDAutoscaler.evaluate_group` over the routable instances; returns the decision."""
        routable = {self.cluster.view(x).instance_id: x for x in self.cluster.instances
                    if x.index not in self.draining}
        reports = [self.report(x) for x in routable.values()]
        ttft = weighted_p90([r for r in reports if r.role == Role.PREFILL], "ttft")
        tpot = weighted_p90([r for r in reports if r.role == Role.DECODE], "tpot")
        if ttft.samples == 0 or tpot.samples == 0:
            self.state.wish = None                 # no traffic on a side: no evidence for a switch
            return None
        decision = decide({r.instance_id: r.role for r in reports}, {r.instance_id: load_of(r) for r in reports},
                          Measurement(ttft.p90_s, tpot.p90_s), self.config.slo, self.state, now,
                          self.config.policy)
        if decision.switch is not None:
            instance_id, role = decision.switch
            inst = routable[instance_id]
            self.draining[inst.index] = switch = Switch(inst.index, inst.role, role, now, decision.code)
            self.switches.append(switch)
            self._route()
        return decision

    # ---- switching ------------------------------------------------------------------------------
    def _finish_drains(self, now: float) -> None:
        for index, switch in list(self.draining.items()):
            inst = self.cluster.instances[index]
            idle = not inst.has_work and inst.in_flight == 0 and inst.scheduler.kv.num_pinned == 0
            if idle or now - switch.decided_s >= self.config.drain_timeout_s:
                inst.role = switch.new_role
                switch.done_s, switch.drained = now, idle
                del self.draining[index]
                self._route()

    def _route(self) -> None:
        """The routing lists: routable instances (not draining) by role."""
        routable = [x for x in self.cluster.instances if x.index not in self.draining]
        self.cluster.entry = [x for x in routable if x.role == Role.PREFILL]
        self.cluster.decoders = [x for x in routable if x.role == Role.DECODE]

    def roles(self) -> dict[str, int]:
        out = {"prefill": 0, "decode": 0}
        for x in self.cluster.instances:
            out[x.role] += 1
        return out

    def summary(self) -> dict:
        return {"switches": [vars(s).copy() for s in self.switches], "final_roles": self.roles()}
