"""`Scheduler`: continuous batching that counts tokens, not phases.

Every sequence has `num_computed_tokens`; a step gives each scheduled sequence some new tokens to
compute. Decodes go first (one new token each), then the running prefills continue with their next
chunk, then waiting prompts fill what is left of the step's budget (`step_budget.StepBudget`:
`max_num_batched_tokens` tokens, at most `long_prefill_token_threshold` of one prefill, and
`max_num_batched_attention` query–key pairs of prefill attention) and of `max_num_seqs`, a chunk at
a time when chunked prefill is on. So a long prompt cannot hold back anyone's next token for more
than one step's budget. At most `max_num_partial_prefills` prompts are part-way through their
prefill at once; a prompt that would start another waits, and shorter prompts behind it that fit
whole in the step go first. Prefix-cache hits simply start a prompt with `num_computed_tokens > 0`.

Order: lower `priority` first, then earlier arrival (within decodes, and within prefills). When the
block pool runs dry, the running sequence that comes last in that order is preempted (its blocks
freed, recomputed later) — even one already scheduled in this step, which then gives its tokens back.

The scheduler owns every holder of blocks: the running set, and through its KV connector
(`kv_connector.SchedulerKVConnector`) the prefills pinned for a decode worker and the
continuations waiting for their KV (`WAITING_FOR_KV`). A waiting continuation with a KV source is
admitted like any waiting sequence — in its turn, through `BlockManager.admit` — but with blocks
for its prompt only and no compute this step: it waits for its KV, then runs (`finish_kv_load`).
With a KV host tier (`kv_tier.py`), a waiting sequence whose prefix the tier holds is parked the
same way while that prefix loads (`HostKVTier.admit`), then computes the rest.
"""

from __future__ import annotations

import bisect
import heapq
import time
from dataclasses import dataclass, field
from typing import Callable

from .block_manager import BlockManager
from .kv_connector import SchedulerKVConnector
from .sequence import Sequence, SequenceStatus
from .step_budget import StepBudget


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0     # new tokens of one prefill per step; 0: no cap
    max_num_partial_prefills: int = 1         # prompts part-way through their prefill at once
    max_num_batched_attention: int = 0        # prefill query–key pairs per step; 0: no limit

    def __post_init__(self):
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be at least 1")
        if self.long_prefill_token_threshold < 0 or self.max_num_batched_attention < 0:
            raise ValueError("long_prefill_token_threshold and max_num_batched_attention must be at least 0 "
                             "(0: no limit)")
        if self.max_num_partial_prefills < 1:
            raise ValueError(f"max_num_partial_prefills must be at least 1, got {self.max_num_partial_prefills}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens}) must "
                f"be at least max_model_len ({self.max_model_len}), or long prompts could never run")


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step reaches the sequence's last known token, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.block_manager = block_manager
        self.kv = SchedulerKVConnector(block_manager.block_size, clock)   # pins' deadlines on `clock`
        self.waiting: list[Sequence] = []   # heap by (priority, arrival)
        self.running: list[Sequence] = []   # sorted by (priority, arrival)
        self.num_preemptions = 0
        self.kv_tier = None                 # the KV host tier (kv_tier.HostKVTier), if any
        # Whether a waiting sequence may be admitted now (lora_slots.LoraSlots.ready: its adapter
        # is in a device slot); one that may not stays queued without holding back the others.
        self.admission_gate: Callable[[Sequence], bool] | None = None
        # Whether a running sequence takes part in this step (the same LoRA gate: its adapter is
        # one of the step's); one that does not keeps its blocks and skips the step.
        self.run_gate: Callable[[Sequence], bool] | None = None

    # ---- queue changes ----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        heapq.heappush(self.waiting, seq)

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """A running sequence is done: release its blocks."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = status

    def abort(self, seq: Sequence) -> None:
        """Take `seq` out wherever it waits or runs, freeing its blocks."""
        if seq.status == SequenceStatus.RUNNING:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
            return
        if seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
            heapq.heapify(self.waiting)
        elif seq.status == SequenceStatus.WAITING_FOR_KV:
            self.kv.finish_load(seq.request_id)
            self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED_ABORTED

    # ---- the KV connector's transitions ------------------------------------------------------
    def hand_off(self, seq: Sequence, ttl_s: float) -> None:
        """A prefill-only sequence has its first token: it leaves the running set, its blocks
        pinned for the decode worker that continues it."""
        self.running.remove(seq)
        seq.status = SequenceStatus.PREFILLED
        self.kv.pin(seq, ttl_s)

    def release_pin(self, handle: str) -> bool:
        """The decode worker has the KV (or gave up on it): free the pinned blocks (their full
        blocks stay in the prefix cache). False for an unknown handle."""
        seq = self.kv.unpin(handle)
        if seq is None:
            return False
        self.block_manager.free(seq)
        return True

    def expire_pins(self) -> list[Sequence]:
        """Free the pins whose deadline passed; returns them."""
        expired = self.kv.pop_expired()
        for seq in expired:
            self.block_manager.free(seq)
        return expired

    def finish_kv_load(self, request_id: str, loaded: bool,
                       num_computed_tokens: int | None = None) -> Sequence | None:
        """End a continuation's wait for its KV: with the prompt's KV written into its blocks
        (`loaded`) it runs from its next step; otherwise its blocks are freed and it waits again,
        without a KV source, to be computed here (as after a preemption). None if it is no longer
        waiting (aborted meanwhile). `num_computed_tokens`: the tokens whose KV is now in its blocks
        (default: the prompt's; the host tier loads a prefix, and the rest is computed)."""
        seq = self.kv.finish_load(request_id)
        if seq is None:
            return None
        if loaded:
            seq.num_computed_tokens = seq.num_prompt_tokens if num_computed_tokens is None else num_computed_tokens
            self.block_manager.cache_blocks(seq)
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq)
        else:
            self.block_manager.free(seq)
            seq.kv_source = None
            seq.num_computed_tokens = 0
            self.add(seq)
        return seq

    def block_holders(self) -> list[Sequence]:
        """Every sequence that references blocks: running, pinned, waiting for its KV."""
        return list(self.running) + self.kv.sequences()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- one step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        c = self.config
        budget = StepBudget(tokens=c.max_num_batched_tokens, attention_limit=c.max_num_batched_attention or None,
                            chunk_tokens=c.long_prefill_token_threshold, chunked=c.enable_chunked_prefill)
        self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: StepBudget) -> None:
        """Every decode, then every unfinished prefill's next chunk, each in order; when the pool
        runs dry, preempt from the back of the order."""
        remaining = [(s, s.num_tokens - s.num_computed_tokens) for s in self.running]
        in_order = [r for r in remaining if r[1] == 1] + [r for r in remaining if r[1] > 1]  # decodes first
        for seq, num_remaining in in_order:
            if budget.tokens <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted for one before it
                continue
            if self.run_gate is not None and not self.run_gate(seq):
                continue
            num_new = budget.num_new_tokens(num_remaining, seq.num_computed_tokens)
            if num_new == 0 or not self._allocate(seq, num_new, out, budget):
                continue
            self._add_scheduled(out, budget, seq, num_new, prefill=num_remaining > 1)

    def _allocate(self, seq: Sequence, num_new: int, out: SchedulerOutput, budget: StepBudget) -> bool:
        """Blocks for `seq`'s next `num_new` tokens, preempting from the back of the order until
        they fit; False when `seq` itself was preempted."""
        while not self.block_manager.allocate_slots(seq, num_new):
            victim = self.running[-1]
            self._preempt(victim, out, budget)
            if victim is seq:
                return False
        return True

    def _add_scheduled(self, out: SchedulerOutput, budget: StepBudget, seq: Sequence, num_new: int,
                       prefill: bool) -> None:
        budget.take(seq, num_new, seq.num_computed_tokens, prefill)
        out.scheduled.append(ScheduledSequence(seq, num_new))
        out.num_batched_tokens += num_new

    def _num_partial_prefills(self, out: SchedulerOutput) -> int:
        """Running prompts that this step leaves part-way through their prefill."""
        scheduled = {id(s.seq): s.num_new_tokens for s in out.scheduled}
        return sum(1 for seq in self.running
                   if seq.num_tokens - seq.num_computed_tokens > 1
                   and seq.num_tokens - seq.num_computed_tokens > scheduled.get(id(seq), 0))

    def _schedule_waiting(self, out: SchedulerOutput, budget: StepBudget) -> None:
        if not self.waiting:
            return
        bm = self.block_manager
        partial = self._num_partial_prefills(out)
        held_back: list[Sequence] = []     # would start another partial prefill: back in the queue after
        try:
            # a continuation waiting for its KV will run: it counts against max_num_seqs already
            while self.waiting and budget.tokens > 0 and \
                    len(self.running) + self.kv.num_loading < self.config.max_num_seqs:
                seq = self.waiting[0]
                if self.admission_gate is not None and not self.admission_gate(seq):
                    held_back.append(heapq.heappop(self.waiting))
                    continue
                if self.kv_tier is not None and self.kv_tier.admit(self, seq):
                    continue                  # parked while its prefix loads from the host tier
                if seq.kv_source is not None:
                    if not self._admit_for_kv(seq):
                        break
                    continue
                too_many_partial = False

                def new_tokens(num_remaining: int) -> int | None:
                    nonlocal too_many_partial
                    num_new = budget.num_new_tokens(num_remaining, seq.num_tokens - num_remaining)
                    if 0 < num_new < num_remaining and partial >= self.config.max_num_partial_prefills:
                        too_many_partial = True
                        return None
                    return num_new or None

                # prompt logprobs need every prompt position's logits: cached blocks would skip them
                admitted = bm.admit(seq, new_tokens, max_cached_tokens=0 if seq.needs_prompt_logits else None)
                if admitted is None:
                    if too_many_partial:      # it waits for a prefill in progress; others may fit whole
                        held_back.append(heapq.heappop(self.waiting))
                        continue
                    break
                heapq.heappop(self.waiting)
                if seq.num_preemptions == 0:     # of the prompt: a continuation's outputs may hit too
                    seq.num_cached_tokens = min(admitted.num_cached_tokens, seq.num_prompt_tokens)
                seq.num_computed_tokens = admitted.num_cached_tokens
                seq.status = SequenceStatus.RUNNING
                bisect.insort(self.running, seq)
                num_remaining = seq.num_tokens - seq.num_computed_tokens
                if admitted.num_new_tokens < num_remaining:
                    partial += 1
                self._add_scheduled(out, budget, seq, admitted.num_new_tokens, prefill=num_remaining > 1)
        finally:
            for seq in held_back:
                heapq.heappush(self.waiting, seq)

    def _admit_for_kv(self, seq: Sequence) -> bool:
        """Blocks for a KV continuation's prompt (its cached prefix reused); it then waits for the
        rest of the prompt's KV. False when the pool has no room now."""
        admitted = self.block_manager.admit(seq, lambda n: n - seq.num_output_tokens,
                                            max_cached_tokens=seq.num_prompt_tokens)
        if admitted is None:
            return False
        heapq.heappop(self.waiting)
        seq.num_cached_tokens = max(seq.num_cached_tokens, admitted.num_cached_tokens)
        seq.num_computed_tokens = admitted.num_cached_tokens
        seq.status = SequenceStatus.WAITING_FOR_KV
        self.kv.start_load(seq, admitted.num_cached_tokens)
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput, budget: StepBudget) -> None:
        """Recompute preemption: drop the KV, send the sequence back to the waiting queue (taking
        it out of this step if it was already scheduled)."""
        for i, s in enumerate(out.scheduled):
            if s.seq is seq:
                del out.scheduled[i]
                out.num_batched_tokens -= budget.refund(seq)
                break
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.add(seq)
