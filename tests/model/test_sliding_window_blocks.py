"""Blocks that fell out of a sliding window on every layer are released (and what must stay)."""

from __future__ import annotations

import numpy as np

from mindmotor import LLM, SamplingParams
from mindmotor.engine.block_manager import NO_BLOCK, BlockManager
from mindmotor.engine.sequence import Sequence
from mindmotor.model.testing import write_tiny_checkpoint

BS = 4


def cached_unreferenced(bm: BlockManager) -> int:
    return sum(1 for b in bm.hash_to_block.values() if bm.ref_counts[b] == 0)


def computed(bm: BlockManager, s: Sequence, n: int) -> None:
    assert bm.allocate_slots(s, n)
    s.num_computed_tokens += n
    bm.cache_blocks(s)


def test_release_exactly_the_blocks_before_the_next_querys_window():
    bm = BlockManager(16, BS)
    s = Sequence(request_id="a", prompt_token_ids=list(range(30)), params=SamplingParams(), arrival_time=0.0)
    computed(bm, s, 13)          # next query at 13 reads keys 13 - 6 + 1 = 8 .. : blocks 0, 1 go
    assert bm.release_out_of_window(s, window=6) == 2
    assert s.block_table[:2] == [NO_BLOCK, NO_BLOCK] and NO_BLOCK not in s.block_table[2:]
    assert bm.release_out_of_window(s, window=6) == 0            # idempotent
    computed(bm, s, 3)           # 16: keys from 11 on, block 2 (8..11) still needed
    assert bm.release_out_of_window(s, window=6) == 0
    computed(bm, s, 1)           # 17: keys from 12 on
    assert bm.release_out_of_window(s, window=6) == 1
    bm.check_invariants([s])
    # released full blocks stay in the prefix cache (their K/V depend only on the tokens up to them)
    assert cached_unreferenced(bm) == 3
    other = Sequence(request_id="b", prompt_token_ids=list(range(30)), params=SamplingParams(),
                     arrival_time=0.0)
    assert bm.get_computed_blocks(other)[:3] == [0, 1, 2]
    bm.free(s)
    bm.check_invariants([])
    assert bm.num_free_blocks == 16


def test_a_window_model_serves_more_tokens_than_its_sequences_hold(tmp_path):
    d = write_tiny_checkpoint(tmp_path / "m", architecture="MistralForCausalLM", sliding_window=8)
    llm = LLM(str(d), block_size=BS, num_blocks=48, max_num_batched_tokens=32)
    prompt = list(map(int, np.random.default_rng(0).integers(3, 300, 60)))
    out = llm.generate([prompt], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 40
    engine = llm.engine
    assert engine.sliding_window == 8
    assert cached_unreferenced(engine.block_manager) >= (60 + 40 - 8) // BS - 2   # released, still cached
    engine.check_invariants()


def test_a_pinned_prefill_keeps_its_whole_prompt_kv(tmp_path):
    """The P/D prefill side sends every prompt block: a prefill-only request releases nothing."""
    d = write_tiny_checkpoint(tmp_path / "m", architecture="MistralForCausalLM", sliding_window=5)
    engine = LLM(str(d), block_size=BS, num_blocks=64, max_num_batched_tokens=8).engine
    prompt = list(range(3, 40))
    engine.add_request("p", prompt, SamplingParams(max_tokens=4, temperature=0), prefill_only=True)
    while engine.has_unfinished_requests():
        engine.step()
    kv = engine.read_pinned_kv("p")
    pinned = engine.scheduler.kv.pinned("p")
    assert NO_BLOCK not in pinned.block_table and kv.k.shape[1] == -(-len(prompt) // BS)
