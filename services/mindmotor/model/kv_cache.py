"""`PagedKVCache`: the key/value pool of one worker, paged in fixed-size blocks.

It can store block ids [0, `num_blocks`): the blocks the host memory budget holds (at most the
emulated device's capacity; the block manager never hands out a higher id). In host memory it holds
only as many blocks as have been handed out so far (it grows by doubling, capped at `num_blocks`),
so a small model with the capacity of a 7B model on a 64 GiB card costs host memory for the tokens
it really holds, and never more than the budget. The block manager hands out low block ids first,
which keeps the pool compact.
"""

from __future__ import annotations

import numpy as np


class PagedKVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype=np.float32, initial_blocks: int = 64):
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = np.dtype(dtype)
        self.capacity = 0
        self.k: list[np.ndarray] = []  # per layer: [capacity, block_size, n_kv_heads, head_dim]
        self.v: list[np.ndarray] = []
        self._grow(min(initial_blocks, num_blocks))

    @staticmethod
    def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype=np.float32) -> int:
        """Host bytes of one block, K and V of every layer."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * np.dtype(dtype).itemsize

    @property
    def bytes_per_block(self) -> int:
        return self.block_bytes(self.num_layers, self.block_size, self.num_kv_heads, self.head_dim, self.dtype)

    @property
    def host_bytes(self) -> int:
        """Host memory of the arrays allocated now."""
        return self.capacity * self.bytes_per_block

    def ensure_blocks(self, max_block_id: int) -> None:
        """Make sure block `max_block_id` has host storage."""
        if max_block_id >= self.num_blocks:
            raise IndexError(f"block {max_block_id} is outside the pool of {self.num_blocks} blocks")
        if max_block_id >= self.capacity:
            self._grow(min(self.num_blocks, max(max_block_id + 1, 2 * self.capacity)))

    def _grow(self, new_capacity: int) -> None:
        shape = (new_capacity, self.block_size, self.num_kv_heads, self.head_dim)
        for cache in (self.k, self.v):
            for layer in range(self.num_layers):
                grown = np.zeros(shape, dtype=self.dtype)
                if layer < len(cache):
                    grown[:self.capacity] = cache[layer]
                    cache[layer] = grown
                else:
                    cache.append(grown)
        self.capacity = new_capacity

    def read_blocks(self, block_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """K and V of these blocks, all layers: [num_layers, len(block_ids), block_size, n_kv, head_dim]."""
        k = np.stack([self.k[layer][block_ids] for layer in range(self.num_layers)])
        v = np.stack([self.v[layer][block_ids] for layer in range(self.num_layers)])
        return k, v

    def write_blocks(self, block_ids: list[int], k: np.ndarray, v: np.ndarray) -> None:
        self.ensure_blocks(max(block_ids))
        for layer in range(self.num_layers):
            self.k[layer][block_ids] = k[layer]
            self.v[layer][block_ids] = v[layer]
