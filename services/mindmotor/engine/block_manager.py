"""`BlockManager`: who owns which KV block.

A pool of `num_blocks` fixed-size blocks with a free list, reference counts, and prefix caching:
a full block is registered under the chained hash of the tokens up to its end, and blocks that no
running sequence references stay cached (evictable, in LRU order) until a new allocation needs them.

The manager never decides policy: `admit` (a waiting sequence: its cached prefix and new blocks, in
one call) returns None and `allocate_slots` (a running sequence's next tokens) returns False when
the pool is short, leaving everything unchanged; the scheduler decides whom to preempt.

Host storage: at most `host_blocks` (≤ `num_blocks`) block ids are ever handed out, because only
that many have host arrays within the host memory budget. Past it a new block reuses the least
recently used cached block (an eviction) instead of a new id, so the prefix cache shrinks to what
the host holds while the emulated card's `num_blocks` still decides admission and preemption.
Should the blocks in use alone need more than `host_blocks`, an allocation is refused as if the
pool were short (`host_limited` counts those: the worker then behaves like a smaller card).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from mindmotor.common.block_hash import block_hashes

from .sequence import Sequence

# A block-table entry whose block was released because it fell out of the sliding window of every
# layer (`release_out_of_window`): the entry keeps the table's position → block mapping.
NO_BLOCK = -1


@dataclass(frozen=True)
class Admission:
    """What `BlockManager.admit` gave a waiting sequence."""
    num_cached_tokens: int      # its leading tokens whose KV the prefix cache already held (whole blocks)
    num_new_tokens: int         # tokens after them that its new blocks have room for


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 host_blocks: int | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks}×{block_size}")
        if host_blocks is not None and host_blocks < 1:
            raise ValueError(f"need host storage for at least one block, got {host_blocks}")
        self.num_blocks = num_blocks
        self.host_blocks = min(num_blocks, host_blocks or num_blocks)   # ids [0, host_blocks) only
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Blocks [0, watermark) have been handed out at least once; those above it are free and
        # untouched, so bookkeeping (like the host KV storage) grows with use, not with capacity.
        self.watermark = 0
        self.ref_counts: list[int] = []                   # [watermark]
        self.block_hash: list[bytes | None] = []          # [watermark]
        self.hash_to_block: dict[bytes, int] = {}
        self._free_ids: list[int] = []                    # min-heap of released ids below the watermark
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self._num_hashed: dict[str, int] = {}             # request id → its blocks already registered
        self.prefix_queries = 0                           # prompt tokens looked up
        self.prefix_hits = 0                              # of those, found cached
        self.evictions = 0                                # cached blocks reused for new ones
        self.host_limited = 0                             # allocations refused for the host budget alone
        self.on_evict: Callable[[int, bytes], None] | None = None   # (block, its hash) before reuse

    # ---- what the scheduler sees ------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by sequences."""
        return self.watermark - len(self._free_ids) - len(self._evictable)

    @property
    def num_free_blocks(self) -> int:
        """Free on the emulated card (cached-but-unreferenced blocks count as free)."""
        return self.num_blocks - self.num_used_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Cached blocks no sequence references (evictable)."""
        return len(self._evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by sequences (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def admit(self, seq: Sequence, new_tokens: Callable[[int], int | None],
              max_cached_tokens: int | None = None) -> Admission | None:
        """Admit a waiting sequence (no blocks yet) in one call: look its prefix up in the cache
        (at most `max_cached_tokens` of it; 0: no lookup), ask `new_tokens(n)` how many of the `n`
        tokens left after the cached ones to make room for (None: none now), take the cached blocks
        and new ones, and count the lookup. None, changing nothing, when `new_tokens` says none or
        the pool is short."""
        cached = self.get_computed_blocks(seq, max_cached_tokens)
        num_cached = len(cached) * self.block_size
        num_new = new_tokens(seq.num_tokens - num_cached)
        if num_new is None or not self.allocate_slots(seq, num_new, cached):
            return None
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += num_cached
        return Admission(num_cached, num_new)

    def get_computed_blocks(self, seq: Sequence, max_tokens: int | None = None) -> list[int]:
        """The longest cached prefix of `seq` in whole blocks, leaving at least one token to compute
        (its logits are needed), of at most `max_tokens` tokens. Touches nothing."""
        if not self.enable_prefix_caching or max_tokens == 0:
            return []
        tokens = seq.all_token_ids
        seq.block_hashes = block_hashes(tokens, self.block_size, seq.block_hashes, seq.hash_root)
        max_blocks = (len(tokens) - 1) // self.block_size
        if max_tokens is not None:
            max_blocks = min(max_blocks, max_tokens // self.block_size)
        hits = []
        for h in seq.block_hashes[:max_blocks]:
            block = self.hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = ()) -> bool:
        """Give `seq` blocks for `num_new_tokens` more tokens (after any cached `computed_blocks`).
        Returns False, changing nothing, when the pool cannot supply them."""
        num_tokens = seq.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_needed(num_tokens) - len(seq.block_table) - len(computed_blocks)
        if num_new_blocks <= 0 and not computed_blocks:
            return True                     # the common decode step: its last block has room
        num_revived = sum(1 for b in computed_blocks if self.ref_counts[b] == 0)
        wanted = max(num_new_blocks, 0) + num_revived
        if wanted > self.num_free_blocks:
            return False
        if wanted > self.host_blocks - self.num_used_blocks:
            self.host_limited += 1
            return False
        for block in computed_blocks:
            if self.ref_counts[block] == 0:
                del self._evictable[block]
            self.ref_counts[block] += 1
            seq.block_table.append(block)
        for _ in range(num_new_blocks):
            block = self._pop_free()
            self.ref_counts[block] = 1
            seq.block_table.append(block)
        return True

    def cache_blocks(self, seq: Sequence) -> None:
        """Register the blocks of `seq` that have become full and computed."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        done = self._num_hashed.get(seq.request_id, 0)
        if num_full <= done:
            return
        if len(seq.block_hashes) < num_full:
            seq.block_hashes = block_hashes(seq.all_token_ids[:num_full * self.block_size],
                                            self.block_size, seq.block_hashes, seq.hash_root)
        for i in range(done, num_full):
            block, h = seq.block_table[i], seq.block_hashes[i]
            if self.block_hash[block] is None and h not in self.hash_to_block:
                self.block_hash[block] = h
                self.hash_to_block[h] = block
        self._num_hashed[seq.request_id] = num_full

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references. Its tail blocks are released first, so they are evicted first."""
        for block in reversed(seq.block_table):
            if block != NO_BLOCK:
                self._release(block)
        seq.block_table = []
        self._num_hashed.pop(seq.request_id, None)

    def release_out_of_window(self, seq: Sequence, window: int) -> int:
        """With a sliding window `window` on every layer, the next query of `seq` (at position
        num_computed_tokens) and all later ones read only keys after num_computed_tokens − window:
        release the blocks wholly before that (their entries become NO_BLOCK; a hashed block stays
        in the prefix cache, its K/V depending only on the tokens up to it). Call after
        `cache_blocks`. Returns how many blocks were released."""
        first_key = seq.num_computed_tokens - window + 1
        table = seq.block_table
        end = min(max(0, first_key) // self.block_size, len(table))
        released = 0
        for i in range(end - 1, -1, -1):                  # released from the front, so stop at one
            if table[i] == NO_BLOCK:
                break
            self._release(table[i])
            table[i] = NO_BLOCK
            released += 1
        return released

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if self.block_hash[block] is not None:
                self._evictable[block] = None
            else:
                heapq.heappush(self._free_ids, block)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no sequence uses."""
        while self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._uncache(block)
            heapq.heappush(self._free_ids, block)

    # ---- internals --------------------------------------------------------------------------
    def _pop_free(self) -> int:
        if self._free_ids:                                # low ids first keeps the pool compact
            return heapq.heappop(self._free_ids)
        if self.watermark < self.host_blocks:
            self.ref_counts.append(0)
            self.block_hash.append(None)
            self.watermark += 1
            return self.watermark - 1
        block, _ = self._evictable.popitem(last=False)    # least recently used cached block
        if self.on_evict is not None:                     # e.g. the KV host tier keeps its KV
            self.on_evict(block, self.block_hash[block])
        self._uncache(block)
        self.evictions += 1
        return block

    def _uncache(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not None and self.hash_to_block.get(h) == block:
            del self.hash_to_block[h]
        self.block_hash[block] = None

    def check_invariants(self, sequences: list[Sequence] | None = None) -> None:
        """free + used = total; no negative counts; the cache index agrees with the blocks.
        With `sequences` (every live one), reference counts equal their block-table entries."""
        free = set(self._free_ids)
        evictable = set(self._evictable)
        assert len(free) == len(self._free_ids), "a block is twice in the free list"
        assert not free & evictable, "a block is both free and cached-evictable"
        used = {b for b, r in enumerate(self.ref_counts) if r > 0}
        assert all(r >= 0 for r in self.ref_counts), "negative reference count"
        assert len(self.ref_counts) == len(self.block_hash) == self.watermark <= self.host_blocks <= self.num_blocks
        assert all(b < self.watermark for b in free | evictable), "a free block is above the watermark"
        assert len(used) + len(free) + len(evictable) == self.watermark, (
            f"free {len(free)} + evictable {len(evictable)} + used {len(used)} != {self.watermark} "
            f"blocks handed out")
        assert self.num_free_blocks + len(used) == self.num_blocks
        assert all(self.block_hash[b] is None for b in free), "a free-list block still has a hash"
        assert all(self.block_hash[b] is not None for b in evictable), "an evictable block has no hash"
        for h, b in self.hash_to_block.items():
            assert self.block_hash[b] == h, f"cache index points block {b} at the wrong hash"
        if sequences is not None:
            expected = [0] * self.watermark
            for seq in sequences:
                for b in seq.block_table:
                    if b != NO_BLOCK:
                        expected[b] += 1
            assert expected == self.ref_counts, "reference counts disagree with the block tables"
