"""`DecodeKV`: the decoding sequences' keys and values, contiguous per sequence, kept across steps.

Decode attention multiplies each sequence's query by all of its keys. With the paged cache alone
that needs, per layer and per step, a gather of every block of every decoding sequence into a
contiguous array (numpy cannot multiply through an index without copying). This workspace holds
that array from one step to the next: rows in the decode order of the step; per layer K as
`[rows, n_kv, head_dim, T]` (the layout QKᵀ reads fastest: 2.8 → 1.7 ms per layer at 256 decodes of
176 keys) and V as `[rows, T, n_kv, head_dim]`. A step whose decoding sequences are the previous step's, in the same order,
each one token further, reads it as it is and only writes the step's new token (beside the paged
cache, which stays the source of truth). Any other step — a sequence joined, finished, was
preempted, the context outgrew the rows — rebuilds it from the paged cache: one gather of every
layer, what a single step cost before.

The attention reads the same key range as the paged path (the decodes' longest context rounded up
to whole blocks, positions past a sequence's context masked), and its results are bit-identical to
it (tests/engine/test_decode_kv.py).
"""

from __future__ import annotations

import operator

import numpy as np

from .kv_cache import PagedKVCache

HEADROOM_TOKENS = 32          # rows are built this many tokens longer than needed: a rebuild every 32 steps
MAX_BYTES = 512 * 2**20       # beyond this the step uses the paged path (a gather per layer)


class DecodeKV:
    def __init__(self, cache: PagedKVCache, max_bytes: int = MAX_BYTES):
        self.cache = cache
        self.max_bytes = max_bytes
        self.k: list[np.ndarray] = []         # per layer: [rows, n_kv, head_dim, capacity] (transposed)
        self.v: list[np.ndarray] = []         # per layer: [rows, capacity, n_kv, head_dim]
        self._seqs: list = []                 # the sequence of each row, as of the last step
        self._preemptions: list[int] = []     # and its preemption count (a recomputed one is rebuilt)
        self._context: np.ndarray = np.zeros(0, dtype=np.int64)
        self._capacity = 0                    # tokens per row
        self.rebuilds = 0                     # steps that rebuilt the rows (the rest reused them)
        self.reuses = 0

    def reset(self) -> None:
        self.k, self.v, self._seqs, self._preemptions, self._capacity = [], [], [], [], 0
        self._context = np.zeros(0, dtype=np.int64)

    def prepare(self, seqs: list, context_lens: np.ndarray, block_tables: np.ndarray) -> bool:
        """Make the rows hold the keys and values of `seqs` (the step's decodes, in order) before
        this step's token: reused when they are the last step's, one token further; else rebuilt.
        `context_lens`: after this step; `block_tables`: their blocks up to the longest context.
        False: too large for the budget (the step uses the paged path)."""
        c = self.cache
        needed = block_tables.shape[1] * c.block_size
        preemptions = [s.num_preemptions for s in seqs]
        if (len(seqs) == len(self._seqs) and needed <= self._capacity
                and all(map(operator.is_, seqs, self._seqs)) and preemptions == self._preemptions
                and np.array_equal(context_lens, self._context + 1)):
            self._context = context_lens
            self.reuses += 1
            return True
        extra = -(-HEADROOM_TOKENS // c.block_size)
        capacity = needed + extra * c.block_size
        per_layer = len(seqs) * capacity * c.num_kv_heads * c.head_dim * c.dtype.itemsize
        self.reset()
        if 2 * c.num_layers * per_layer > self.max_bytes:
            return False
        # the headroom rows gather block 0: finite values, masked until this step's writes replace them
        tables = np.concatenate([block_tables, np.zeros((len(seqs), extra), dtype=block_tables.dtype)], axis=1)
        shape = (len(seqs), capacity, c.num_kv_heads, c.head_dim)
        for layer in range(c.num_layers):
            self.k.append(np.ascontiguousarray(np.take(c.k[layer], tables, axis=0).reshape(shape)
                                               .transpose(0, 2, 3, 1)))
            self.v.append(np.take(c.v[layer], tables, axis=0).reshape(shape))
        self._seqs, self._preemptions = list(seqs), preemptions
        self._context, self._capacity = context_lens, capacity
        self.rebuilds += 1
        return True

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """This step's key and value of each decode (`k`, `v`: [rows, n_kv, head_dim]) at its
        position (context − 1)."""
        rows = np.arange(len(self._seqs))
        pos = self._context - 1
        self.k[layer][rows, :, :, pos] = k
        self.v[layer][rows, pos] = v

    def read(self, layer: int, num_keys: int) -> tuple[np.ndarray, np.ndarray]:
        """Kᵀ [rows, n_kv, hd, num_keys] and V [rows, num_keys, n_kv, hd] of every row over the first
        `num_keys` positions (views)."""
        return self.k[layer][..., :num_keys], self.v[layer][:, :num_keys]
