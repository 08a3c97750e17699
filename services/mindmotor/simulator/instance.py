"""One simulated instance: a real `LLMEngine` with the cost-only runner (no weights, no forward
pass; `engine/cost_only_runner.py`) on the cluster's virtual clock. The engine schedules, batches,
preempts, pins prefilled KV and waits for KV loads exactly as a worker's does; this module only
hands it requests, steps it, and reads its outputs back as the trace requests' events. A step's
emulated duration is the device `CostModel`'s price of the step the scheduler chose
(`LLMEngine.last_step_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from mindmotor.engine.config import EngineConfig
from mindmotor.engine.continuation import Continuation, KVSource
from mindmotor.engine.cost_only_runner import PLACEHOLDER_TOKEN
from mindmotor.engine.kv_connector import KVBlocks, KVLoad
from mindmotor.engine.llm_engine import LLMEngine
from mindmotor.engine.sequence import Sequence
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.vocabulary import FinishReason

PIN_TTL_S = float("inf")     # emulated time: the decode side always releases the pin


@dataclass
class SimRequest:
    """One trace request's life in the cluster (times on the emulated clock)."""
    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float | None = None
    finished_s: float | None = None
    last_token_s: float | None = None
    tokens_done: int = 0
    handoff: bool = False               # prefilled on a prefill instance, decoded elsewhere
    prefill_instance: int | None = None
    seq: Sequence | None = field(default=None, repr=False)   # the engine's, where it is now
    session: str = ""                   # multi-turn trace: its conversation
    previous: "SimRequest | None" = field(default=None, repr=False)  # its session's previous turn
    _ids: list[int] | None = field(default=None, repr=False)

    @property
    def request_id(self) -> str:
        return str(self.index)

    def prompt_token_ids(self, vocab_size: int) -> list[int]:
        """The trace carries lengths only: one token id per request, repeated (distinct requests
        share no prefix) — after its session's previous prompt and answer (the cost-only runner's
        placeholder tokens), when it has a previous turn that fits in its prompt."""
        if self._ids is not None:
            return self._ids
        own = 2 + self.index % (vocab_size - 2)
        ids = [own] * self.prompt_tokens
        if self.previous is not None:
            context = self.previous.prompt_token_ids(vocab_size) + [PLACEHOLDER_TOKEN] * self.previous.output_tokens
            if len(context) < self.prompt_tokens:
                ids = context + [own] * (self.prompt_tokens - len(context))
        if self.session:
            self._ids = ids                   # its session's next turn extends it
        return ids

    def params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.output_tokens, ignore_eos=True)


@dataclass
class StepEvents:
    """What one step produced (the engine's outputs), reported at its end."""
    tokens: list[SimRequest] = field(default_factory=list)       # one new token each
    finished: list[SimRequest] = field(default_factory=list)
    prefilled: list[SimRequest] = field(default_factory=list)    # P/D: first token, KV pinned


def engine_config(spec, num_blocks: int | None = None) -> EngineConfig:
    """The engine a `ClusterSpec`'s instance runs: its card, profile and limits, cost-only."""
    return EngineConfig(
        runner="cost_only", device=spec.device, emulate=spec.model, tensor_parallel=spec.tp, timing="virtual",
        memory_fraction=spec.memory_fraction, block_size=spec.block_size, num_blocks=num_blocks,
        max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len, enable_prefix_caching=spec.enable_prefix_caching,
        enable_chunked_prefill=spec.enable_chunked_prefill, kv_pin_ttl_s=PIN_TTL_S,
        kv_host_bytes=spec.kv_host_bytes, cache_chunk_size=spec.cache_chunk_size, prefetch_depth=spec.prefetch_depth)


class SimInstance:
    def __init__(self, index: int, role: str, node: int, config: EngineConfig, clock: Callable[[], float]):
        self.index, self.role, self.node = index, role, node
        self.engine = LLMEngine(config, clock=clock)
        self.requests: dict[str, SimRequest] = {}      # in flight here, by request id
        self.busy_s = 0.0
        self.steps = 0
        self.kv_usage_time = 0.0                     # integral of usage (after each step) over busy time
        self.kv_usage_peak = 0.0
        self.outstanding_tokens = 0                  # what the router counts as in flight here
        self.in_flight = 0

    # ---- what the router, the report and the tests read: the engine's own state ----------------
    @property
    def scheduler(self):
        return self.engine.scheduler

    @property
    def block_manager(self):
        return self.engine.block_manager

    @property
    def cost_model(self):
        return self.engine.device.cost_model

    @property
    def kv_plan(self):
        return self.engine.device.kv_plan

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    # ---- requests ---------------------------------------------------------------------------
    def add(self, req: SimRequest, prefill_only: bool = False) -> None:
        req.seq = self.engine.add_request(req.request_id, req.prompt_token_ids(self.engine.vocab_size), req.params(),
                                          arrival_time=req.arrival_s, prefill_only=prefill_only)
        self.requests[req.request_id] = req

    def add_continuation(self, req: SimRequest, prefill: "SimInstance") -> None:
        """Decode side of a handoff: the engine's continuation of the request's first token with
        its prompt KV pinned on `prefill` (it reserves blocks in its turn, then waits for the KV)."""
        cont = Continuation(output_token_ids=[PLACEHOLDER_TOKEN], sent_chars=0,
                            kv_source=KVSource(address=f"sim-{prefill.index}", handle=req.request_id))
        req.seq = self.engine.add_request(req.request_id, req.prompt_token_ids(self.engine.vocab_size),
                                          req.params(), arrival_time=req.arrival_s, continuation=cont)
        self.requests[req.request_id] = req

    def take_kv_loads(self) -> list[KVLoad]:
        """The KV pulls the engine's scheduler started (in the last `step`)."""
        return self.engine.take_kv_loads()

    def pull_kv(self, load: KVLoad, prefill: "SimInstance") -> KVBlocks | None:
        """What a decode worker's KV connector does first: pull the pinned KV from the prefill
        engine; None when the pin is gone (a continuation preempted after its load asks again: it
        falls back to computing its prompt here)."""
        try:
            return prefill.engine.read_pinned_kv(load.source.handle, load.skip_blocks)
        except KeyError:
            return None

    def receive_kv(self, load: KVLoad, kv: KVBlocks | None, prefill: "SimInstance") -> None:
        """The pull arrived (`kv`) or failed (None): hand it to the engine, release the pin."""
        self.engine.finish_kv_load(load.request_id, kv)
        prefill.engine.release_kv(load.source.handle)

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> tuple[float, StepEvents] | None:
        """One engine step; (its emulated seconds, what it produced) or None if nothing ran."""
        engine = self.engine
        steps = engine.steps
        outputs = engine.step()
        if engine.steps == steps:
            if outputs:     # a failed step: the cost-only engine has no reason to fail
                raise RuntimeError(f"instance {self.index}: an engine step failed: {outputs[0].error}")
            return None
        seconds = engine.last_step_s
        usage = engine.block_manager.usage
        self.kv_usage_time += usage * seconds
        self.kv_usage_peak = max(self.kv_usage_peak, usage)
        events = StepEvents()
        for out in outputs:
            req = self.requests[out.request_id]
            if out.finish_reason == FinishReason.ERROR:
                raise RuntimeError(f"instance {self.index}: request {out.request_id} failed: {out.error}")
            if out.new_token_ids:
                events.tokens.append(req)
            if out.finished:
                del self.requests[out.request_id]
                (events.prefilled if out.finish_reason == FinishReason.PREFILLED else events.finished).append(req)
        self.steps += 1
        self.busy_s += seconds
        return seconds, events
