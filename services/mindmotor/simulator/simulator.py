"""The event loop: trace arrivals routed by the coordinator's real policies to instances, each a
real `LLMEngine` with the cost-only runner on the cluster's virtual clock (instance.py). The loop
owns time and the network between engines, nothing else: it moves the clock from event to event,
steps an idle engine that has work, holds a step's outputs until its emulated duration has passed,
and carries P/D handoffs the way workers do — the prefill engine pins the KV of a prefill-only
request; the decode engine admits the continuation in its turn (reserving blocks for the prompt)
and asks for its KV (`take_kv_loads`); as a decode worker's KV connector does, the pinned KV is
read from the prefill engine (`read_pinned_kv`), its transfer priced by the decode device
(`price_kv_transfer`: HCCS within a node, the inter-node link across), and when it has arrived it
is handed over (`finish_kv_load`) and the pin released. A pull whose pin is gone (a continuation
preempted after its load asks again) falls back at once to computing the prompt there.

Events happen in time order. A step's scheduling and bookkeeping happen at its start (as in
`LLMEngine.step`, where postprocessing precedes the device's pacing); its tokens become visible
at its end; requests arriving meanwhile join at the next step.
"""

from __future__ import annotations

import heapq
import itertools
import time
from array import array
from dataclasses import dataclass, field

from mindmotor.common.roles import Role
from mindmotor.coordinator.routing.table import InstanceView
from mindmotor.coordinator.routing.policies import make_policy
from mindmotor.coordinator.routing.policies.base import RouteRequest
from mindmotor.coordinator.routing.policies.least_load import LeastLoad
from mindmotor.simulator.cluster import ClusterSpec
from mindmotor.simulator.dynamic_roles import DynamicRoles
from mindmotor.simulator.instance import SimInstance, SimRequest, engine_config
from mindmotor.simulator.trace import TraceRequest

ARRIVAL, STEP_END, KV_ARRIVE, TIER_READY = 0, 1, 2, 3


@dataclass
class SimulationResult:
    spec: ClusterSpec
    requests: list[SimRequest]
    itl_s: array                                  # every inter-token gap
    instances: list[SimInstance]
    makespan_s: float
    wall_s: float
    clipped: int                                  # requests shortened to fit max_model_len
    handoffs: int = 0
    kv_transfer_s: float = 0.0
    extra: dict = field(default_factory=dict)


class _Cluster:
    def __init__(self, spec: ClusterSpec, num_blocks: int | None = None):
        self.spec = spec
        self.now = 0.0                               # the virtual clock every engine reads
        per_node = spec.cards_per_node // spec.tp
        config = engine_config(spec, num_blocks)
        self.instances = [SimInstance(i, role, i // per_node, config, self.clock)
                          for i, role in enumerate(spec.roles())]
        self.entry = [x for x in self.instances if x.role == Role.PREFILL] or \
            [x for x in self.instances if x.role == Role.MIXED]
        self.decoders = [x for x in self.instances if x.role == Role.DECODE] or \
            [x for x in self.instances if x.role == Role.MIXED]
        self.split = any(x.role == Role.PREFILL for x in self.instances)
        self.policy = make_policy(spec.routing)
        self.decode_policy = LeastLoad()
        self.max_model_len = min(x.max_model_len for x in self.instances)

    def clock(self) -> float:
        return self.now

    def view(self, inst: SimInstance) -> InstanceView:
        return InstanceView(instance_id=f"sim-{inst.index:04d}", address="", role=inst.role,
                            block_size=self.spec.block_size, running=len(inst.scheduler.running),
                            waiting=len(inst.scheduler.waiting), kv_usage=inst.block_manager.usage,
                            outstanding_tokens=inst.outstanding_tokens, in_flight=inst.in_flight)

    def choose(self, policy, candidates: list[SimInstance], req: SimRequest) -> SimInstance:
        views = [self.view(x) for x in candidates]
        route = RouteRequest(prompt_token_ids=req.prompt_token_ids(candidates[0].engine.vocab_size),
                             max_new_tokens=req.output_tokens) if self.spec.routing == "cache_aware" \
            and policy is self.policy else _LengthOnly(req.prompt_tokens, req.output_tokens)
        chosen = policy.choose(views, route)
        policy.on_routed(chosen, route)
        return candidates[views.index(chosen)]


class _LengthOnly(RouteRequest):
    """A route request that knows its lengths without materialising the prompt."""

    def __init__(self, prompt_tokens: int, output_tokens: int):
        super().__init__((), output_tokens)
        self._prompt_tokens = prompt_tokens

    @property
    def cost_tokens(self) -> int:
        return self._prompt_tokens + self.max_new_tokens


def simulate(spec: ClusterSpec, trace: list[TraceRequest], num_blocks: int | None = None,
             roles: DynamicRoles | None = None) -> SimulationResult:
    """Replay `trace` on `spec`'s cluster. `num_blocks` overrides every instance's KV pool (tests).
    `roles`: switch P/D roles at run time with the controller's ratio policy (dynamic_roles.py)."""
    started = time.perf_counter()
    cluster = _Cluster(spec, num_blocks)
    if roles is not None:
        roles.attach(cluster)
    limit = cluster.max_model_len
    requests, clipped = [], 0
    last_turn: dict[str, SimRequest] = {}
    for i, t in enumerate(trace):
        prompt = min(t.prompt_tokens, limit - 1)
        output = min(t.output_tokens, limit - prompt)
        clipped += (prompt, output) != (t.prompt_tokens, t.output_tokens)
        req = SimRequest(i, t.arrival_s, prompt, output, session=t.session)
        if t.session:                             # its prompt begins with the session's last turn
            req.previous = last_turn.get(t.session)
            last_turn[t.session] = req
        requests.append(req)
    events: list = []
    counter = itertools.count()
    for req in requests:          # reaches its instance after the serving path's overhead
        heapq.heappush(events, (req.arrival_s + spec.frontend_overhead_s, next(counter), ARRIVAL, req, None))
    stepping = [False] * len(cluster.instances)
    itl = array("d")
    stats = {"handoffs": 0, "kv_transfer_s": 0.0}
    now = 0.0

    def kick(inst: SimInstance) -> None:
        if stepping[inst.index] or not inst.has_work:
            return
        result = inst.step()
        for load in inst.take_kv_loads():         # continuations admitted by this step's schedule
            req = inst.requests[load.request_id]
            prefill = cluster.instances[req.prefill_instance]
            kv, seconds = inst.pull_kv(load, prefill), 0.0
            if kv is not None:                    # priced as the worker prices what it pulled
                link = "intra_node" if prefill.node == inst.node else "inter_node"
                seconds = inst.engine.price_kv_transfer(
                    min(load.num_tokens, kv.num_blocks * spec.block_size), link)
                stats["kv_transfer_s"] += seconds
            heapq.heappush(events, (now + seconds, next(counter), KV_ARRIVE, inst, (load, kv)))
        if result is None:                        # waiting for blocks another holder frees,
            ready = inst.engine.next_kv_ready_at()   # or for a host-tier load to end
            if ready is not None and ready > now:
                heapq.heappush(events, (ready, next(counter), TIER_READY, inst, None))
            return
        seconds, produced = result
        stepping[inst.index] = True
        heapq.heappush(events, (now + seconds, next(counter), STEP_END, inst, produced))

    def cost(req: SimRequest) -> int:
        return req.prompt_tokens + req.output_tokens

    while events:
        now, _, kind, a, b = heapq.heappop(events)
        cluster.now = now
        if kind == ARRIVAL:
            req = a
            inst = cluster.choose(cluster.policy, cluster.entry, req)
            inst.outstanding_tokens += cost(req)
            inst.in_flight += 1
            handoff = cluster.split and req.output_tokens > 1
            req.handoff = handoff
            inst.add(req, prefill_only=handoff)
            kick(inst)
        elif kind == STEP_END:
            inst, produced = a, b
            stepping[inst.index] = False
            for req in produced.tokens:
                if req.first_token_s is None:
                    req.first_token_s = now
                else:
                    itl.append(now - req.last_token_s)
                req.last_token_s = now
                req.tokens_done += 1
            for req in produced.finished:
                req.finished_s = now
                req.seq = None
                inst.outstanding_tokens -= cost(req)
                inst.in_flight -= 1
            for req in produced.prefilled:
                inst.outstanding_tokens -= cost(req)
                inst.in_flight -= 1
                req.prefill_instance = inst.index
                dec = cluster.choose(cluster.decode_policy, cluster.decoders, req)
                dec.outstanding_tokens += cost(req)
                dec.in_flight += 1
                stats["handoffs"] += 1
                dec.add_continuation(req, inst)
                kick(dec)
            kick(inst)
        elif kind == TIER_READY:                   # a host-tier load ended: its request can run
            kick(a)
        else:                                      # KV_ARRIVE
            dec, (load, kv) = a, b
            prefill = cluster.instances[dec.requests[load.request_id].prefill_instance]
            dec.receive_kv(load, kv, prefill)
            kick(prefill)
            kick(dec)
        if roles is not None:
            roles.after_event(now, *((b, a) if kind == STEP_END else ()))
    unfinished = [r.index for r in requests if r.finished_s is None]
    if unfinished:
        raise RuntimeError(f"{len(unfinished)} requests never finished (e.g. {unfinished[:3]}): "
                           "the cluster deadlocked; a bug in the simulator")
    makespan = max(r.finished_s for r in requests)
    return SimulationResult(spec=spec, requests=requests, itl_s=itl, instances=cluster.instances,
                            makespan_s=makespan, wall_s=time.perf_counter() - started, clipped=clipped,
                            extra={"dynamic_roles": roles.summary()} if roles is not None else {}, **stats)
