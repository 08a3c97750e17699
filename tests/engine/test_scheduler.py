"""Scheduler: token budget, chunked prefill, sequence budget, priorities, preemption, aborts."""

from __future__ import annotations

from mindmotor.engine.block_manager import BlockManager
from mindmotor.rules.sampling_params import SamplingParams
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


# ---- fair prefill: a long prompt cannot hold decodes back for more than one step's budget --------
def decoding(sched: Scheduler, n: int, prompt_len: int = 3) -> list[Sequence]:
    """`n` sequences past their prefill, each decoding one token a step from now on."""
    seqs = [seq(f"d{i}", prompt_len, 10.0 + i) for i in range(n)]
    for s in seqs:
        sched.add(s)
    run_step(sched)
    assert all(s.num_output_tokens == 1 for s in seqs)
    return seqs


def prefill_pairs(out) -> int:
    """Query-key pairs of the step's prefill chunks (what max_num_batched_attention bounds)."""
    from mindmotor.engine.step_budget import attention_pairs
    return sum(attention_pairs(s.num_new_tokens, s.seq.num_computed_tokens) for s in out.scheduled
               if s.seq.num_tokens - s.seq.num_computed_tokens > 1)


def test_a_long_prompt_is_chunked_within_the_budget_while_every_decode_runs_each_step():
    budget, attention = 32, 600
    sched = make(num_blocks=256, max_num_batched_tokens=budget, max_model_len=512,
                 long_prefill_token_threshold=24, max_num_batched_attention=attention)
    decodes = decoding(sched, 4)
    long = seq("long", 300, 20.0)
    sched.add(long)
    chunks = []
    while long.num_output_tokens == 0:
        out = sched.schedule()
        planned = dict(plan(out))
        assert all(planned.get(d.request_id) == 1 for d in decodes), "a decode waited for the long prefill"
        assert out.num_batched_tokens == sum(planned.values()) <= budget
        assert prefill_pairs(out) <= attention
        chunks.append(planned.get("long", 0))
        for s in out.scheduled:                                   # what the engine does after the model
            samples = s.samples
            s.seq.num_computed_tokens += s.num_new_tokens
            if samples:
                s.seq.output_token_ids.append(5)
    assert sum(chunks) == 300 and max(chunks) <= 24
    assert len(chunks) > 300 // 24 + 1                            # deeper chunks are smaller: attention
    assert chunks[0] == 24 and chunks[-1] < chunks[0]
    sched.block_manager.check_invariants(sched.running)


def test_decodes_go_before_a_prefill_that_comes_first_in_order():
    """A long prompt of a higher priority, part-way through its prefill, comes first in (priority,
    arrival) order; it must not take the whole token budget from the decodes behind it."""
    sched = make(num_blocks=256, max_num_batched_tokens=16, max_model_len=512)
    decoding(sched, 3)
    long = seq("long", 200, 20.0, priority=-1)
    sched.add(long)
    assert plan(run_step(sched)) == [("d0", 1), ("d1", 1), ("d2", 1), ("long", 13)]
    for _ in range(5):
        assert plan(run_step(sched)) == [("d0", 1), ("d1", 1), ("d2", 1), ("long", 13)]


def test_a_lone_chunk_always_progresses_even_past_the_attention_budget():
    sched = make(num_blocks=256, max_num_batched_tokens=64, max_model_len=512, max_num_batched_attention=10)
    long = seq("long", 40, 0.0)
    sched.add(long)
    assert plan(run_step(sched)) == [("long", 4)]                # 4 tokens from the start: 10 pairs
    assert plan(run_step(sched)) == [("long", 1)]                # after 4: 2 tokens would be 11
    steps = 2
    while long.num_output_tokens == 0:
        out = run_step(sched)
        assert plan(out)[0][1] >= 1
        steps += 1
    assert long.num_computed_tokens == 40 and steps > 10


def test_one_partial_prefill_at_a_time_and_short_prompts_go_first():
    sched = make(num_blocks=256, max_num_batched_tokens=16, max_model_len=512, long_prefill_token_threshold=8)
    a, b, short = seq("a", 40, 0.0), seq("b", 40, 1.0), seq("short", 5, 2.0)
    for s in (a, b, short):
        sched.add(s)
    # a starts (8 tokens: the threshold); b would be a second partial prefill: it waits, and the
    # short prompt behind it, which fits whole, goes first
    assert plan(run_step(sched)) == [("a", 8), ("short", 5)]
    assert [s.request_id for s in sched.waiting] == ["b"]
    for _ in range(3):
        assert plan(run_step(sched)) == [("short", 1), ("a", 8)]
    assert plan(run_step(sched)) == [("short", 1), ("a", 8), ("b", 7)]   # a's last chunk: b may start
    assert plan(run_step(sched)) == [("a", 1), ("short", 1), ("b", 8)]
    two = make(num_blocks=256, max_num_batched_tokens=16, max_model_len=512, long_prefill_token_threshold=8,
               max_num_partial_prefills=2)
    for s in (seq("a", 40, 0.0), seq("b", 40, 1.0)):
        two.add(s)
    assert plan(run_step(two)) == [("a", 8), ("b", 8)]


def test_preempting_a_decode_already_scheduled_takes_it_out_of_the_step():
    """Decodes are scheduled first, but a prefill earlier in (priority, arrival) order still wins
    blocks from a later decode: the decode is preempted and gives its token back."""
    sched = make(num_blocks=3, max_num_batched_tokens=64, max_model_len=64, long_prefill_token_threshold=4)
    long, late = seq("long", 16, 0.0), seq("late", 2, 1.0)
    sched.add(long)
    assert plan(run_step(sched)) == [("long", 4)]                  # 1 block
    sched.add(late)
    assert plan(run_step(sched)) == [("long", 4), ("late", 2)]     # 2 + 1 blocks: the pool is full
    out = run_step(sched)           # late's decode fits its block; long's next chunk needs a 4th
    assert [s.request_id for s in out.preempted] == ["late"]
    assert plan(out) == [("long", 4)] and out.num_batched_tokens == 4
    assert late.status == SequenceStatus.WAITING and late.num_computed_tokens == 0
    sched.block_manager.check_invariants(sched.running)


def test_max_tokens_within_is_the_largest_chunk_that_fits():
    from mindmotor.engine.step_budget import attention_pairs, max_tokens_within
    for computed in (0, 1, 7, 100, 4095, 8192):
        for pairs in (0, 1, 2, 3, 50, 1000, 131072, 10**7):
            c = max_tokens_within(pairs, computed)
            assert attention_pairs(c, computed) <= pairs < attention_pairs(c + 1, computed)


def test_the_default_attention_budget_prices_the_served_models_host_cost(tiny_ckpt):
    from mindmotor.engine.config import EngineConfig
    from mindmotor.engine.llm_engine import LLMEngine
    from mindmotor.engine.step_budget import HOST_ATTENTION_SCORES_PER_STEP

    auto = LLMEngine(EngineConfig(model=str(tiny_ckpt), max_num_batched_attention=None))
    c = auto.model.config
    assert auto.scheduler.config.max_num_batched_attention == \
        HOST_ATTENTION_SCORES_PER_STEP // (c.num_attention_heads * c.num_hidden_layers)
    assert LLMEngine(EngineConfig(model=str(tiny_ckpt))).scheduler.config.max_num_batched_attention == 0
