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

Classes (a `priority` is a class: the coordinator's SLO classes map to −10, 0, 10):
- a waiting sequence that finds no slot or no blocks preempts the running one last in the order if
  it is of a less urgent class (vLLM's priority policy); waiting sequences ahead of every running
  prefill are admitted before its chunk, and one more urgent than every prompt part-way through
  is not held back by `max_num_partial_prefills`;
- `lower_class_prefill_tokens`: beside more urgent work — and always for priorities above 0 —
  less urgent prompts' chunks get at most that many tokens a step (`StepBudget`), and a step that
  starts a more urgent prompt computes nothing of the less urgent sequences;
- `priority_aging_s`: a class that has waited that long for a start has its oldest waiting
  sequence aged — ahead of every sequence that is not, never preempted for one (`_age`) — so no
  class waits more than that plus one step for a start (`wait_bound_s`);
- `batch_timeout_s` / `preferred_batch_size`: an idle engine waits for a fuller batch
  (`batch_wait_until`; Triton's dynamic batching).

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
    # SLO classes (module docstring, "Classes")
    priority_aging_s: float = 0.0             # a class that has waited this long for a start: its oldest request goes
                                              # ahead of all others (a bounded wait, no starvation); 0: no aging
    lower_class_prefill_tokens: int = 0       # prefill tokens of less urgent sequences in a step with more urgent
                                              # work; 0: no cap beyond the step's budgets
    preferred_batch_size: int = 0             # an idle engine waits for this many waiting requests ...
    batch_timeout_s: float = 0.0              # ... at most this long after the oldest arrived; 0: never waits

    def __post_init__(self):
        if self.priority_aging_s < 0 or self.batch_timeout_s < 0:
            raise ValueError(f"priority_aging_s and batch_timeout_s must be at least 0 (0: off), got "
                             f"{self.priority_aging_s} and {self.batch_timeout_s}")
        if self.lower_class_prefill_tokens < 0 or self.preferred_batch_size < 0:
            raise ValueError(f"lower_class_prefill_tokens and preferred_batch_size must be at least 0 (0: off), got "
                             f"{self.lower_class_prefill_tokens} and {self.preferred_batch_size}")
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
        self.clock = clock
        self.kv = SchedulerKVConnector(block_manager.block_size, clock)   # pins' deadlines on `clock`
        self.waiting: list[Sequence] = []   # heap by Sequence.sort_key: aged, then (priority, arrival)
        self.running: list[Sequence] = []   # sorted the same way
        self.num_preemptions = 0
        self.num_class_preemptions = 0      # of them, to admit a more urgent (or aged) waiting sequence
        # aging: per priority, since when that class waits for its next start (its last start, or the
        # arrival of its oldest waiting request if it had none waiting then)
        self._class_since: dict[int, float] = {}
        self.class_wait_max: dict[int, float] = {}   # per priority: the longest such wait that ended in a start
        self.num_aged = 0                   # requests aged (a class waited priority_aging_s)
        self.aging_misses = 0               # aged ones not started by the step that aged them (see wait_bound_s)
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
        now = self.clock()
        if self.batch_wait_until(now) is not None:
            return out                        # an idle engine waits for a fuller batch
        aged = self._age(now)
        budget = StepBudget(tokens=c.max_num_batched_tokens, attention_limit=c.max_num_batched_attention or None,
                            chunk_tokens=c.long_prefill_token_threshold, chunked=c.enable_chunked_prefill,
                            lower_class_tokens=c.lower_class_prefill_tokens)
        urgent = self._urgent_prefill_priority()
        if urgent is not None:
            budget.lower_class_spent = budget.lower_class_tokens    # nor their prefill chunks
        ran_dry = self._schedule_running(out, budget, prefills=False, below=urgent)    # every decode (but ...)
        if not ran_dry:      # waiting sequences ahead of every running prefill go before its chunk
            first = next((s for s in self.running if s.num_tokens - s.num_computed_tokens > 1), None)
            self._schedule_waiting(out, budget, ahead_of=first)
        ran_dry = self._schedule_running(out, budget, prefills=True) or ran_dry
        if not ran_dry:
            self._schedule_waiting(out, budget)
        if urgent is not None and not any(s.seq.priority <= urgent and s.num_new_tokens > 1 for s in out.scheduled):
            budget.lower_class_spent = 0      # the urgent prefill could not run: nothing is deferred
            ran_dry = self._schedule_running(out, budget, prefills=False) or ran_dry
            ran_dry = self._schedule_running(out, budget, prefills=True) or ran_dry
            if not ran_dry:
                self._schedule_waiting(out, budget)
        self.aging_misses += sum(1 for seq in aged if seq.status is SequenceStatus.WAITING)
        return out

    def _urgent_prefill_priority(self) -> int | None:
        """With `lower_class_prefill_tokens` on: the priority of a prefill (running, or the next
        waiting sequence) more urgent than some running decode — a step that computes it defers the
        decodes of less urgent sequences to the next step, so that the step carrying a first token
        is not stretched by their KV reads. None: no such prefill (every decode runs)."""
        if not self.config.lower_class_prefill_tokens or not self.running:
            return None
        urgent = self.waiting[0].priority if self.waiting else None
        least = None
        for seq in self.running:
            if seq.num_tokens - seq.num_computed_tokens > 1:
                if urgent is None or seq.priority < urgent:
                    urgent = seq.priority
            elif least is None or seq.priority > least:
                least = seq.priority
        return urgent if urgent is not None and least is not None and urgent < least else None

    def batch_wait_until(self, now: float) -> float | None:
        """When an idle engine (nothing running, nothing loading) with fewer than
        `preferred_batch_size` (default `max_num_seqs`) waiting requests starts a step anyway: the
        oldest one's arrival + `batch_timeout_s`; None when it need not wait (the default:
        `batch_timeout_s` 0)."""
        c = self.config
        if not c.batch_timeout_s or not self.waiting or self.running or self.kv.num_loading:
            return None
        if len(self.waiting) >= (c.preferred_batch_size or c.max_num_seqs):
            return None
        until = min(s.arrival_time for s in self.waiting) + c.batch_timeout_s
        return until if now < until else None

    def _age(self, now: float) -> list[Sequence]:
        """Aging: a class (a priority) whose waiting requests have not seen one of theirs start for
        `priority_aging_s` — since its last start, or since its oldest waiting request arrived —
        has that oldest request aged: ahead of every request that is not, and never preempted for
        one. So every class starts a request at least every `priority_aging_s` (plus the step under
        way), however busy the more urgent ones keep the engine; its own backlog stays in its order."""
        limit = self.config.priority_aging_s
        if not limit:
            return []
        oldest: dict[int, Sequence] = {}
        for seq in self.waiting:
            head = oldest.get(seq.priority)
            if head is None or seq.arrival_time < head.arrival_time:
                oldest[seq.priority] = seq
        for priority in [p for p in self._class_since if p not in oldest]:
            del self._class_since[priority]         # nothing of it waits: no clock
        aged = []
        for priority, head in oldest.items():
            since = self._class_since.setdefault(priority, head.arrival_time)
            if now - since >= limit and not head.aged and not any(s.aged for s in self.waiting
                                                                     if s.priority == priority):
                head.aged = True
                aged.append(head)
        if aged:
            self.num_aged += len(aged)
            heapq.heapify(self.waiting)
        return aged

    def _started(self, seq: Sequence, now: float) -> None:
        """`seq` left the queue for a run (or its KV load): its class's wait for a start ends."""
        if not self.config.priority_aging_s:
            return
        since = self._class_since.get(seq.priority)
        if since is not None:
            self.class_wait_max[seq.priority] = max(self.class_wait_max.get(seq.priority, 0.0), now - since)
        self._class_since[seq.priority] = now

    def wait_bound_s(self, longest_step_s: float) -> float | None:
        """With aging, the longest a class with waiting requests waits for one of them to start
        (`class_wait_max`), given the longest step: `priority_aging_s` until its oldest is aged, then
        at most the step under way — if no aged request missed the step after (`aging_misses`: every
        running request aged, its adapter not loaded, no room for its KV). None without aging, or
        after a miss."""
        if not self.config.priority_aging_s or self.aging_misses:
            return None
        return self.config.priority_aging_s + longest_step_s

    def _schedule_running(self, out: SchedulerOutput, budget: StepBudget, prefills: bool,
                          below: int | None = None) -> bool:
        """Every decode (`prefills` False; `below`: only those of a priority up to it), or every
        unfinished prefill's next chunk, each in order; when the pool runs dry, preempt from the
        back of the order (True then)."""
        scheduled = {id(s.seq) for s in out.scheduled}
        in_order = [(s, n) for s in self.running
                    if ((n := s.num_tokens - s.num_computed_tokens) > 1) == prefills and id(s) not in scheduled
                    and (below is None or s.priority <= below)]
        preempted = len(out.preempted)
        for seq, num_remaining in in_order:
            if budget.tokens <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted for one before it
                continue
            if self.run_gate is not None and not self.run_gate(seq):
                continue
            num_new = budget.num_new_tokens(num_remaining, seq.num_computed_tokens, seq.priority)
            if num_new == 0 or not self._allocate(seq, num_new, out, budget):
                continue
            self._add_scheduled(out, budget, seq, num_new, prefill=num_remaining > 1)
        return len(out.preempted) > preempted

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

    def _schedule_waiting(self, out: SchedulerOutput, budget: StepBudget, ahead_of: Sequence | None = None) -> None:
        """Admit waiting sequences in order while the step's budget, `max_num_seqs` and the pool
        allow. One that finds no room (no slot, no blocks) preempts the running sequence last in the
        order if it may displace it (`_may_displace`: a less urgent class, as vLLM's priority
        policy does, or not aged when it is). `ahead_of`: only those that sort before it."""
        if not self.waiting:
            return
        bm = self.block_manager
        partial = self._num_partial_prefills(out)
        held_back: list[Sequence] = []     # would start another partial prefill: back in the queue after
        try:
            while self.waiting and budget.tokens > 0:
                seq = self.waiting[0]
                if ahead_of is not None and not seq < ahead_of:
                    break
                if self.admission_gate is not None and not self.admission_gate(seq):
                    held_back.append(heapq.heappop(self.waiting))
                    continue
                # a continuation waiting for its KV will run: it counts against max_num_seqs already
                if len(self.running) + self.kv.num_loading >= self.config.max_num_seqs:
                    if self._preempt_for(seq, out, budget):
                        partial = self._num_partial_prefills(out)
                        continue
                    break
                if self.kv_tier is not None and self.kv_tier.admit(self, seq):
                    self._started(seq, self.clock())
                    continue                  # parked while its prefix loads from the host tier
                if seq.kv_source is not None:
                    if not self._admit_for_kv(seq):
                        break
                    continue
                too_many_partial = no_tokens = False

                def new_tokens(num_remaining: int) -> int | None:
                    nonlocal too_many_partial, no_tokens
                    num_new = budget.num_new_tokens(num_remaining, seq.num_tokens - num_remaining, seq.priority)
                    if 0 < num_new < num_remaining and partial >= self.config.max_num_partial_prefills \
                            and not self._displaces_partials(seq):
                        too_many_partial = True
                        return None
                    no_tokens = num_new == 0
                    return num_new or None

                # prompt logprobs need every prompt position's logits: cached blocks would skip them
                max_cached = 0 if seq.needs_prompt_logits else None
                admitted = bm.admit(seq, new_tokens, max_cached_tokens=max_cached)
                while admitted is None and not (too_many_partial or no_tokens) and self._preempt_for(seq, out, budget):
                    partial = self._num_partial_prefills(out)     # the pool was short: room made
                    admitted = bm.admit(seq, new_tokens, max_cached_tokens=max_cached)
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
                self._started(seq, self.clock())
                num_remaining = seq.num_tokens - seq.num_computed_tokens
                if admitted.num_new_tokens < num_remaining:
                    partial += 1
                self._add_scheduled(out, budget, seq, admitted.num_new_tokens, prefill=num_remaining > 1)
        finally:
            for seq in held_back:
                heapq.heappush(self.waiting, seq)

    @staticmethod
    def _may_displace(seq: Sequence, other: Sequence) -> bool:
        """Whether waiting `seq` may take the place of running `other`: `other` is not aged, and
        `seq` is aged or of a more urgent class (a lower priority number)."""
        return not other.aged and (seq.aged or seq.priority < other.priority)

    def _displaces_partials(self, seq: Sequence) -> bool:
        """Whether `seq` may displace every running prompt part-way through its prefill (then the
        max_num_partial_prefills limit, which is theirs, does not hold it back)."""
        return all(self._may_displace(seq, r) for r in self.running if r.num_tokens - r.num_computed_tokens > 1)

    def _preempt_for(self, seq: Sequence, out: SchedulerOutput, budget: StepBudget) -> bool:
        """Make room for waiting `seq` by preempting the running sequence last in the order, if
        `seq` may displace it; False when it may not (nothing changes)."""
        if not self.running or not self._may_displace(seq, self.running[-1]):
            return False
        self._preempt(self.running[-1], out, budget)
        self.num_class_preemptions += 1
        return True

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
        self._started(seq, self.clock())
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
