"""One simulated instance: the engine's real `Scheduler` and `BlockManager` on an emulated card's
KV pool, stepped in emulated time by the device's `CostModel` — `LLMEngine.step()` without the
model forward, the sampler and detokenization (a placeholder token is appended instead; with
fixed output lengths token values never change what is scheduled)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mindmotor.device.cost_model import CostModel, StepShape
from mindmotor.device.hbm import plan_kv_cache
from mindmotor.device.profiles import ModelProfile
from mindmotor.device.specs import DeviceSpec
from mindmotor.engine.block_manager import BlockManager
from mindmotor.engine.continuation import KVSource
from mindmotor.engine.kv_connector import KVLoad
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.engine.scheduler import Scheduler, SchedulerConfig
from mindmotor.engine.sequence import Sequence, SequenceStatus

PLACEHOLDER_TOKEN = 1
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
    seq: Sequence | None = field(default=None, repr=False)


@dataclass
class StepEvents:
    """What one step produced, reported at its end."""
    tokens: list[SimRequest] = field(default_factory=list)       # one new token each
    finished: list[SimRequest] = field(default_factory=list)
    prefilled: list[SimRequest] = field(default_factory=list)    # P/D: first token, KV pinned


class SimInstance:
    def __init__(self, index: int, role: str, node: int, spec: DeviceSpec, profile: ModelProfile, *,
                 max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, block_size: int,
                 memory_fraction: float, enable_chunked_prefill: bool, enable_prefix_caching: bool,
                 num_blocks: int | None = None):
        self.index, self.role, self.node = index, role, node
        self.cost_model = CostModel(spec, profile)
        _, self.kv_plan = plan_kv_cache(spec, profile, block_size=block_size, memory_fraction=memory_fraction,
                                        max_num_batched_tokens=max_num_batched_tokens)
        num_blocks = num_blocks or self.kv_plan.num_blocks
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.max_model_len = min(max_model_len, num_blocks * block_size)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=self.max_model_len, enable_chunked_prefill=enable_chunked_prefill),
            self.block_manager)
        self.requests: dict[str, SimRequest] = {}
        self.busy_until = 0.0
        self.busy_s = 0.0
        self.steps = 0
        self.kv_usage_time = 0.0                     # integral of usage over busy time
        self.kv_usage_peak = 0.0
        self.outstanding_tokens = 0                  # what the router counts as in flight here
        self.in_flight = 0

    # ---- requests ---------------------------------------------------------------------------
    def add(self, req: SimRequest, prefill_only: bool = False) -> None:
        seq = self._sequence(req)
        seq.prefill_only = prefill_only
        self.scheduler.add(seq)

    def add_continuation(self, req: SimRequest, prefill: "SimInstance") -> None:
        """Decode side of a handoff: a continuation of the request's first token whose prompt KV is
        pinned on `prefill` — the scheduler reserves its blocks in its turn and it waits for the
        KV (`take_kv_loads`, then `finish_kv_load`), as in the engine."""
        seq = self._sequence(req)
        seq.output_token_ids.append(PLACEHOLDER_TOKEN)
        seq.kv_source = KVSource(address=f"sim-{prefill.index}", handle=seq.request_id)
        self.scheduler.add(seq)

    def _sequence(self, req: SimRequest) -> Sequence:
        seq = Sequence(request_id=str(req.index), prompt_token_ids=[req.index + 2] * req.prompt_tokens,
                       params=SamplingParams(max_tokens=req.output_tokens, ignore_eos=True),
                       arrival_time=req.arrival_s, max_total_tokens=self.max_model_len)
        req.seq = seq
        self.requests[seq.request_id] = req
        return seq

    def take_kv_loads(self) -> list[KVLoad]:
        """The KV pulls the scheduler started (in the last `step`)."""
        return self.scheduler.kv.take_loads()

    def finish_kv_load(self, req: SimRequest) -> None:
        """The KV arrived: the request decodes from the next step."""
        self.scheduler.finish_kv_load(str(req.index), loaded=True)

    def release_pinned(self, request_id: str) -> None:
        self.scheduler.release_pin(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> tuple[float, StepEvents] | None:
        """Schedule and account one step; (its emulated seconds, what it produced) or None."""
        sched = self.scheduler.schedule()
        if sched.empty:
            return None
        shape = StepShape()
        sampling = []
        for s in sched.scheduled:
            seq = s.seq
            start = seq.num_computed_tokens
            if s.num_new_tokens == 1:
                shape.decodes.append(start + 1)
            else:
                shape.prefills.append((s.num_new_tokens, start))
            if s.samples:
                sampling.append(seq)
        seconds = self.cost_model.step(shape).seconds
        bm = self.block_manager
        usage = bm.usage
        self.kv_usage_time += usage * seconds
        self.kv_usage_peak = max(self.kv_usage_peak, usage)
        for s in sched.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
            bm.cache_blocks(s.seq)
        events = StepEvents()
        for seq in sampling:
            req = self.requests[seq.request_id]
            seq.output_token_ids.append(PLACEHOLDER_TOKEN)
            events.tokens.append(req)
            if seq.num_output_tokens >= req.output_tokens or seq.num_tokens >= seq.max_total_tokens:
                self.scheduler.finish(seq, SequenceStatus.FINISHED_LENGTH)
                del self.requests[seq.request_id]
                events.finished.append(req)
            elif seq.prefill_only:
                self.scheduler.hand_off(seq, PIN_TTL_S)
                del self.requests[seq.request_id]
                events.prefilled.append(req)
        self.steps += 1
        self.busy_s += seconds
        return seconds, events
