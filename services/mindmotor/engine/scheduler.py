"""`Scheduler`: continuous batching that counts tokens, not phases.

Every sequence has `num_computed_tokens`; a step gives each scheduled sequence some new tokens to
compute. Running sequences go first (a decode is one new token; an unfinished prefill continues
with its next chunk), then waiting prompts fill what is left of the token budget
(`max_num_batched_tokens`) and the sequence budget (`max_num_seqs`), a chunk at a time when chunked
prefill is on. Prefix-cache hits simply start a prompt with `num_computed_tokens > 0`.

Order: lower `priority` first, then earlier arrival. When the block pool runs dry, the running
sequence that comes last in that order is preempted (its blocks freed, recomputed later).

The scheduler owns every holder of blocks: the running set, and through its KV connector
(`kv_connector.SchedulerKVConnector`) the prefills pinned for a decode worker and the
continuations waiting for their KV (`WAITING_FOR_KV`). A waiting continuation with a KV source is
admitted like any waiting sequence — in its turn, through `BlockManager.admit` — but with blocks
for its prompt only and no compute this step: it waits for its KV, then runs (`finish_kv_load`).
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .kv_connector import SchedulerKVConnector
from .sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True

    def __post_init__(self):
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be at least 1")
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
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.kv = SchedulerKVConnector(block_manager.block_size)
        self.waiting: list[Sequence] = []   # heap by (priority, arrival)
        self.running: list[Sequence] = []   # sorted by (priority, arrival)
        self.num_preemptions = 0

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

    def finish_kv_load(self, request_id: str, loaded: bool) -> Sequence | None:
        """End a continuation's wait for its KV: with the prompt's KV written into its blocks
        (`loaded`) it runs from its next step; otherwise its blocks are freed and it waits again,
        without a KV source, to be computed here (as after a preemption). None if it is no longer
        waiting (aborted meanwhile)."""
        seq = self.kv.finish_load(request_id)
        if seq is None:
            return None
        if loaded:
            seq.num_computed_tokens = seq.num_prompt_tokens
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
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Decodes and unfinished prefills of running sequences, in order; preempt from the back."""
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = self._num_new_tokens(seq.num_tokens - seq.num_computed_tokens, budget)
            if num_new == 0:
                i += 1
                continue
            while not self.block_manager.allocate_slots(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSequence(seq, num_new))
                out.num_batched_tokens += num_new
                budget -= num_new
                i += 1
                continue
            break  # seq itself was preempted: everything after it is gone too
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        # a continuation waiting for its KV will run: it counts against max_num_seqs already
        while self.waiting and budget > 0 and len(self.running) + self.kv.num_loading < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.kv_source is not None:
                if not self._admit_for_kv(seq):
                    break
                continue
            # prompt logprobs need every prompt position's logits: cached blocks would skip them
            admitted = bm.admit(seq, lambda n: self._num_new_tokens(n, budget) or None,
                                max_cached_tokens=0 if seq.needs_prompt_logits else None)
            if admitted is None:
                break
            heapq.heappop(self.waiting)
            if seq.num_preemptions == 0:     # of the prompt: a continuation's outputs may hit too
                seq.num_cached_tokens = min(admitted.num_cached_tokens, seq.num_prompt_tokens)
            seq.num_computed_tokens = admitted.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq)
            out.scheduled.append(ScheduledSequence(seq, admitted.num_new_tokens))
            out.num_batched_tokens += admitted.num_new_tokens
            budget -= admitted.num_new_tokens

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

    def _num_new_tokens(self, num_remaining: int, budget: int) -> int:
        if num_remaining <= budget:
            return num_remaining
        return budget if self.config.enable_chunked_prefill else 0

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute preemption: drop the KV, send the sequence back to the waiting queue."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.add(seq)
