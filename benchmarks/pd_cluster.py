"""Several engines on one emulated clock: a cluster of mixed instances, or prefill and decode
instances with the KV handed over between them — the in-process model of `benchmarks/pd_split.py`.

Every engine has its own clock (the emulated time at which its card is next free). Events (a
request arriving; a prefilled request's KV reaching a decode instance) and engine steps are
processed in global time order: the earliest of the next event and the earliest busy engine's
clock goes first, so an engine only ever starts a step once everything due before it has been
delivered. A step advances its engine's clock by the step's emulated duration (the engine's
roofline cost model). Engines step with `step_without_model` (the emulated figures do not depend
on the token values; the host does not run the model), the KV handover is the engines' real
continuation path (a prefilled request continues on a decode instance as a `Continuation` with a
KV source; its scheduler admits it in its turn and starts a KV load; `read_pinned_kv` /
`finish_kv_load` / `release_kv` complete it), and the transfer, from the end of the step that
started the load, is priced by the cost model (`α + bytes / (η · link bandwidth)`) on the decode
instance's device.

Routing is the Coordinator's: least outstanding tokens (prompt + max tokens of the requests an
instance holds); prefill instances by their outstanding prompt tokens.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from mindmotor.engine.continuation import Continuation, KVSource
from mindmotor.engine.kv_connector import KVLoad
from mindmotor.engine.llm_engine import LLMEngine

from benchmarks.common import BenchRequest, RequestRecord, step_without_model


@dataclass
class Instance:
    name: str
    role: str                       # "mixed" | "prefill" | "decode"
    engine: LLMEngine
    clock: float = 0.0              # emulated seconds at which the card is next free
    outstanding: int = 0            # tokens of the requests it holds (routing load)

    @property
    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()


@dataclass
class ClusterResult:
    records: list[RequestRecord]
    transfers_s: list[float] = field(default_factory=list)
    makespan_s: float = 0.0
    steps: int = 0


class ClusterSim:
    def __init__(self, instances: list[Instance], link: str = "intra_node", progress=None):
        self.instances = instances
        self.link = link
        self.progress = progress
        self._events: list = []
        self._order = itertools.count()
        self.records: dict[str, RequestRecord] = {}
        self.requests: dict[str, BenchRequest] = {}
        self.holder: dict[str, Instance] = {}        # request id -> the instance that holds it now
        self.prefilled_on: dict[str, Instance] = {}  # request id -> the instance pinning its KV
        self.first_tokens: dict[str, int] = {}       # prefilled, not yet handed over: request id -> first token
        self.loads: dict[str, KVLoad] = {}           # request id -> its KV load in transit
        self.transfers_s: list[float] = []
        self.steps = 0

    def role(self, role: str) -> list[Instance]:
        return [i for i in self.instances if i.role == role]

    @property
    def split(self) -> bool:
        return bool(self.role("prefill"))

    def run(self, requests: list[BenchRequest]) -> ClusterResult:
        for r in requests:
            self.requests[r.request_id] = r
            self.records[r.request_id] = RequestRecord(r.request_id, r.arrival_s, r.prompt_len, r.output_len)
            self._push(r.arrival_s, "arrive", r.request_id)
        while True:
            busy = [i for i in self.instances if i.busy]
            next_step = min(busy, key=lambda i: i.clock) if busy else None
            if self._events and (next_step is None or self._events[0][0] <= next_step.clock):
                when, _, kind, rid = heapq.heappop(self._events)
                {"arrive": self._arrive, "handover": self._hand_over, "kv": self._kv_arrives}[kind](rid, when)
            elif next_step is not None:
                self._step(next_step)
            else:
                break
        unfinished = [r for r in self.records.values() if r.finished_s is None]
        if unfinished:
            raise RuntimeError(f"{len(unfinished)} requests did not finish")
        return ClusterResult(list(self.records.values()), self.transfers_s,
                             max(i.clock for i in self.instances), self.steps)

    # ---- events -------------------------------------------------------------------------------
    def _push(self, when: float, kind: str, rid: str) -> None:
        heapq.heappush(self._events, (when, next(self._order), kind, rid))

    def _arrive(self, rid: str, now: float) -> None:
        req = self.requests[rid]
        target = self._least_loaded("prefill" if self.split else "mixed")
        target.engine.add_request(rid, req.prompt_token_ids, req.params(), arrival_time=req.arrival_s,
                                  prefill_only=self.split)
        self._place(rid, target, now, req.prompt_len if self.split else req.prompt_len + req.output_len)
        self.records[rid].admitted_s = now

    def _hand_over(self, rid: str, now: float) -> None:
        """A prefilled request (its first token out) continues on a decode instance."""
        req = self.requests[rid]
        first_token = self.first_tokens.pop(rid)
        prefill = self.holder[rid]
        prefill.outstanding -= req.prompt_len
        self.prefilled_on[rid] = prefill
        decode = self._least_loaded("decode")
        decode.engine.add_request(rid, req.prompt_token_ids, req.params(), arrival_time=req.arrival_s,
                                  continuation=Continuation((first_token,), 0, KVSource(prefill.name, rid)))
        self._place(rid, decode, now, req.prompt_len + req.output_len)

    def _kv_arrives(self, rid: str, now: float) -> None:
        """A KV load is done: the decode instance has the prompt's KV; the pin is released."""
        prefill, load = self.prefilled_on.pop(rid), self.loads.pop(rid)
        decode = self.holder[rid]
        decode.engine.finish_kv_load(rid, prefill.engine.read_pinned_kv(rid, load.skip_blocks))
        prefill.engine.release_kv(rid)
        decode.clock = max(decode.clock, now)

    def _place(self, rid: str, instance: Instance, now: float, cost: int) -> None:
        self.holder[rid] = instance
        instance.outstanding += cost
        if not instance.busy or instance.clock < now:
            instance.clock = max(instance.clock, now)

    def _least_loaded(self, role: str) -> Instance:
        return min(self.role(role), key=lambda i: (i.outstanding, i.engine.scheduler.num_unfinished))

    # ---- steps --------------------------------------------------------------------------------
    def _step(self, instance: Instance) -> None:
        pacer = instance.engine.device.pacer
        before = pacer.emulated_time_s
        outputs, _ = step_without_model(instance.engine)
        instance.clock += pacer.emulated_time_s - before
        self.steps += 1
        now = instance.clock
        for out in outputs:
            rec = self.records[out.request_id]
            if rec.first_token_s is None and out.new_token_ids:
                rec.first_token_s = now
            rec.num_output_tokens += len(out.new_token_ids)
            if out.finish_reason == "prefilled":       # handed over in time order, at the step's end
                self.first_tokens[out.request_id] = out.new_token_ids[0]
                self._push(now, "handover", out.request_id)
            elif out.finished:
                rec.finished_s = now
                req = self.requests[out.request_id]
                instance.outstanding -= req.prompt_len + req.output_len
            if self.progress is not None and out.new_token_ids:
                self.progress.update(len(out.new_token_ids))
        for load in instance.engine.take_kv_loads():       # continuations this step admitted
            transfer = self._transfer_seconds(load.num_tokens)
            self.transfers_s.append(transfer)
            self.loads[load.request_id] = load
            self._push(now + transfer, "kv", load.request_id)

    def _transfer_seconds(self, num_tokens: int) -> float:
        return self.role("decode")[0].engine.device.cost_model.kv_transfer_seconds(num_tokens, self.link)
