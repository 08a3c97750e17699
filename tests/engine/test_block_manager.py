"""BlockManager on tiny pools: exact block ids, sharing, eviction order, and no side effects on failure."""

from __future__ import annotations

import pytest

from mindmotor.common.block_hash import block_hashes
from mindmotor.engine.block_manager import BlockManager
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.engine.sequence import Sequence

BS = 4


def seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id=rid, prompt_token_ids=list(tokens), params=SamplingParams(), arrival_time=0.0)


def admit(bm: BlockManager, s: Sequence) -> int:
    """Admit (prefix lookup + allocation) and 'compute' the whole prompt, as the scheduler does."""
    admission = bm.admit(s, lambda n: n)
    assert admission is not None and admission.num_new_tokens == s.num_tokens - admission.num_cached_tokens
    s.num_computed_tokens = s.num_tokens
    bm.cache_blocks(s)
    return admission.num_cached_tokens // BS


def test_low_ids_first_and_free_returns_them():
    bm = BlockManager(10, BS)
    a = seq("a", range(10))                     # 3 blocks
    assert bm.allocate_slots(a, 10)
    assert a.block_table == [0, 1, 2]
    b = seq("b", range(100, 105))
    assert bm.allocate_slots(b, 5)
    assert b.block_table == [3, 4]
    assert bm.watermark == 5 and bm.num_free_blocks == 5
    bm.free(a)                                  # no hashes registered: back to the free list
    c = seq("c", range(200, 204))
    assert bm.allocate_slots(c, 4)
    assert c.block_table == [0]
    bm.check_invariants([b, c])


def test_allocation_failure_changes_nothing():
    bm = BlockManager(4, BS)
    a = seq("a", range(12))
    assert bm.allocate_slots(a, 12)
    b = seq("b", range(50, 60))
    before = (list(bm.ref_counts), bm.num_free_blocks, list(b.block_table))
    assert not bm.allocate_slots(b, 10)         # needs 3, only 1 free
    assert (list(bm.ref_counts), bm.num_free_blocks, list(b.block_table)) == before
    bm.check_invariants([a, b])


def test_growing_sequence_takes_a_new_block_only_at_a_boundary():
    bm = BlockManager(8, BS)
    a = seq("a", range(4))
    assert bm.allocate_slots(a, 4) and a.block_table == [0]
    a.num_computed_tokens = 4
    a.output_token_ids.append(9)
    assert bm.allocate_slots(a, 1) and a.block_table == [0, 1]
    a.num_computed_tokens = 5
    a.output_token_ids.append(9)
    assert bm.allocate_slots(a, 1) and a.block_table == [0, 1]


def test_prefix_hit_shares_blocks_and_leaves_one_token_to_compute():
    bm = BlockManager(10, BS)
    a = seq("a", range(12))                     # exactly 3 full blocks
    assert admit(bm, a) == 0
    b = seq("b", list(range(12)) + [77, 78])    # shares 3 blocks
    assert admit(bm, b) == 3
    assert b.block_table[:3] == a.block_table
    assert [bm.ref_counts[x] for x in a.block_table] == [2, 2, 2]
    c = seq("c", range(12))                     # identical prompt: last block must be recomputed
    assert admit(bm, c) == 2
    assert bm.prefix_hit_rate == pytest.approx((12 + 8) / (12 + 14 + 12))
    bm.check_invariants([a, b, c])


def test_freed_cached_blocks_are_evicted_lru_tail_first():
    bm = BlockManager(6, BS)
    a = seq("a", range(8))                      # blocks 0, 1
    admit(bm, a)
    b = seq("b", range(100, 108))               # blocks 2, 3
    admit(bm, b)
    bm.free(a)                                  # evictable order: 1, 0
    bm.free(b)                                  # then 3, 2
    assert bm.num_free_blocks == 6
    c = seq("c", range(200, 216))               # 4 blocks: 4, 5 fresh, then evict 1, 0
    assert bm.allocate_slots(c, 16)
    assert c.block_table == [4, 5, 1, 0]
    assert bm.get_computed_blocks(seq("a2", range(9))) == []          # a's prefix is gone
    assert bm.get_computed_blocks(seq("b2", range(100, 109))) == [2, 3]  # b's survived
    bm.check_invariants([c])


def test_reviving_a_cached_block_counts_against_free_blocks():
    bm = BlockManager(3, BS)
    a = seq("a", range(8))
    admit(bm, a)
    bm.free(a)                                  # 2 cached-evictable + 1 fresh = 3 free
    b = seq("b", list(range(8)) + list(range(50, 58)))   # hits 2 blocks, needs 2 more: 4 > 3
    assert bm.get_computed_blocks(b) == [0, 1]
    assert bm.admit(b, lambda n: n) is None
    assert b.block_table == [] and bm.prefix_queries == 8    # nothing changed, nothing counted
    bm.check_invariants([])
    assert bm.num_free_blocks == 3


def test_duplicate_content_is_not_registered_twice():
    bm = BlockManager(8, BS)
    a, b = seq("a", range(5)), seq("b", range(5))
    for s in (a, b):                            # both computed without seeing each other's cache
        assert bm.allocate_slots(s, 5)
    for s in (a, b):
        s.num_computed_tokens = 5
        bm.cache_blocks(s)
    assert bm.hash_to_block[block_hashes(list(range(4)), BS)[0]] == a.block_table[0]
    bm.free(a)
    bm.free(b)
    bm.check_invariants([])


def test_prefix_caching_off_never_hits():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    admit(bm, seq("a", range(8)))
    assert admit(bm, seq("b", range(9))) == 0


def test_reset_prefix_cache_frees_unreferenced_blocks():
    bm = BlockManager(8, BS)
    a = seq("a", range(8))
    admit(bm, a)
    bm.free(a)
    bm.reset_prefix_cache()
    assert not bm.hash_to_block
    bm.check_invariants([])


def test_bookkeeping_grows_with_use_not_capacity():
    bm = BlockManager(50_000_000, 16)
    a = seq("a", range(40))
    assert bm.allocate_slots(a, 40)
    assert bm.watermark == 3 and len(bm.ref_counts) == 3
    assert bm.num_free_blocks == 50_000_000 - 3


def test_chained_hash_depends_on_everything_before():
    h1 = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    h2 = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert h1[1] != h2[1]                       # same second block, different first block
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, h1[:1]) == h1
