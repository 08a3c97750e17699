"""`LLMEngine`: one step = schedule → run the model → postprocess. No networking, no threads.

The emulated device sizes the KV pool (for the emulated model profile) and prices every step; in
realtime mode `step()` does not return before the card would have finished it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence as Seq

import numpy as np

from mindmotor.common.tokenizer import IncrementalDetokenizer, Tokenizer
from mindmotor.common.vllm_metrics import ITERATION_TOKEN_BUCKETS, BucketCounts
from mindmotor.vocabulary import FinishReason
from mindmotor.device.emulated_device import EmulatedDevice
from mindmotor.device.hf_profile import resolve_profile   # a profile name or a config.json
from mindmotor.device.profiles import ModelProfile
from mindmotor.model.checkpoint import resolve_model_dir
from mindmotor.model.config import LlamaConfig
from mindmotor.model.kv_cache import PagedKVCache
from mindmotor.model.llama import LlamaModel

from .block_manager import BlockManager
from .config import EngineConfig
from .continuation import Continuation
from .cost_only_runner import CostOnlyRunner, NoKVCache, unsupported
from .host_memory import default_tier_bytes, format_bytes, resolve_budget
from .kv_connector import KVBlocks, KVLoad
from .kv_tier import HostKVTier, TierConfig
from .lora_slots import LoraSlots
from mindmotor.model.lora import AdapterError
from .model_runner import ModelRunner
from .output import OutputProcessor, RequestOutput
from mindmotor.rules.request_rules import InvalidRequest, check_text, check_token_ids, resolve_max_tokens
from .grammar import GrammarEngine, advance
from .sampler import Sampler
from mindmotor.rules.sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence, SequenceStatus
from .step_budget import host_attention_budget

log = logging.getLogger("mindmotor.engine")


class RequestError(InvalidRequest):
    """A request the engine refuses (the worker turns it into INVALID_ARGUMENT)."""


class UnknownAdapter(RequestError):
    """A request names a LoRA adapter this engine does not serve (the API's 404)."""


class StepFailed(RuntimeError):
    """A request was in an engine step that failed as a whole (see `LLMEngine.step`)."""


class EngineBroken(RuntimeError):
    """The engine cannot go on: steps keep failing, or its KV pool no longer adds up."""


MAX_STEP_FAILURES = 3            # consecutive failed steps after which the engine is broken


@dataclass(frozen=True)
class ValidatedRequest:
    """A request `LLMEngine.validate` accepted: the prompt's token ids, the params with
    `max_tokens` resolved (and bad words tokenized), and the checked continuation, if any."""
    prompt_token_ids: list[int]
    params: SamplingParams
    continuation: Continuation | None = None
    matcher: object | None = None     # the structured output's matcher, built off the engine thread
    lora: object | None = None        # the LoRA adapter's lora_slots.AdapterRecord; None: the base model


@dataclass(frozen=True)
class EngineInfo:
    """What an engine serves and how; fixed for its life (safe to read from any thread)."""
    model_dir: Path | None                # None: the cost-only runner (no checkpoint)
    model_name: str
    max_model_len: int
    block_size: int
    timing: str                       # "realtime" | "virtual"
    profile_name: str                 # the emulated model profile
    kv_bytes_per_token: int           # of that profile on the emulated card


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
    num_pinned: int = 0               # prefilled requests whose KV waits for a decode worker
    num_pinned_blocks: int = 0
    num_receiving: int = 0            # decode side: continuations waiting for their KV (WAITING_FOR_KV)
    kv_transfers: int = 0             # decode side: KV pulls priced on the device
    kv_transfer_s: float = 0.0        # their emulated duration, summed
    kv_transfer_bytes: int = 0
    request_failures: int = 0         # requests the engine finished with an error (it raised for them)
    step_failures: int = 0            # steps that failed as a whole
    kv_host_bytes: int = 0            # host memory of the KV arrays now
    kv_host_budget_bytes: int = 0     # ... and its budget
    kv_host_blocks: int = 0           # blocks the budget holds (≤ num_blocks)
    kv_cached_blocks: int = 0         # prefix-cache blocks no request references
    kv_evictions: int = 0             # cached blocks reused for new ones
    kv_host_limited: int = 0          # allocations refused for the host budget alone
    prefix_queries: int = 0           # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0              # of them, found there
    # the KV host tier (engine/kv_tier.py); zeros without one
    kv_tier_bytes: int = 0            # host memory it holds now
    kv_tier_budget_bytes: int = 0     # --kv-host-bytes
    kv_tier_blocks: int = 0
    kv_tier_loading: int = 0          # requests waiting for a load from it
    kv_tier_queries: int = 0          # tokens looked up there (past the HBM prefix cache's hits)
    kv_tier_hits: int = 0             # of them, loaded from it
    kv_tier_bytes_stored: int = 0     # emulated bytes copied card -> host
    kv_tier_bytes_loaded: int = 0     # emulated bytes copied host -> card
    kv_tier_loads: int = 0
    kv_tier_loads_partial: int = 0    # blocks evicted mid-load: the rest computed
    kv_tier_loads_failed: int = 0     # the copy failed: computed
    kv_tier_load_buckets: tuple = ()  # loads per LOAD_TIME_BUCKETS bucket (emulated seconds)
    iteration_tokens: BucketCounts | None = None   # tokens per step (a copy)
    kv_tier_load_s_sum: float = 0.0
    lora: dict | None = None          # LoRA adapters: running/waiting ones, max_lora, loads, per-adapter requests


def served_model_profile(config: LlamaConfig, name: str, tp: int = 1) -> ModelProfile:
    """The emulated profile of the model actually served (bf16 on the device), architecture included
    (biases, q/k norms, sliding-window layers)."""
    windows = [config.layer_window(i) for i in range(config.num_hidden_layers)]
    return ModelProfile.from_model_shape(
        name, num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
        vocab_size=config.vocab_size, tied_embeddings=config.tie_word_embeddings, dtype_bytes=2, tp=tp,
        architecture=config.architecture, qkv_bias=config.attention_bias, o_bias=config.o_bias,
        qk_norm=config.qk_norm, sliding_window=config.sliding_window,
        num_sliding_layers=sum(w is not None for w in windows))


class LLMEngine:
    def __init__(self, config: EngineConfig = EngineConfig(), *, clock: Callable[[], float] = time.monotonic):
        """`clock`: the time the engine reads — arrivals, first tokens, pacing, pins' deadlines. A
        virtual clock (the simulator's) is advanced by whoever drives the engine, between steps.
        `config.runner`: "model" (weights, tokenizer, the forward pass) or "cost_only" (none of
        them: placeholder tokens, the emulated profile's step prices; cost_only_runner.py)."""
        self.config = config
        self.clock = clock
        self.cost_only = config.runner == "cost_only"
        if self.cost_only:
            self.model_dir, self.model, self.tokenizer = None, None, None
            profile = resolve_profile(config.emulate, tp=config.tensor_parallel)
            self.model_name = profile.name
            self.vocab_size = profile.vocab_size
            max_position = config.max_model_len
        else:
            self.model_dir = resolve_model_dir(config.model)
            self.model = LlamaModel.from_pretrained(self.model_dir)
            mcfg = self.model.config
            self.tokenizer = Tokenizer.from_dir(self.model_dir, extra_eos_ids=mcfg.eos_token_ids)
            self.model_name = Path(self.model_dir).name
            self.vocab_size = mcfg.vocab_size
            max_position = mcfg.max_position_embeddings
            profile = (resolve_profile(config.emulate, tp=config.tensor_parallel) if config.emulate
                       else served_model_profile(mcfg, self.model_name, config.tensor_parallel))
        self.device = EmulatedDevice(config.device, profile, block_size=config.block_size,
                                     memory_fraction=config.memory_fraction, timing=config.timing,
                                     max_num_batched_tokens=config.max_num_batched_tokens, clock=clock)
        num_blocks = config.num_blocks or self.device.kv_plan.num_blocks
        limits = [x for x in (config.max_model_len, max_position) if x] + [num_blocks * config.block_size]
        self.max_model_len = min(limits)

        if self.cost_only:                           # no KV data: every block of the emulated pool
            self.kv_host_budget_bytes = 0
            host_blocks = num_blocks
            self.sliding_window = profile.sliding_window if profile.num_sliding_layers == profile.num_layers \
                else None
            attention_budget = config.max_num_batched_attention or 0   # None: no host cost to bound
        else:
            self.kv_host_budget_bytes = resolve_budget(config.kv_host_budget_bytes)
            host_blocks = self._host_blocks(num_blocks, mcfg)
            self.sliding_window = mcfg.max_window    # on every layer: older blocks are released as they leave it
            attention_budget = self._attention_budget(mcfg)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                          host_blocks=host_blocks)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len, enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            max_num_partial_prefills=config.max_num_partial_prefills,
            max_num_batched_attention=attention_budget, priority_aging_s=config.priority_aging_s,
            lower_class_prefill_tokens=config.lower_class_prefill_tokens,
            preferred_batch_size=config.preferred_batch_size, batch_timeout_s=config.batch_timeout_s),
            self.block_manager, clock=clock)
        if self.cost_only:
            self.kv_cache = NoKVCache(config.block_size, profile.num_kv_heads, profile.head_dim)
            self.runner = CostOnlyRunner()
            self._execute = self._run_cost_only
            eos_ids: tuple[int, ...] = ()
        else:
            self.kv_cache = PagedKVCache(mcfg.num_hidden_layers, host_blocks, config.block_size,
                                         mcfg.num_key_value_heads, mcfg.head_dim)
            self.runner = ModelRunner(self.model, self.kv_cache)
            self._execute = self._run_model
            eos_ids = self.tokenizer.eos_token_ids
        tier_bytes = default_tier_bytes() if config.kv_host_bytes is None else config.kv_host_bytes
        self.kv_tier = self._make_kv_tier(profile, tier_bytes) if tier_bytes and config.enable_prefix_caching \
            else None
        self.lora = self._lora_slots(None if self.cost_only else mcfg) if config.enable_lora else None
        self.runner.lora = self.lora
        self.scheduler.admission_gate = self.scheduler.run_gate = self.lora.ready if self.lora is not None else None
        self.sampler = Sampler(eos_ids)
        self.outputs = OutputProcessor(self.tokenizer, eos_ids, self.max_model_len)
        self.requests: dict[str, Sequence] = {}
        self._seeds = np.random.default_rng(config.seed) if config.seed is not None else None
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0
        self.iteration_tokens = BucketCounts(ITERATION_TOKEN_BUCKETS)   # tokens per step (vLLM's)
        self.last_step_s = 0.0                        # the emulated duration of the last step that ran
        self.request_failures = 0                     # requests the engine finished with an error
        self.step_failures = 0
        self.consecutive_step_failures = 0
        self._step_outputs: list[RequestOutput] = []
        self._grammar: GrammarEngine | None = None
        self._grammar_lock = threading.Lock()      # made by the first caller: engine thread or event loop
        log.info("engine ready", extra={"model": str(self.model_dir or self.model_name), "device": config.device,
                                        "runner": config.runner,
                                        "profile": profile.name, "num_blocks": num_blocks,
                                        "host_blocks": host_blocks, "kv_host_budget_bytes": self.kv_host_budget_bytes,
                                        "max_model_len": self.max_model_len,
                                        "max_num_batched_tokens": config.max_num_batched_tokens,
                                        "long_prefill_token_threshold": config.long_prefill_token_threshold,
                                        "max_num_batched_attention": self.scheduler.config.max_num_batched_attention})

    def _make_kv_tier(self, profile: ModelProfile, host_bytes: int) -> HostKVTier:
        """The KV host tier, fed by the prefix cache's evictions, consulted at admission."""
        c = self.config
        tier = HostKVTier(TierConfig(host_bytes, c.cache_chunk_size, c.prefetch_depth, c.kv_tier_sync_load),
                          self.kv_cache, c.block_size, profile.kv_bytes_per_token * c.block_size,
                          self.device.cost_model.host_copy_seconds, clock=self.clock)
        self.block_manager.on_evict = tier.on_evict
        self.scheduler.kv_tier = tier
        return tier

    @property
    def info(self) -> EngineInfo:
        profile = self.device.profile
        return EngineInfo(model_dir=Path(self.model_dir) if self.model_dir else None, model_name=self.model_name,
                          max_model_len=self.max_model_len, block_size=self.config.block_size,
                          timing=self.config.timing, profile_name=profile.name,
                          kv_bytes_per_token=profile.kv_bytes_per_token)

    def _attention_budget(self, mcfg: LlamaConfig) -> int:
        """Prefill query–key pairs per step: as configured, or (None) what costs the served model
        `HOST_ATTENTION_SCORES_PER_STEP` on the host."""
        if self.config.max_num_batched_attention is not None:
            return self.config.max_num_batched_attention
        return host_attention_budget(mcfg.num_attention_heads, mcfg.num_hidden_layers)

    def _host_blocks(self, num_blocks: int, mcfg: LlamaConfig) -> int:
        """How many blocks the host budget holds (at most the emulated pool); ValueError when that
        cannot hold one sequence of `max_model_len` tokens."""
        per_block = PagedKVCache.block_bytes(mcfg.num_hidden_layers, self.config.block_size,
                                             mcfg.num_key_value_heads, mcfg.head_dim)
        host_blocks = min(num_blocks, self.kv_host_budget_bytes // per_block)
        needed = -(-self.max_model_len // self.config.block_size)
        if host_blocks < needed:
            raise ValueError(
                f"the host KV budget of {format_bytes(self.kv_host_budget_bytes)} holds {host_blocks} blocks of "
                f"{format_bytes(per_block)}, but one sequence of max_model_len {self.max_model_len} tokens needs "
                f"{needed} blocks ({format_bytes(needed * per_block)}); raise the budget (--kv-host-budget) or "
                "lower --max-model-len")
        return host_blocks

    def _lora_slots(self, mcfg: LlamaConfig | None) -> LoraSlots:
        """The adapter slots (engine/lora_slots.py), with `lora_modules` loaded; ValueError naming
        the adapter that cannot be served."""
        c = self.config
        slots = LoraSlots(max_loras=c.max_loras, max_cpu_loras=c.max_cpu_loras or c.max_loras,
                          max_rank=c.max_lora_rank, config=mcfg, price_copy=self.device.price_host_copy,
                          now=lambda: self.device.pacer.emulated_time_s)
        for name, path in c.lora_modules:
            try:
                slots.add(name, path)
            except AdapterError as exc:
                raise ValueError(f"LoRA adapter {name!r}: {exc}") from None
        return slots

    def resolve_lora(self, name: str | None):
        """The record of adapter `name` (None: the base model); UnknownAdapter when not served."""
        if name is None:
            return None
        if self.lora is None:
            raise UnknownAdapter(f"the model {name!r} does not exist (LoRA adapters are not enabled on this "
                                 "engine)", param="model", code="model_not_found")
        try:
            return self.lora.get(name)
        except KeyError:
            raise UnknownAdapter(f"the model {name!r} does not exist", param="model", code="model_not_found") from None
        except AdapterError as exc:          # dropped from the host cache, and its directory changed since
            raise RequestError(f"the LoRA adapter {name!r} cannot be read: {exc}", param="model") from None

    def add_lora(self, name: str, path: str):
        """Serve the PEFT adapter at `path` as `name` (replacing one of that name). AdapterError with
        the reason when it cannot be served (nothing changes); RequestError if LoRA is off."""
        if self.lora is None:
            raise RequestError("LoRA adapters are not enabled on this engine (--enable-lora)", param="lora_name")
        return self.lora.add(name, path)

    def remove_lora(self, name: str) -> bool:
        """Stop serving `name` to new requests (admitted ones finish); False if unknown."""
        return self.lora is not None and self.lora.remove(name)

    def list_loras(self) -> dict[str, str]:
        """Served adapters: name → directory."""
        return dict(self.lora.known) if self.lora is not None else {}

    @property
    def grammar(self) -> GrammarEngine:
        """The structured-output engine over this tokenizer, made at the first constrained request."""
        with self._grammar_lock:
            if self._grammar is None:
                self._grammar = GrammarEngine(self.tokenizer.hf.to_str(), self.vocab_size,
                                              self.tokenizer.eos_token_ids)
                self.sampler.grammar = self._grammar
        return self._grammar

    # ---- requests ---------------------------------------------------------------------------
    def validate(self, prompt: str | Seq[int], params: SamplingParams,
                 continuation: Continuation | None = None, lora: str | None = None) -> ValidatedRequest:
        """Check a request without touching engine state (safe from any thread): the prompt, the
        params (`max_tokens` resolved), a continuation's output so far, and the LoRA adapter named."""
        try:
            record = self.resolve_lora(lora)
            ids = self._token_ids(prompt)
            if not ids:
                raise RequestError("the prompt is empty", param="prompt")
            if self.cost_only and (refused := unsupported(params)) is not None:
                raise RequestError(refused[1], param=refused[0])
            check_token_ids(params.stop_token_ids, "stop_token_ids", self.vocab_size)
            params = self._resolve_token_rules(params)
            max_tokens = resolve_max_tokens(len(ids), params.max_tokens, params.min_tokens, self.max_model_len)
            if max_tokens != params.max_tokens:
                params = SamplingParams(**{**params.__dict__, "max_tokens": max_tokens})
            if continuation is not None:
                self._validate_continuation(ids, continuation, params)
        except RequestError:
            raise
        except InvalidRequest as exc:           # the shared rules' error, as the engine's
            raise RequestError(exc.message, param=exc.param, code=exc.code) from None
        return ValidatedRequest(ids, params, continuation, lora=record)

    def start_matcher(self, request: ValidatedRequest):
        """A future of the request's structured-output matcher, compiled on its own large-stack
        thread (safe from any thread): the async engine builds it before the request reaches
        the engine thread, which then never compiles a grammar."""
        return self.grammar.start_matcher(request.params.structured)

    def _resolve_token_rules(self, params: SamplingParams) -> SamplingParams:
        """The params with their token ids checked against this vocabulary (logit_bias,
        allowed_token_ids) and `bad_words` tokenized — each word alone and after a space, as a
        word inside a sentence is spelled."""
        vocab = self.vocab_size
        check_token_ids(params.logit_bias, "logit_bias token ids", vocab, param="logit_bias")
        if params.allowed_token_ids is not None:
            check_token_ids(params.allowed_token_ids, "allowed_token_ids", vocab)
        if params.bad_words and not params.bad_words_token_ids:
            variants: dict[tuple[int, ...], None] = {}
            for word in params.bad_words:
                for spelled in (word, " " + word.lstrip(" ")):
                    ids = tuple(self.tokenizer.encode(spelled))
                    if ids:
                        variants[ids] = None
            params = SamplingParams(**{**params.__dict__, "bad_words_token_ids": [list(v) for v in variants]})
        return params

    def _token_ids(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this engine has no tokenizer (the cost-only runner): give the prompt as "
                                   "token ids", param="prompt")
            return self.tokenizer.encode(check_text(prompt, "prompt"))
        return check_token_ids(prompt, "prompt token ids", self.vocab_size, param="prompt")

    def _check_vocabulary(self, what: str, ids: Seq[int], param: str) -> list[int]:
        return check_token_ids(ids, what, self.vocab_size, param=param)

    def _validate_continuation(self, ids: list[int], cont: Continuation, params: SamplingParams) -> None:
        """The output made elsewhere must be tokens this request could have produced: in the
        vocabulary, within the context and max_tokens with room for one more, `sent_chars` within
        its text; a KV source needs at least one of them (the first token, made with the KV)."""
        outputs = list(cont.output_token_ids)
        self._check_vocabulary("continuation output token ids", outputs, "continuation")
        if cont.kv_source is not None and not outputs:
            raise RequestError("a continuation with a KV source carries the first token made with that KV",
                               param="continuation")
        if len(ids) + len(outputs) >= self.max_model_len:
            raise RequestError(
                f"the prompt ({len(ids)} tokens) and the output so far ({len(outputs)} tokens) fill "
                f"this model's maximum context length of {self.max_model_len} tokens; nothing is left "
                "to generate", param="continuation")
        if len(outputs) >= params.max_tokens:
            raise RequestError(
                f"the output so far has {len(outputs)} tokens, but max_tokens is {params.max_tokens} "
                "(the whole output's limit); nothing is left to generate", param="continuation")
        text = IncrementalDetokenizer(self.tokenizer, ids, skip_special_tokens=params.skip_special_tokens
                                      ).add(outputs) if self.tokenizer is not None else ""
        if not 0 <= cont.sent_chars <= len(text):
            raise RequestError(
                f"sent_chars ({cont.sent_chars}) is outside the text of the output so far, which has "
                f"{len(text)} characters", param="continuation")

    def add_request(self, request_id: str, prompt: str | Seq[int] | None, params: SamplingParams | None = None,
                    priority: int = 0, arrival_time: float | None = None, validated: ValidatedRequest | None = None,
                    prefill_only: bool = False, continuation: Continuation | None = None,
                    lora: str | None = None) -> Sequence:
        """Queue a request (`validated`: already checked by `validate`, instead of prompt, params
        and continuation). A `continuation` goes on after the output made elsewhere (with a KV
        source: it waits for that KV first, see `take_kv_loads`). `prefill_only`: it ends after
        its first token with finish reason "prefilled" and its KV pinned under its request id
        (see `read_pinned_kv`)."""
        if validated is None:
            validated = self.validate(prompt, params or SamplingParams(), continuation, lora)
        if prefill_only and validated.continuation is not None:
            raise RequestError("a prefill-only request cannot be a continuation", param="continuation")
        seq = self._new_sequence(request_id, validated, priority, arrival_time)
        with self._undone_on_error(seq):
            seq.prefill_only = prefill_only
            self.scheduler.add(seq)
        return seq

    @contextmanager
    def _undone_on_error(self, seq: Sequence):
        """Whatever raises in the block leaves no trace of `seq` (no blocks, no queue entry)."""
        try:
            yield
        except BaseException:
            self._discard(seq, SequenceStatus.FINISHED_ERROR)
            raise

    def _discard(self, seq: Sequence, status: SequenceStatus, keep_output: bool = False) -> None:
        """Take `seq` out of wherever it is — waiting, waiting for its KV, running — freeing its
        blocks (`keep_output`: its text state stays for a last `make_output`)."""
        rid = seq.request_id
        if self.requests.get(rid) is seq:
            del self.requests[rid]
        if not keep_output:
            self.outputs.forget(rid)
        if seq.status in (SequenceStatus.WAITING, SequenceStatus.WAITING_FOR_KV, SequenceStatus.RUNNING) \
                and self._scheduled(seq):
            self.scheduler.abort(seq)
        elif seq.block_table:
            self.block_manager.free(seq)
        seq.status = status

    def _scheduled(self, seq: Sequence) -> bool:
        """Whether the scheduler holds `seq` (a sequence failing while being added does not yet)."""
        s = self.scheduler
        return (any(x is seq for x in s.running) or any(x is seq for x in s.waiting)
                or s.kv.loading(seq.request_id) is seq)

    def _unseeded_seed(self) -> int:
        """The seed of a request that brings none: from the engine's `seed` when one is configured
        (a reproducible run), else from the OS's entropy, so that two workers — or two choices of one
        request sent to different workers — never draw the same "random" text."""
        if self._seeds is not None:
            return int(self._seeds.integers(2**63))
        return secrets.randbits(63)

    def _new_sequence(self, request_id: str, request: ValidatedRequest, priority: int,
                      arrival_time: float | None) -> Sequence:
        if request_id in self.requests or self.scheduler.kv.pinned(request_id) is not None:
            raise RequestError(f"request id {request_id!r} is already in use")
        params = request.params
        seq = Sequence(request_id=request_id, prompt_token_ids=list(request.prompt_token_ids), params=params,
                       arrival_time=self.clock() if arrival_time is None else arrival_time,
                       priority=priority, max_total_tokens=self.max_model_len, lora=request.lora)
        if self.lora is not None:
            self.lora.count_request(request.lora)
        seq.rng = np.random.default_rng(params.seed if params.seed is not None else self._unseeded_seed())
        # a continuation's prompt logprobs were sent from where the request began
        seq.wants_prompt_logprobs = params.prompt_logprobs is not None and request.continuation is None
        self.requests[request_id] = seq
        with self._undone_on_error(seq):
            self.outputs.add(seq)
            if params.structured is not None:
                try:
                    seq.matcher = request.matcher or self.grammar.matcher(params.structured)
                except InvalidRequest as exc:
                    raise RequestError(exc.message, param=exc.param, code=exc.code) from None
            if request.continuation is not None:
                self._continue(seq, request.continuation)
        return seq

    def _continue(self, seq: Sequence, cont: Continuation) -> None:
        """Put `seq` where the request was left elsewhere: its outputs made but their KV not
        computed here — the state of a sequence preempted by recompute, so the scheduler computes
        prompt + outputs (the prompt's KV pulled instead, with a KV source), then samples the next
        token — its generator past their draws, the grammar past their tokens, the text the client
        has marked sent. Migration and the P/D split's decode side both come through here."""
        self.sampler.skip_draws(seq, len(cont.output_token_ids))
        self._advance_grammar(seq, cont.output_token_ids)
        self.outputs.resume(seq, list(cont.output_token_ids), cont.sent_chars)
        seq.kv_source = cont.kv_source
        if cont.kv_source is not None:
            seq.num_cached_tokens = cont.kv_source.cached_tokens

    @staticmethod
    def _advance_grammar(seq: Sequence, tokens) -> None:
        """Output produced elsewhere moves the grammar's state; RequestError if it cannot follow."""
        if seq.matcher is not None:
            try:
                advance(seq.matcher, tokens)
            except ValueError as exc:
                raise RequestError(f"the output produced so far does not follow the structured output: {exc}",
                                   param="continuation") from None

    def abort_request(self, request_id: str) -> RequestOutput | None:
        seq = self.requests.get(request_id)
        if seq is None:
            self.scheduler.release_pin(request_id)   # a pinned prefill whose caller went away
            return None
        self._discard(seq, SequenceStatus.FINISHED_ABORTED, keep_output=True)
        return self.outputs.make_output(seq, [], [])

    # ---- the KV connector: pinned prefills (the prefill side) ---------------------------------
    def read_pinned_kv(self, handle: str, skip_blocks: int = 0) -> KVBlocks:
        """The prompt KV of a pinned prefill, from block `skip_blocks` on. KeyError: unknown
        handle (released, expired, or never pinned here)."""
        kv = self.scheduler.kv
        seq = kv.pinned(handle)
        if seq is None:
            raise KeyError(handle)
        blocks = kv.prompt_blocks(seq)[skip_blocks:]
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
        return self.scheduler.release_pin(handle)

    def expire_pins(self) -> int:
        """Free the pins whose deadline passed; how many."""
        expired = self.scheduler.expire_pins()
        for seq in expired:
            log.warning("pinned KV expired before a decode worker released it",
                        extra={"request_id": seq.request_id})
        return len(expired)

    # ---- the KV connector: continuations waiting for their KV (the decode side) ---------------
    def take_kv_loads(self) -> list[KVLoad]:
        """The KV pulls the scheduler started since the last call: for the worker's side of the
        connector, which answers each with `finish_kv_load`."""
        return self.scheduler.kv.take_loads()

    def finish_kv_load(self, request_id: str, kv: KVBlocks | None) -> bool:
        """A continuation's KV arrived (`kv`: write it into the reserved blocks; the request decodes
        from its next step) or could not be had (None: the prompt is computed here instead, as
        after a preemption). False if the request is gone (aborted meanwhile). ValueError, changing
        nothing, when `kv` does not fit the blocks reserved for it."""
        seq = self.scheduler.kv.loading(request_id)
        if seq is None:
            return False
        if kv is not None:
            blocks = self.scheduler.kv.prompt_blocks(seq)
            first = seq.num_computed_tokens // self.config.block_size
            c = self.kv_cache
            shape = (c.num_layers, len(blocks) - first, c.block_size, c.num_kv_heads, c.head_dim)
            if kv.first_block != first or kv.k.shape != shape or kv.v.shape != shape or kv.k.dtype != c.dtype \
                    or kv.v.dtype != c.dtype:
                raise ValueError(f"expected KV blocks {shape} {c.dtype} from block {first}, got "
                                 f"{kv.k.shape} {kv.k.dtype} from block {kv.first_block}")
            if kv.num_blocks:
                self.kv_cache.write_blocks(blocks[kv.first_block:], kv.k, kv.v)
        self.scheduler.finish_kv_load(request_id, loaded=kv is not None)
        return True

    def price_kv_transfer(self, num_tokens: int, link: str) -> float:
        """Emulated seconds to receive `num_tokens` tokens' KV over `link` (recorded)."""
        return self.device.price_kv_transfer(num_tokens, link)

    def has_unfinished_requests(self) -> bool:
        """Requests waiting or running, or loading from the host tier (which ends on its own) —
        not those waiting for KV from another worker: their loads are out."""
        return self.scheduler.num_unfinished > 0 or (self.kv_tier is not None and self.kv_tier.num_loading > 0)

    def local_prefix_blocks(self, hashes: list[bytes]) -> int:
        """How many of `hashes`, from the first, this engine holds (HBM prefix cache or host tier).
        Safe from any thread: only dictionary lookups, and a stale answer costs a redundant fetch
        or a miss, never a wrong result."""
        held = self.block_manager.hash_to_block
        tier = self.kv_tier
        n = 0
        for h in hashes:
            if h not in held and (tier is None or tier.lookup([h]) == 0):
                break
            n += 1
        return n

    def next_kv_ready_at(self) -> float | None:
        """When the next host-tier load ends, on the engine's clock (a step from then on runs its
        request); None with none in flight."""
        return self.kv_tier.next_ready_at() if self.kv_tier is not None else None

    def idle_wait_s(self, longest: float) -> float:
        """How long a loop with nothing runnable may wait before the next step (at most `longest`):
        until the next host-tier load ends, or an idle engine waiting for a fuller batch
        (`batch_timeout_s`) starts anyway."""
        now = self.clock()
        times = [t for t in (self.next_kv_ready_at(), self.scheduler.batch_wait_until(now)) if t is not None]
        return min([longest] + [max(0.0, t - now) for t in times])

    def has_runnable_requests(self) -> bool:
        """Whether a step now can make progress without news from outside (a KV load finishing, an
        abort, a new request): something is running. With only waiting requests and nothing running
        after a step, the waiting ones did not fit beside the KV loads holding blocks."""
        return bool(self.scheduler.running) or (self.lora is not None and self.lora.loading)

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step. An exception raised for one request — sampling its row, detokenizing or
        stop-checking its token — finishes that request with finish_reason "error" (its output
        carries the error) and the others go on. An exception of the step as a whole (scheduling,
        the model's forward pass, pricing) cannot be pinned on one request: every request of the
        step fails, the pool is checked, and the engine goes on — unless the pool no longer adds
        up or `MAX_STEP_FAILURES` steps in a row failed, when `EngineBroken` is raised."""
        started = self.clock()
        self._step_outputs: list[RequestOutput] = []
        self.last_step_s = 0.0
        sched = None
        try:
            if self.kv_tier is not None:
                self.kv_tier.poll(self.scheduler)    # host-tier loads that ended: their requests run
            if self.lora is not None:
                s = self.scheduler
                self.lora.begin_step(s.block_holders(), s.waiting,
                                     admissible=s.config.max_num_seqs - len(s.running) - s.kv.num_loading)
            sched = self.scheduler.schedule()
            if sched.empty and self.lora is not None and self.scheduler.running and not self.lora.loading:
                self.lora.begin_step(self.scheduler.block_holders())   # the newcomers chosen could not
                sched = self.scheduler.schedule()                        # start (no KV): the running go
            if sched.empty:
                if self.lora is not None:      # only adapter copies under way: the card waits for one
                    self.device.idle(self.lora.idle())
                return []
            self._account_step(sched, started)
            inp, tokens, logprobs, errors = self._execute(sched)
            self._postprocess(sched, inp.sampling, tokens, logprobs, errors)
            self.last_step_s = self.device.run_step(inp.shape, started).seconds
            if self.lora is not None and (stall := self.lora.take_stall()):
                self.last_step_s += self.device.stall(stall)   # slot copies the step waited for
            if self.kv_tier is not None and (stall := self.kv_tier.take_stall()):
                self.last_step_s += self.device.stall(stall)   # sync_load: the copies were on the path
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, the engine is checked
            self._fail_step(sched, exc)
        else:
            self.consecutive_step_failures = 0
            self.steps += 1
        return self._step_outputs

    def _account_step(self, sched, started: float) -> None:
        """vLLM's per-step figures: a request's first step ends its WAITING phase; the step's
        token count goes into `iteration_tokens` (ITERATION_TOKEN_BUCKETS)."""
        tokens = 0
        for s in sched.scheduled:
            tokens += s.num_new_tokens
            if s.seq.first_scheduled_time is None:
                s.seq.first_scheduled_time = started
        self.iteration_tokens.observe(tokens)

    def _run_model(self, sched):
        """The forward pass and the sampler: (the step's input, tokens, logprobs, row errors)."""
        self.sampler.prefetch_masks([s.seq for s in sched.scheduled])   # computed during the forward
        logits, inp = self.runner.run(sched)
        seqs = [s.seq for s in inp.sampling]
        self._prompt_logprobs(logits[len(seqs):], inp.prompt_spans)
        tokens, logprobs, errors = self.sampler.sample(logits[:len(seqs)], seqs) if seqs else ([], [], {})
        errors.update({i: s.prompt_logprobs_error for i, s in enumerate(seqs) if s.prompt_logprobs_error})
        return inp, tokens, logprobs, errors

    def _run_cost_only(self, sched):
        """No forward pass: a placeholder token per sampling sequence (cost_only_runner.py)."""
        inp = self.runner.run(sched)
        return inp, self.runner.tokens(inp), [None] * len(inp.sampling), {}

    def _prompt_logprobs(self, rows: np.ndarray, spans) -> None:
        """Append each span's prompt-token logprobs to its sequence. A sequence whose computation
        raises keeps the error and fails alone when it samples."""
        at = 0
        for s, first, count in spans:
            seq = s.seq
            try:
                tokens = seq.prompt_token_ids[first + 1:first + 1 + count]
                seq.prompt_logprobs.extend(self.sampler.prompt_logprobs(
                    rows[at:at + count], tokens, seq.params.prompt_logprobs or 0))
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                seq.prompt_logprobs_error, seq.wants_prompt_logprobs = exc, False
            at += count

    def _postprocess(self, sched, sampling, tokens, logprobs, errors=None) -> list[RequestOutput]:
        """Account for the step's computed tokens, then each sampled token; `errors`: the rows
        whose sampling raised (their requests fail). Returns the step's outputs.

        One pass over the rows with everything that is the same for all of them looked up once; a
        row with nothing special (no grammar, not prefill-only) goes through the stop rules and its
        output without a further call (`_on_sampled` is the general case)."""
        errors = errors or {}
        self._step_outputs = outs = []
        bm = self.block_manager
        window = self.sliding_window
        for s in sched.scheduled:
            seq = s.seq
            computed, n_prompt = seq.num_computed_tokens, len(seq.prompt_token_ids)
            if computed < n_prompt:
                self.prompt_tokens += min(s.num_new_tokens, n_prompt - computed)
            seq.num_computed_tokens = computed + s.num_new_tokens
            bm.cache_blocks(seq)
            if window and not seq.prefill_only:   # a pinned prefill's KV is sent whole
                bm.release_out_of_window(seq, window)
        now = self.clock()
        on_token, make_output = self.outputs.on_token, self.outputs.make_output
        finish, requests = self.scheduler.finish, self.requests
        for i, (s, token, lp) in enumerate(zip(sampling, tokens, logprobs)):
            seq = s.seq
            if errors and i in errors:
                self._fail_request(seq, errors[i])
                continue
            try:
                if seq.matcher is not None or seq.prefill_only or seq.wants_prompt_logprobs:
                    self._on_sampled(seq, token, lp, now)
                    continue
                if seq.first_token_time is None:
                    seq.first_token_time = now
                self.generation_tokens += 1
                finished = on_token(seq, token)
                if finished is not None:
                    finish(seq, finished)
                    requests.pop(seq.request_id, None)
                outs.append(make_output(seq, [token], [lp] if lp is not None else []))
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                self._fail_request(seq, exc)
        return outs

    def _on_sampled(self, seq: Sequence, token: int, lp, now: float) -> None:
        if seq.first_token_time is None:
            seq.first_token_time = now
        self.generation_tokens += 1
        if seq.matcher is not None:
            advance(seq.matcher, [token])
        finished = self.outputs.on_token(seq, token)
        if finished is None and seq.matcher is not None and seq.matcher.is_stopped():
            finished = SequenceStatus.FINISHED_STOPPED         # the grammar is complete
        if finished is None and seq.prefill_only:
            self.scheduler.hand_off(seq, self.config.kv_pin_ttl_s)   # blocks stay, pinned
            self.requests.pop(seq.request_id, None)
        elif finished is not None:
            self.scheduler.finish(seq, finished)
            self.requests.pop(seq.request_id, None)
        out = self.outputs.make_output(seq, [token], [lp] if lp is not None else [])
        if seq.wants_prompt_logprobs and not seq.prompt_logprobs_sent:
            out.prompt_logprobs, seq.prompt_logprobs_sent = list(seq.prompt_logprobs), True
        self._step_outputs.append(out)

    def _fail_request(self, seq: Sequence, exc: BaseException) -> None:
        """Finish `seq` with finish_reason "error" (its blocks freed); the others go on."""
        error = f"{type(exc).__name__}: {exc}"
        log.error("the engine failed a request; it alone is finished with an error",
                  exc_info=(type(exc), exc, exc.__traceback__),
                  extra={"request_id": seq.request_id, "error": error})
        self.request_failures += 1
        self._discard(seq, SequenceStatus.FINISHED_ERROR)
        self._step_outputs.append(RequestOutput(
            request_id=seq.request_id, new_token_ids=[], new_text="", finished=True, finish_reason=FinishReason.ERROR,
            num_prompt_tokens=seq.num_prompt_tokens, num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens, error=error))

    def _fail_step(self, sched, exc: Exception) -> None:
        """A step failed as a whole: fail the requests it computed, then decide whether the engine
        can go on (raising EngineBroken when not)."""
        self.consecutive_step_failures += 1
        self.step_failures += 1
        log.error("an engine step failed; its requests are finished with an error",
                  exc_info=(type(exc), exc, exc.__traceback__),
                  extra={"consecutive": self.consecutive_step_failures, "error": f"{type(exc).__name__}: {exc}"})
        done = {o.request_id for o in self._step_outputs}
        try:
            for s in (sched.scheduled if sched is not None else []):
                if s.seq.request_id not in done and not s.seq.status.finished:
                    self._fail_request(s.seq, StepFailed(f"the engine step that computed it failed: "
                                                         f"{type(exc).__name__}: {exc}"))
            self.check_invariants()
        except Exception as broken:  # noqa: BLE001
            raise EngineBroken(f"an engine step failed ({type(exc).__name__}: {exc}) and the KV pool "
                               f"no longer adds up ({type(broken).__name__}: {broken})") from exc
        if self.consecutive_step_failures >= MAX_STEP_FAILURES:
            raise EngineBroken(f"{self.consecutive_step_failures} engine steps in a row failed "
                               f"(last: {type(exc).__name__}: {exc})") from exc

    # ---- observability ----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm, pacer = self.block_manager, self.device.pacer
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            kv_usage=bm.usage, num_blocks=bm.num_blocks, num_free_blocks=bm.num_free_blocks,
            prefix_hit_rate=bm.prefix_hit_rate, num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens=self.prompt_tokens, generation_tokens=self.generation_tokens, steps=self.steps,
            emulated_time_s=pacer.emulated_time_s, host_time_s=pacer.host_time_s,
            lag_time_s=pacer.lag_time_s, num_pinned=self.scheduler.kv.num_pinned,
            num_pinned_blocks=self.scheduler.kv.num_pinned_blocks, num_receiving=self.scheduler.kv.num_loading,
            kv_transfers=self.device.kv_transfers,
            kv_transfer_s=self.device.kv_transfer_s, kv_transfer_bytes=self.device.kv_transfer_bytes,
            request_failures=self.request_failures, step_failures=self.step_failures,
            kv_host_bytes=self.kv_cache.host_bytes, kv_host_budget_bytes=self.kv_host_budget_bytes,
            kv_host_blocks=bm.host_blocks, kv_cached_blocks=bm.num_cached_blocks, kv_evictions=bm.evictions,
            kv_host_limited=bm.host_limited, prefix_queries=bm.prefix_queries, prefix_hits=bm.prefix_hits,
            iteration_tokens=BucketCounts(self.iteration_tokens.bounds, list(self.iteration_tokens.counts),
                                          self.iteration_tokens.total, self.iteration_tokens.count),
            lora=self._lora_stats(), **self._tier_stats())

    def _lora_stats(self) -> dict | None:
        if self.lora is None:
            return None
        s = self.scheduler
        return {**self.lora.info(s.block_holders(), s.waiting), "loads": self.lora.loads,
                "load_s": self.lora.load_s, "requests": dict(self.lora.requests)}

    def _tier_stats(self) -> dict:
        tier = self.kv_tier
        if tier is None:
            return {}
        t = tier.stats
        return dict(kv_tier_bytes=tier.used_bytes, kv_tier_budget_bytes=tier.config.host_bytes,
                    kv_tier_blocks=tier.num_blocks, kv_tier_loading=tier.num_loading, kv_tier_queries=t.queries,
                    kv_tier_hits=t.hits, kv_tier_bytes_stored=t.bytes_stored, kv_tier_bytes_loaded=t.bytes_loaded,
                    kv_tier_loads=t.loads, kv_tier_loads_partial=t.loads_partial,
                    kv_tier_loads_failed=t.loads_failed, kv_tier_load_buckets=tuple(t.load_s_buckets),
                    kv_tier_load_s_sum=t.load_s_sum)

    def check_invariants(self) -> None:
        """The pool adds up, counting every holder of blocks: running, pinned, waiting for KV."""
        self.block_manager.check_invariants(self.scheduler.block_holders())
