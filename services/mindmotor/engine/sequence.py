"""`Sequence`: one request inside the engine — its tokens, how many of them are in the KV cache,
its blocks, and its place in the queue."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mindmotor.vocabulary import SequenceStatus

from mindmotor.common.block_hash import ROOT_HASH

from .continuation import KVSource
from mindmotor.rules.sampling_params import SamplingParams


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0                      # lower runs first; FCFS within a priority
    aged: bool = False                     # waited the scheduler's priority_aging_s: ahead of all that have not
    status: SequenceStatus = SequenceStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)   # with those made elsewhere (a continuation)
    num_computed_tokens: int = 0           # tokens whose K/V are in the cache
    num_cached_tokens: int = 0             # of the prompt, found in the prefix cache at admission
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # of the full blocks, in order
    num_preemptions: int = 0
    max_total_tokens: int = 0              # prompt + output may not exceed this (model context)
    prefill_only: bool = False             # stop after the first token and pin the KV (P/D split)
    kv_source: KVSource | None = None      # a continuation whose prompt KV is pulled, not computed
    stop_reason: int | str | None = None
    rng: np.random.Generator | None = None
    first_scheduled_time: float | None = None   # the start of its first step (vLLM: leaves WAITING)
    first_token_time: float | None = None
    kv_tier_load: tuple[float, float, int] | None = None   # its last host-tier load: start, end (engine clock), blocks
    output_text: str = ""
    logprobs: list = field(default_factory=list)
    # prompt_logprobs asked: one per prompt token after the first, computed by this engine's prefill
    # (False for a continuation: the instance where the request began computed them)
    wants_prompt_logprobs: bool = False
    prompt_logprobs: list = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    prompt_logprobs_error: Exception | None = None   # computing them raised: the request fails
    matcher: object | None = None          # structured output: the grammar's state (llguidance.LLMatcher)
    lora: object | None = None             # its LoRA adapter (lora_slots.AdapterRecord); None: the base model

    @property
    def hash_root(self) -> bytes:
        """Where its prefix-cache hash chain starts: the base model's root, or its adapter's."""
        return ROOT_HASH if self.lora is None else self.lora.hash_root

    @property
    def needs_prompt_logits(self) -> bool:
        """Whether prompt positions still need their logits (so no prefix-cache hit may skip them)."""
        return self.wants_prompt_logprobs and len(self.prompt_logprobs) < len(self.prompt_token_ids) - 1

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def sort_key(self) -> tuple[int, int, float]:
        """Who runs first (smallest) and who is preempted first (largest): aged sequences first,
        oldest first; then the others by (priority, arrival)."""
        if self.aged:
            return (0, 0, self.arrival_time)
        return (1, self.priority, self.arrival_time)

    def __lt__(self, other: "Sequence") -> bool:
        return self.sort_key < other.sort_key


def token_slice(seq: Sequence, start: int, end: int) -> list[int]:
    """seq.all_token_ids[start:end] without building the whole list."""
    n_prompt = len(seq.prompt_token_ids)
    if start >= n_prompt:
        return seq.output_token_ids[start - n_prompt:end - n_prompt]
    if end <= n_prompt:
        return seq.prompt_token_ids[start:end]
    return seq.prompt_token_ids[start:] + seq.output_token_ids[:end - n_prompt]
