"""Scheduler: token budget, chunked prefill, sequence budget, priorities, preemption, aborts."""

from __future__ import annotations

from mindmotor.engine.block_manager import BlockManager
from mindmotor.engine.sampling_params import SamplingParams
from mindmotor.engine.scheduler import Scheduler, SchedulerConfig
from mindmotor.engine.sequence import Sequence, SequenceStatus

BS = 4


def make(num_blocks=64, **cfg) -> Scheduler:
    config = SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 16, "max_model_len": 64, **cfg})
    return Scheduler(config, BlockManager(num_blocks, BS, enable_prefix_caching=False))


def seq(rid, n, arrival, priority=0):
    return Sequence(request_id=rid, prompt_token_ids=list(range(1, n + 1)), params=SamplingParams(),
                    arrival_time=arrival, priority=priority)


def run_step(sched: Scheduler, token: int = 5):
    """What the engine does after the model: advance computed tokens, append a token when sampled."""
    out = sched.schedule()
    for s in out.scheduled:
        samples = s.samples
        s.seq.num_computed_tokens += s.num_new_tokens
        if samples:
            s.seq.output_token_ids.append(token)
    return out


def plan(out):
    return [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled]


def test_chunked_prefill_fills_the_token_budget_after_decodes():
    sched = make()
    a, b = seq("a", 10, 0.0), seq("b", 20, 1.0)
    sched.add(a)
    sched.add(b)
    assert plan(run_step(sched)) == [("a", 10), ("b", 6)]     # b is chunked to fit 16
    assert plan(run_step(sched)) == [("a", 1), ("b", 14)]     # a decodes, b continues
    out = run_step(sched)
    assert plan(out) == [("a", 1), ("b", 1)]
    assert a.num_output_tokens == 3 and b.num_output_tokens == 2


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    sched = make(max_num_batched_tokens=64, enable_chunked_prefill=False)
    sched.add(seq("a", 60, 0.0))
    sched.add(seq("b", 10, 1.0))
    assert plan(run_step(sched)) == [("a", 60)]               # b (10) does not fit in what is left (4)
    assert plan(run_step(sched)) == [("a", 1), ("b", 10)]


def test_max_num_seqs_caps_the_batch():
    sched = make(max_num_seqs=2)
    for i in range(3):
        sched.add(seq(f"s{i}", 2, float(i)))
    assert plan(run_step(sched)) == [("s0", 2), ("s1", 2)]
    assert [s.request_id for s in sched.waiting] == ["s2"]


def test_priority_then_arrival_order():
    sched = make(max_num_seqs=1)
    sched.add(seq("late-high", 2, 5.0, priority=-1))
    sched.add(seq("early-normal", 2, 1.0))
    sched.add(seq("early-high", 2, 3.0, priority=-1))
    order = []
    for _ in range(3):
        s = sched.waiting[0]
        run_step(sched)
        order.append(s.request_id)
        sched.finish(s, SequenceStatus.FINISHED_STOPPED)
    assert order == ["early-high", "late-high", "early-normal"]


def test_preempts_lowest_priority_latest_arrival_and_recomputes():
    sched = make(num_blocks=6, max_num_batched_tokens=64)      # 24 token slots
    a, b, c = seq("a", 8, 0.0), seq("b", 8, 1.0, priority=1), seq("c", 7, 2.0)
    for s in (a, b, c):
        sched.add(s)
    run_step(sched)                                          # 2 + 2 + 2 blocks: pool full
    assert [s.request_id for s in sched.running] == ["a", "c", "b"]
    out = run_step(sched)                                    # a needs a 3rd block → b (priority 1) goes
    assert [s.request_id for s in out.preempted] == ["b"]
    assert plan(out) == [("a", 1), ("c", 1)]
    assert b.status == SequenceStatus.WAITING and b.num_computed_tokens == 0 and not b.block_table
    assert b.num_output_tokens == 1                          # its token is kept; recomputed later
    sched.block_manager.check_invariants(sched.running)


def test_a_sequence_preempts_itself_when_it_is_last():
    sched = make(num_blocks=4, max_num_batched_tokens=64)
    a, b = seq("a", 8, 0.0), seq("b", 8, 1.0)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    out = run_step(sched)                                    # a grows; victim is b (later arrival)
    assert [s.request_id for s in out.preempted] == ["b"]
    assert plan(out) == [("a", 1)]
    sched.block_manager.check_invariants(sched.running)


def test_no_admissions_in_a_step_that_preempted():
    sched = make(num_blocks=4, max_num_batched_tokens=64)
    a, b = seq("a", 8, 0.0), seq("b", 8, 1.0)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    out = run_step(sched)
    assert out.preempted and all(s.seq is not b for s in out.scheduled)


def test_abort_frees_running_and_waiting():
    sched = make(max_num_seqs=1)
    a, b = seq("a", 9, 0.0), seq("b", 3, 1.0)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    sched.abort(a)
    sched.abort(b)
    assert a.status == b.status == SequenceStatus.FINISHED_ABORTED
    assert sched.num_unfinished == 0
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    bm.check_invariants([])
