"""`Scheduler`: continuous batching that counts tokens, not phases.

Every sequence has `num_computed_tokens`; a step gives each scheduled sequence some new tokens to
compute. Running sequences go first (a decode is one new token; an unfinished prefill continues
with its next chunk), then waiting prompts fill what is left of the token budget
(`max_num_batched_tokens`) and the sequence budget (`max_num_seqs`), a chunk at a time when chunked
prefill is on. Prefix-cache hits simply start a prompt with `num_computed_tokens > 0`.

Order: lower `priority` first, then earlier arrival. When the block pool runs dry, the running
sequence that comes last in that order is preempted (its blocks freed, recomputed later).
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from .block_manager import BlockManager
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

    def detach(self, seq: Sequence, status: SequenceStatus) -> None:
        """A running sequence leaves the scheduler but keeps its blocks (pinned prefill KV)."""
        self.running.remove(seq)
        seq.status = status

    def add_running(self, seq: Sequence) -> None:
        """A sequence whose blocks are allocated and whose KV is in place (received from a
        prefill instance) joins the running set; its next step computes its remaining tokens."""
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq)

    def abort(self, seq: Sequence) -> None:
        if seq.status == SequenceStatus.RUNNING:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
            heapq.heapify(self.waiting)
            seq.status = SequenceStatus.FINISHED_ABORTED

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
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            # prompt logprobs need every prompt position's logits: cached blocks would skip them
            computed = [] if seq.needs_prompt_logits else bm.get_computed_blocks(seq)
            num_cached = len(computed) * bm.block_size
            num_new = self._num_new_tokens(seq.num_tokens - num_cached, budget)
            if num_new == 0 or not bm.allocate_slots(seq, num_new, computed):
                break
            heapq.heappop(self.waiting)
            bm.record_prefix_lookup(seq.num_tokens, num_cached)
            if seq.num_preemptions == 0:     # of the prompt: a resumed request's outputs may hit too
                seq.num_cached_tokens = min(num_cached, seq.num_prompt_tokens)
            seq.num_computed_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            out.num_batched_tokens += num_new
            budget -= num_new

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
