"""`LLMEngine`: one step = schedule → run the model → postprocess. No networking, no threads.

The emulated device sizes the KV pool (for the emulated model profile) and prices every step; in
realtime mode `step()` does not return before the card would have finished it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence as Seq

import numpy as np

from mindmotor.common.tokenizer import IncrementalDetokenizer, Tokenizer
from mindmotor.device.emulated_device import EmulatedDevice
from mindmotor.device.profiles import ModelProfile, get_profile
from mindmotor.model.checkpoint import resolve_model_dir
from mindmotor.model.config import LlamaConfig
from mindmotor.model.kv_cache import PagedKVCache
from mindmotor.model.llama import LlamaModel

from .block_manager import BlockManager
from .config import EngineConfig
from .kv_transfer import KVBlocks, KVPins, num_prompt_blocks
from .model_runner import ModelRunner
from .output import OutputProcessor, RequestOutput
from .sampler import Sampler
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence, SequenceStatus

log = logging.getLogger("mindmotor.engine")


class RequestError(ValueError):
    """A request the engine refuses (the worker turns it into INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class ResumedPrompt:
    """The prompt of a request that already produced `output_token_ids` on an instance that then
    failed, the client holding the first `sent_chars` characters of their text. The engine
    continues it as that instance would have (see `LLMEngine._resume`), so the client's stream
    goes on exactly: the same seeded draws, penalties and token limits over the whole output, stop
    strings that began before the move."""
    prompt: str | Seq[int]
    output_token_ids: Seq[int]
    sent_chars: int = 0


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    num_blocks: int
    num_free_blocks: int
    prefix_hit_rate: float
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    steps: int
    emulated_time_s: float
    host_time_s: float
    lag_time_s: float
    num_pinned: int = 0               # prefilled requests whose KV waits for a decode instance
    num_pinned_blocks: int = 0
    num_receiving: int = 0            # decode side: requests whose KV is being pulled
    kv_transfers: int = 0             # decode side: KV pulls priced on the device
    kv_transfer_s: float = 0.0        # their emulated duration, summed
    kv_transfer_bytes: int = 0


def served_model_profile(config: LlamaConfig, name: str, tp: int = 1) -> ModelProfile:
    """The emulated profile of the model actually served (bf16 on the device)."""
    return ModelProfile.from_model_shape(
        name, num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
        vocab_size=config.vocab_size, tied_embeddings=config.tie_word_embeddings, dtype_bytes=2, tp=tp)


class LLMEngine:
    def __init__(self, config: EngineConfig = EngineConfig()):
        self.config = config
        self.model_dir = resolve_model_dir(config.model)
        self.model = LlamaModel.from_pretrained(self.model_dir)
        mcfg = self.model.config
        self.tokenizer = Tokenizer.from_dir(self.model_dir, extra_eos_ids=mcfg.eos_token_ids)
        self.model_name = Path(self.model_dir).name

        profile = (get_profile(config.emulate, tp=config.tensor_parallel) if config.emulate
                   else served_model_profile(mcfg, self.model_name, config.tensor_parallel))
        self.device = EmulatedDevice(config.device, profile, block_size=config.block_size,
                                     memory_fraction=config.memory_fraction, timing=config.timing,
                                     max_num_batched_tokens=config.max_num_batched_tokens)
        num_blocks = config.num_blocks or self.device.kv_plan.num_blocks
        self.max_model_len = min(config.max_model_len or mcfg.max_position_embeddings,
                                 mcfg.max_position_embeddings, num_blocks * config.block_size)

        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len, enable_chunked_prefill=config.enable_chunked_prefill),
            self.block_manager)
        self.kv_cache = PagedKVCache(mcfg.num_hidden_layers, num_blocks, config.block_size,
                                     mcfg.num_key_value_heads, mcfg.head_dim)
        self.runner = ModelRunner(self.model, self.kv_cache)
        self.sampler = Sampler(self.tokenizer.eos_token_ids)
        self.outputs = OutputProcessor(self.tokenizer, self.tokenizer.eos_token_ids, self.max_model_len)
        self.requests: dict[str, Sequence] = {}
        self.pins = KVPins()                          # prefill side: KV held for decode instances
        self.receiving: dict[str, Sequence] = {}      # decode side: blocks reserved, KV in transit
        self._rng = np.random.default_rng(config.seed)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0
        log.info("engine ready", extra={"model": str(self.model_dir), "device": config.device,
                                        "profile": profile.name, "num_blocks": num_blocks,
                                        "max_model_len": self.max_model_len})

    # ---- requests ---------------------------------------------------------------------------
    def validate(self, prompt: str | Seq[int] | ResumedPrompt, params: SamplingParams
                 ) -> tuple[list[int] | ResumedPrompt, SamplingParams]:
        """Check a request without touching engine state (safe from any thread).
        Returns the prompt token ids (in a `ResumedPrompt` for a resumed request) and the params
        with `max_tokens` resolved."""
        resumed = prompt if isinstance(prompt, ResumedPrompt) else None
        ids = self._token_ids(resumed.prompt if resumed else prompt)
        if not ids:
            raise RequestError("the prompt is empty")
        self._check_vocabulary("prompt token ids", ids)
        self._check_vocabulary("stop_token_ids", params.stop_token_ids)
        if len(ids) >= self.max_model_len:
            raise RequestError(
                f"the prompt has {len(ids)} tokens, but this model's maximum context length is "
                f"{self.max_model_len} tokens (prompt plus at least one generated token)")
        room = self.max_model_len - len(ids)
        if params.max_tokens is None:
            params = SamplingParams(**{**params.__dict__, "max_tokens": room})
        elif params.max_tokens > room:
            raise RequestError(
                f"this model's maximum context length is {self.max_model_len} tokens, but "
                f"{len(ids) + params.max_tokens} were requested ({len(ids)} in the prompt, "
                f"{params.max_tokens} in the completion); reduce the prompt or max_tokens")
        if resumed is not None:
            return self._validate_resumed(ids, resumed, params), params
        return ids, params

    def _token_ids(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def _check_vocabulary(self, what: str, ids: Seq[int]) -> None:
        vocab = self.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"{what} {bad[:5]} are outside the vocabulary [0, {vocab})")

    def _validate_resumed(self, ids: list[int], resumed: ResumedPrompt, params: SamplingParams) -> ResumedPrompt:
        """The resumed output must be tokens this request could have produced: in the vocabulary,
        within the context and max_tokens with room for one more, `sent_chars` within its text."""
        outputs = [int(t) for t in resumed.output_token_ids]
        self._check_vocabulary("resumed output token ids", outputs)
        if len(ids) + len(outputs) >= self.max_model_len:
            raise RequestError(
                f"the prompt ({len(ids)} tokens) and the resumed output ({len(outputs)} tokens) fill "
                f"this model's maximum context length of {self.max_model_len} tokens; nothing is left "
                "to generate")
        if len(outputs) >= params.max_tokens:
            raise RequestError(
                f"the resumed output has {len(outputs)} tokens, but max_tokens is {params.max_tokens} "
                "(the whole output's limit); nothing is left to generate")
        text = IncrementalDetokenizer(self.tokenizer, ids).add(outputs)
        if not 0 <= resumed.sent_chars <= len(text):
            raise RequestError(
                f"sent_chars ({resumed.sent_chars}) is outside the resumed output's text, which has "
                f"{len(text)} characters")
        return ResumedPrompt(ids, outputs, resumed.sent_chars)

    def add_request(self, request_id: str, prompt: str | Seq[int] | ResumedPrompt,
                    params: SamplingParams | None = None, priority: int = 0, arrival_time: float | None = None,
                    validated: tuple[list[int] | ResumedPrompt, SamplingParams] | None = None,
                    prefill_only: bool = False) -> Sequence:
        """Queue a request (a `ResumedPrompt`: continue one moved from another instance).
        `prefill_only`: it ends after its first token with finish reason "prefilled" and its KV
        pinned under its request id (see `read_pinned_kv`)."""
        seq = self._new_sequence(request_id, prompt, params, priority, arrival_time, validated)
        seq.prefill_only = prefill_only
        self.scheduler.add(seq)
        return seq

    def _new_sequence(self, request_id, prompt, params, priority, arrival_time, validated) -> Sequence:
        if request_id in self.requests or self.pins.get(request_id) is not None:
            raise RequestError(f"request id {request_id!r} is already in use")
        ids, params = validated or self.validate(prompt, params or SamplingParams())
        resumed = ids if isinstance(ids, ResumedPrompt) else None
        seq = Sequence(request_id=request_id, prompt_token_ids=list(resumed.prompt) if resumed else ids,
                       params=params, arrival_time=time.monotonic() if arrival_time is None else arrival_time,
                       priority=priority, max_total_tokens=self.max_model_len)
        seq.rng = np.random.default_rng(params.seed if params.seed is not None
                                        else int(self._rng.integers(2**63)))
        self.requests[request_id] = seq
        self.outputs.add(seq)
        if resumed is not None:
            self._resume(seq, resumed)
        return seq

    def _resume(self, seq: Sequence, resumed: ResumedPrompt) -> None:
        """Put `seq` where the failed instance left it: its outputs generated but their KV not
        computed — the state of a sequence preempted by recompute, so the scheduler computes
        prompt + outputs, then samples the next token — its generator past their draws, the text
        the client has marked sent."""
        self.sampler.skip_draws(seq, len(resumed.output_token_ids))
        self.outputs.resume(seq, resumed.output_token_ids, resumed.sent_chars)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        seq = self.requests.pop(request_id, None)
        if seq is None:
            self.release_kv(request_id)          # a pinned prefill whose caller went away
            return None
        if self.receiving.pop(request_id, None) is not None:
            self.block_manager.free(seq)
            seq.status = SequenceStatus.FINISHED_ABORTED
        else:
            self.scheduler.abort(seq)
        return self.outputs.make_output(seq, [], [])

    # ---- prefill/decode split: the prefill side ---------------------------------------------
    def read_pinned_kv(self, handle: str, skip_blocks: int = 0) -> KVBlocks:
        """The prompt KV of a pinned prefill, from block `skip_blocks` on. KeyError: unknown
        handle (released, expired, or never pinned here)."""
        seq = self.pins.get(handle)
        if seq is None:
            raise KeyError(handle)
        blocks = seq.block_table[skip_blocks:num_prompt_blocks(seq, self.config.block_size)]
        if not blocks:
            shape = (self.kv_cache.num_layers, 0, self.kv_cache.block_size, self.kv_cache.num_kv_heads,
                     self.kv_cache.head_dim)
            empty = np.zeros(shape, dtype=self.kv_cache.dtype)
            return KVBlocks(skip_blocks, empty, empty.copy())
        self.kv_cache.ensure_blocks(max(blocks))
        k, v = self.kv_cache.read_blocks(blocks)   # each [num_layers, len(blocks), block_size, n_kv, head_dim]
        return KVBlocks(skip_blocks, k, v)

    def release_kv(self, handle: str) -> bool:
        """Free a pinned prefill's blocks (its full blocks stay in the prefix cache)."""
        seq = self.pins.pop(handle)
        if seq is None:
            return False
        self.block_manager.free(seq)
        return True

    def expire_pins(self) -> int:
        """Free the pins whose deadline passed; how many."""
        expired = self.pins.pop_expired()
        for seq in expired:
            self.block_manager.free(seq)
            log.warning("pinned KV expired before a decode instance released it",
                        extra={"request_id": seq.request_id, "blocks": len(seq.block_table)})
        return len(expired)

    # ---- prefill/decode split: the decode side ----------------------------------------------
    def add_prefilled(self, request_id: str, validated: tuple[list[int], SamplingParams], first_token: int,
                      sent_chars: int = 0, num_cached_tokens: int = 0, priority: int = 0,
                      arrival_time: float | None = None) -> int | None:
        """A request prefilled elsewhere: its prompt and first token. Reserves blocks for the
        prompt, reusing the local prefix cache; returns how many leading prompt blocks are already
        here (their KV need not be pulled), or None when the pool has no room now. Then exactly one
        of `commit_kv` (the pulled KV) or `prefill_locally` must follow."""
        seq = self._new_sequence(request_id, None, None, priority, arrival_time, validated)
        self.sampler.skip_draws(seq, 1)          # the prefill instance drew the first token
        if self.outputs.on_token(seq, first_token) is not None:
            raise RequestError("the first token already finishes the request; nothing to decode")
        self.outputs.mark_sent(request_id, sent_chars)
        seq.num_cached_tokens = num_cached_tokens
        self.receiving[request_id] = seq
        bm = self.block_manager
        computed = bm.get_computed_blocks(seq)
        if not bm.allocate_slots(seq, seq.num_prompt_tokens - len(computed) * bm.block_size, computed):
            return None
        bm.record_prefix_lookup(seq.num_prompt_tokens, len(computed) * bm.block_size)
        return len(computed)

    def commit_kv(self, request_id: str, kv: KVBlocks) -> bool:
        """Write the pulled KV into the reserved blocks; the request decodes from its next step.
        False if the request is gone (aborted meanwhile)."""
        seq = self.receiving.pop(request_id, None)
        if seq is None:
            return False
        expected = num_prompt_blocks(seq, self.config.block_size) - kv.first_block
        if not seq.block_table or kv.num_blocks != expected:
            raise ValueError(f"expected {expected} KV blocks from block {kv.first_block}, got {kv.num_blocks}")
        if kv.num_blocks:
            self.kv_cache.write_blocks(seq.block_table[kv.first_block:kv.first_block + kv.num_blocks], kv.k, kv.v)
        seq.num_computed_tokens = seq.num_prompt_tokens
        self.block_manager.cache_blocks(seq)
        self.scheduler.add_running(seq)
        return True

    def prefill_locally(self, request_id: str) -> bool:
        """The KV could not be pulled: compute the prompt (and first token) here instead, as a
        preempted request is recomputed. False if the request is gone."""
        seq = self.receiving.pop(request_id, None)
        if seq is None:
            return False
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        self.scheduler.add(seq)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        started = time.monotonic()
        sched = self.scheduler.schedule()
        if sched.empty:
            return []
        logits, inp = self.runner.run(sched)
        tokens, logprobs = self.sampler(logits, [s.seq for s in inp.sampling]) if inp.sampling else ([], [])
        outputs = self._postprocess(sched, inp.sampling, tokens, logprobs)
        self.device.run_step(inp.shape, started)
        self.steps += 1
        return outputs

    def _postprocess(self, sched, sampling, tokens, logprobs) -> list[RequestOutput]:
        bm = self.block_manager
        for s in sched.scheduled:
            if s.seq.num_computed_tokens < s.seq.num_prompt_tokens:
                self.prompt_tokens += min(s.num_new_tokens, s.seq.num_prompt_tokens - s.seq.num_computed_tokens)
            s.seq.num_computed_tokens += s.num_new_tokens
            bm.cache_blocks(s.seq)
        outputs = []
        now = time.monotonic()
        for s, token, lp in zip(sampling, tokens, logprobs):
            seq = s.seq
            if seq.first_token_time is None:
                seq.first_token_time = now
            self.generation_tokens += 1
            finished = self.outputs.on_token(seq, token)
            if finished is None and seq.prefill_only:
                self.scheduler.detach(seq, SequenceStatus.PREFILLED)   # blocks stay referenced
                self.pins.pin(seq, self.config.kv_pin_ttl_s)
                self.requests.pop(seq.request_id, None)
            elif finished is not None:
                self.scheduler.finish(seq, finished)
                self.requests.pop(seq.request_id, None)
            outputs.append(self.outputs.make_output(seq, [token], [lp] if lp is not None else []))
        return outputs

    # ---- observability ----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm, pacer = self.block_manager, self.device.pacer
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            kv_usage=bm.usage, num_blocks=bm.num_blocks, num_free_blocks=bm.num_free_blocks,
            prefix_hit_rate=bm.prefix_hit_rate, num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens=self.prompt_tokens, generation_tokens=self.generation_tokens, steps=self.steps,
            emulated_time_s=pacer.emulated_time_s, host_time_s=pacer.host_time_s,
            lag_time_s=pacer.lag_time_s, num_pinned=len(self.pins), num_pinned_blocks=self.pins.num_blocks,
            num_receiving=len(self.receiving), kv_transfers=self.device.kv_transfers,
            kv_transfer_s=self.device.kv_transfer_s, kv_transfer_bytes=self.device.kv_transfer_bytes)

    def check_invariants(self) -> None:
        """The pool adds up, counting every holder of blocks: running, pinned and receiving."""
        live = list(self.scheduler.running) + self.pins.sequences() + list(self.receiving.values())
        self.block_manager.check_invariants(live)
