"""SLO classes in the engine's scheduler: a more urgent class preempts a less urgent one for room,
aging bounds how long a class waits for a start, the lower-class step budget, and an idle
engine's wait for a fuller batch (`batch_timeout_s`). Time is the scheduler's injected clock."""

from __future__ import annotations

import pytest

from mindmotor.engine.block_manager import BlockManager
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.llm_engine import LLMEngine
from mindmotor.engine.scheduler import Scheduler, SchedulerConfig
from mindmotor.engine.sequence import Sequence, SequenceStatus
from mindmotor.rules.sampling_params import SamplingParams

BS = 4
INTERACTIVE, STANDARD, BATCH = -10, 0, 10     # the coordinator's default class priorities


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(num_blocks=64, clock=None, **cfg) -> Scheduler:
    config = SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 16, "max_model_len": 64, **cfg})
    return Scheduler(config, BlockManager(num_blocks, BS, enable_prefix_caching=False), clock=clock or Clock())


def seq(rid, n, arrival, priority=0):
    return Sequence(request_id=rid, prompt_token_ids=list(range(1, n + 1)), params=SamplingParams(),
                    arrival_time=arrival, priority=priority)


def run_step(sched: Scheduler, token: int = 5):
    out = sched.schedule()
    for s in out.scheduled:
        samples = s.samples
        s.seq.num_computed_tokens += s.num_new_tokens
        if samples:
            s.seq.output_token_ids.append(token)
    return out


def plan(out):
    return [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled]


def test_a_more_urgent_request_preempts_the_last_lower_class_one_for_a_slot():
    sched = make(max_num_seqs=2)
    b1, b2 = seq("b1", 4, 0.0, BATCH), seq("b2", 4, 1.0, BATCH)
    sched.add(b1)
    sched.add(b2)
    run_step(sched)
    run_step(sched)                                     # both decode: max_num_seqs is full
    sched.add(seq("i", 4, 2.0, INTERACTIVE))
    out = run_step(sched)
    assert [s.request_id for s in out.preempted] == ["b2"]   # the latest of the lowest class
    assert ("i", 4) in plan(out) and ("b1", 1) in plan(out) and "b2" not in dict(plan(out))
    assert sched.num_class_preemptions == 1 and b2.status is SequenceStatus.WAITING and b2.num_computed_tokens == 0


def test_the_same_class_waits_for_room_instead_of_preempting():
    sched = make(max_num_seqs=2)
    for i in range(2):
        sched.add(seq(f"s{i}", 4, float(i), STANDARD))
    run_step(sched)
    sched.add(seq("late", 4, 5.0, STANDARD))
    out = run_step(sched)
    assert not out.preempted and "late" not in dict(plan(out)) and sched.num_class_preemptions == 0


def test_a_more_urgent_request_preempts_a_lower_class_one_for_kv_blocks():
    sched = make(num_blocks=6, max_num_batched_tokens=32)      # 24 tokens of KV
    batch = seq("b", 20, 0.0, BATCH)
    sched.add(batch)
    run_step(sched)                                     # 20 tokens: 5 of the 6 blocks
    urgent = seq("i", 8, 1.0, INTERACTIVE)              # needs 2 blocks: only 1 is free
    sched.add(urgent)
    out = run_step(sched)
    assert [s.request_id for s in out.preempted] == ["b"] and ("i", 8) in plan(out)
    assert urgent.status is SequenceStatus.RUNNING and batch.status is SequenceStatus.WAITING
    sched.block_manager.check_invariants(sched.block_holders())


def test_a_less_urgent_request_never_preempts_a_more_urgent_one():
    sched = make(max_num_seqs=1)
    sched.add(seq("i", 4, 0.0, INTERACTIVE))
    run_step(sched)
    sched.add(seq("b", 4, 1.0, BATCH))
    for _ in range(5):
        out = run_step(sched)
        assert not out.preempted and plan(out) == [("i", 1)]


def _interactive_stream(sched: Scheduler, clock: Clock, steps: int, step_s: float, batch: Sequence) -> float | None:
    """Steps of `step_s` with an interactive request arriving each step and each running request
    finishing after two tokens; returns when `batch` had its first step (None: never)."""
    started = None
    for k in range(steps):
        sched.add(seq(f"i{k}", 4, clock.now, INTERACTIVE))
        out = run_step(sched)
        if started is None and any(s.seq is batch for s in out.scheduled):
            started = clock.now
        for s in out.scheduled:
            if s.seq.num_output_tokens >= 2 and s.seq.status is SequenceStatus.RUNNING:
                sched.finish(s.seq, SequenceStatus.FINISHED_STOPPED)
        clock.now += step_s
    return started


def test_without_aging_a_busy_urgent_class_starves_the_batch_class():
    clock = Clock()
    sched = make(max_num_seqs=1, clock=clock)
    batch = seq("b", 4, 0.0, BATCH)
    sched.add(batch)
    sched.add(seq("first", 4, 0.0, INTERACTIVE))
    assert _interactive_stream(sched, clock, steps=100, step_s=0.1, batch=batch) is None
    assert sched.wait_bound_s(0.1) is None


def test_aging_bounds_a_class_wait_for_a_start_by_the_aging_time_plus_a_step():
    clock = Clock()
    step_s, aging_s = 0.1, 1.0
    sched = make(max_num_seqs=1, clock=clock, priority_aging_s=aging_s)
    batch = seq("b", 4, 0.0, BATCH)
    sched.add(batch)
    sched.add(seq("first", 4, 0.0, INTERACTIVE))
    started = _interactive_stream(sched, clock, steps=60, step_s=step_s, batch=batch)
    assert started is not None and aging_s <= started <= aging_s + step_s + 1e-9
    assert batch.aged and sched.num_aged >= 1 and sched.aging_misses == 0
    # the wait the scheduler measured is within the bound it states
    bound = sched.wait_bound_s(step_s)
    assert bound == pytest.approx(aging_s + step_s)
    assert sched.class_wait_max[BATCH] <= bound + 1e-9
    # once aged, no interactive request preempts it: it ran to its end
    assert batch.status is SequenceStatus.FINISHED_STOPPED and batch.num_preemptions == 0


def test_aging_ages_one_request_of_a_class_at_a_time_and_keeps_its_order():
    clock = Clock()
    sched = make(max_num_seqs=1, clock=clock, priority_aging_s=1.0)
    b1, b2 = seq("b1", 4, 0.0, BATCH), seq("b2", 4, 0.5, BATCH)
    sched.add(b2)
    sched.add(b1)
    sched.add(seq("i", 4, 0.0, INTERACTIVE))
    run_step(sched)
    clock.now = 2.0
    run_step(sched)
    assert b1.aged and not b2.aged                     # the oldest of its class only
    assert b1.status is SequenceStatus.RUNNING and b2.status is SequenceStatus.WAITING


def test_lower_class_prefill_is_capped_and_its_decodes_wait_while_an_urgent_prompt_starts():
    sched = make(max_num_batched_tokens=64, lower_class_prefill_tokens=8)
    long_batch, short_batch = seq("bl", 40, 0.0, BATCH), seq("bs", 4, 0.0, BATCH)
    sched.add(short_batch)
    sched.add(long_batch)
    out = run_step(sched)
    assert dict(plan(out))["bl"] == 8 - 4              # background work: 8 prefill tokens a step in all
    out = run_step(sched)
    assert plan(out) == [("bs", 1), ("bl", 8)]
    sched.add(seq("i", 12, 1.0, INTERACTIVE))
    out = run_step(sched)
    assert plan(out) == [("i", 12)]                    # nothing of the batch class beside its first step
    out = run_step(sched)
    assert plan(out) == [("i", 1), ("bs", 1), ("bl", 8)]


def test_the_lower_class_cap_leaves_the_default_class_alone():
    sched = make(max_num_batched_tokens=64, lower_class_prefill_tokens=8)
    sched.add(seq("s", 40, 0.0, STANDARD))
    assert plan(run_step(sched)) == [("s", 40)]


def test_an_idle_engine_waits_for_a_fuller_batch_then_runs_at_the_timeout():
    clock = Clock()
    sched = make(clock=clock, batch_timeout_s=0.5, preferred_batch_size=3)
    sched.add(seq("a", 4, 0.0))
    assert run_step(sched).empty and sched.batch_wait_until(clock.now) == 0.5
    clock.now = 0.2
    sched.add(seq("b", 4, 0.2))
    assert run_step(sched).empty
    clock.now = 0.5
    assert plan(run_step(sched)) == [("a", 4), ("b", 4)]
    sched.add(seq("c", 4, 0.5))                       # the engine is busy: no waiting for a batch
    assert ("c", 4) in plan(run_step(sched))


def test_a_full_preferred_batch_starts_at_once():
    clock = Clock()
    sched = make(clock=clock, batch_timeout_s=5.0, preferred_batch_size=2)
    sched.add(seq("a", 4, 0.0))
    assert run_step(sched).empty
    sched.add(seq("b", 4, 0.0))
    assert plan(run_step(sched)) == [("a", 4), ("b", 4)]


def test_the_engine_reports_its_wait_for_a_fuller_batch_as_idle_time():
    clock = Clock()
    engine = LLMEngine(EngineConfig(emulate="llama2-7b", runner="cost_only", num_blocks=64, block_size=16,
                                    batch_timeout_s=0.25, preferred_batch_size=4), clock=clock)
    engine.add_request("a", [5] * 8, SamplingParams(max_tokens=2, ignore_eos=True))
    assert engine.step() == [] and not engine.has_runnable_requests()
    assert engine.idle_wait_s(10.0) == pytest.approx(0.25)
    clock.now = 0.25
    assert [o.request_id for o in engine.step()] == ["a"]


@pytest.mark.parametrize("field", ["priority_aging_s", "batch_timeout_s", "lower_class_prefill_tokens",
                                   "preferred_batch_size"])
def test_negative_class_settings_are_refused(field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: -1})
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**{field: -1})
