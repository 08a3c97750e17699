"""The host memory budget of the KV arrays: a card whose emulated KV pool is far larger than the
budget keeps its host arrays under the budget (cached blocks are evicted past it), its outputs stay
those of an engine without any cache, prefix hits still work while the cache fits, and a budget that
cannot hold one max-length sequence fails the start."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor import LLM, SamplingParams
from mindmotor.engine.block_manager import BlockManager
from mindmotor.engine.host_memory import machine_memory_bytes, parse_size
from mindmotor.rules.sampling_params import SamplingParams as Params
from mindmotor.engine.sequence import Sequence
from mindmotor.model.kv_cache import PagedKVCache

BS = 4
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def tiny_block_bytes(llm: LLM) -> int:
    c = llm.engine.model.config
    return PagedKVCache.block_bytes(c.num_hidden_layers, BS, c.num_key_value_heads, c.head_dim)


def distinct_prompts(vocab: int, count: int, length: int, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(1, vocab, length)) for _ in range(count)]


@pytest.fixture(scope="module")
def reference(tiny_ckpt):
    """The same model with no prefix cache and a roomy budget: what every output must equal."""
    return LLM(model=str(tiny_ckpt), block_size=BS, max_model_len=64, enable_prefix_caching=False)


def test_many_distinct_prompts_stay_under_a_tiny_budget_with_reference_outputs(tiny_ckpt, reference):
    per_block = tiny_block_bytes(reference)
    budget = 40 * per_block                                 # 160 tokens of KV; one 64-token sequence is 16 blocks
    llm = LLM(model=str(tiny_ckpt), block_size=BS, max_model_len=64, emulate="qwen2-7b",
              kv_host_budget_bytes=budget)
    engine = llm.engine
    assert engine.block_manager.num_blocks > 40_000         # the emulated card's pool: far beyond the budget
    assert engine.block_manager.host_blocks == 40
    prompts = distinct_prompts(engine.model.config.vocab_size, 60, 30)
    for i in range(0, len(prompts), 4):                      # batches of 4 distinct prompts, 8 blocks each
        batch = prompts[i:i + 4]
        outs = llm.generate(batch, GREEDY)
        expected = reference.generate(batch, GREEDY)
        assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
        assert engine.kv_cache.host_bytes <= budget
        engine.check_invariants()
    stats = engine.stats()
    assert stats.kv_evictions > 0                           # the cache was trimmed to the budget ...
    assert stats.kv_host_bytes <= stats.kv_host_budget_bytes == budget
    assert stats.num_blocks > 40_000 and stats.kv_host_limited == 0   # ... live blocks always fitted
    assert stats.num_preemptions == 0


def test_prefix_hits_still_work_under_the_budget(tiny_ckpt, reference):
    budget = 40 * tiny_block_bytes(reference)
    llm = LLM(model=str(tiny_ckpt), block_size=BS, max_model_len=64, emulate="qwen2-7b",
              kv_host_budget_bytes=budget)
    vocab = llm.engine.model.config.vocab_size
    system = distinct_prompts(vocab, 1, 24, seed=11)[0]     # 6 shared blocks
    for i, tail in enumerate(distinct_prompts(vocab, 12, 6, seed=12)):
        out = llm.generate([system + tail], GREEDY)[0]
        assert out.token_ids == reference.generate([system + tail], GREEDY)[0].token_ids
        if i > 0:
            assert out.num_cached_tokens == 24, i            # the shared prefix stays cached
    # many other prompts push the shared prefix out of the small budget: no hit afterwards
    llm.generate(distinct_prompts(vocab, 12, 30, seed=13), GREEDY)
    again = llm.generate([system + [5, 6, 7]], GREEDY)[0]
    assert again.num_cached_tokens == 0
    assert llm.engine.kv_cache.host_bytes <= budget


def test_a_budget_below_one_max_length_sequence_fails_the_start(tiny_ckpt, reference):
    per_block = tiny_block_bytes(reference)
    with pytest.raises(ValueError, match=r"host KV budget .* holds 15 blocks .* max_model_len 64 tokens needs 16"):
        LLM(model=str(tiny_ckpt), block_size=BS, max_model_len=64, kv_host_budget_bytes=15 * per_block + 7)
    LLM(model=str(tiny_ckpt), block_size=BS, max_model_len=64, kv_host_budget_bytes=16 * per_block)


def test_the_default_budget_is_a_tenth_of_the_machine(reference):
    assert reference.engine.kv_host_budget_bytes == int(machine_memory_bytes() * 0.10)
    assert 0 < machine_memory_bytes() <= 2**50


# ---- the block manager alone --------------------------------------------------------------------

def seq(rid: str, tokens) -> Sequence:
    return Sequence(request_id=rid, prompt_token_ids=list(tokens), params=Params(), arrival_time=0.0)


def admit(bm: BlockManager, s: Sequence) -> bool:
    if bm.admit(s, lambda n: n) is None:
        return False
    s.num_computed_tokens = s.num_tokens
    bm.cache_blocks(s)
    return True


def test_ids_stay_below_the_host_blocks_and_the_oldest_cached_block_is_evicted():
    bm = BlockManager(1000, BS, host_blocks=4)
    a, b = seq("a", range(8)), seq("b", range(100, 108))      # 2 full blocks each
    assert admit(bm, a) and admit(bm, b)
    bm.free(a)
    bm.free(b)
    assert bm.num_cached_blocks == 4 and bm.num_free_blocks == 1000
    c = seq("c", range(200, 208))
    assert admit(bm, c)
    assert max(c.block_table) < 4 and bm.evictions == 2 and bm.watermark == 4
    assert bm.get_computed_blocks(seq("a2", range(9))) == []  # a's blocks were the oldest: evicted
    assert len(bm.get_computed_blocks(seq("b2", range(100, 109)))) == 2
    bm.check_invariants([c])


def test_live_blocks_beyond_the_host_budget_are_refused_and_counted():
    bm = BlockManager(1000, BS, host_blocks=4)
    a = seq("a", range(12))                                   # 3 blocks
    assert admit(bm, a)
    b = seq("b", range(100, 108))                             # 2 more: the card has room, the host not
    assert not bm.allocate_slots(b, 8)
    assert b.block_table == [] and bm.host_limited == 1
    assert bm.num_free_blocks == 997                          # the emulated figure is unchanged
    bm.free(a)
    assert admit(bm, b)
    bm.check_invariants([b])


@pytest.mark.parametrize("text, expected", [
    ("1048576", 1 << 20), ("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5g", 1_500_000_000), ("64 KiB", 64 << 10),
    ("100M", 100_000_000),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


def test_percentages_and_bad_sizes():
    assert parse_size("25%") == int(machine_memory_bytes() * 0.25)
    for bad in ("", "lots", "2 parsecs", "0%", "150%", "-1G"):
        with pytest.raises(ValueError):
            parse_size(bad)
