"""Attention over the paged KV cache, with explicit `AttentionMetadata` (never a global).

A step's tokens are laid out flat: first one token for each decoding sequence, then the new tokens
of each prefill chunk. Decodes are computed together (one gather of their blocks); each prefill chunk
attends to its cached prefix plus itself, causally.

What does not depend on the layer is computed once per step and reused by every layer
(`AttentionMetadata.decode_plan`): the decodes' block-table slice and their key mask per window.
The decodes' keys and values are read from `DecodeKV` (decode_kv.py: contiguous per sequence, kept
across steps, only the new token written) when the runner provides it; otherwise gathered per
layer with `np.take` along the block axis (a third of the cost of fancy indexing at 256 decodes).
numpy has no way to multiply through an index without that copy (docs/benchmarks.md, host overhead).

A sliding window `w` (Mistral, Qwen2/3 sliding layers) limits each query at position i to the keys
at positions j with i − w < j ≤ i, as transformers' sliding-window mask does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .kv_cache import PagedKVCache


@dataclass
class AttentionMetadata:
    slot_mapping: np.ndarray     # [num_tokens] int64: block_id·block_size + offset where each new K/V goes
    query_start_loc: np.ndarray  # [num_seqs + 1] int64: where each sequence's tokens start in the step
    context_lens: np.ndarray     # [num_seqs] int64: tokens in the cache after this step, new ones included
    block_tables: np.ndarray     # [num_seqs, max_blocks] int64, padded with 0
    num_decodes: int             # the first num_decodes sequences have exactly one new token
    _plans: dict = field(default_factory=dict, repr=False, compare=False)   # per-step, shared by layers
    decode_kv: object | None = None   # decode_kv.DecodeKV holding the decodes' K/V this step; None: gather them

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    def decode_plan(self, block_size: int, window: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The decodes' block tables cut to their longest context, and the additive key mask
        (0 or -inf, [num_decodes, 1, 1, keys]) for `window` — computed by the first layer that
        asks, reused by the others."""
        plan = self._plans.get(window)
        if plan is None:
            nd = self.num_decodes
            context_lens = self.context_lens[:nd]
            max_blocks = -(-int(context_lens.max()) // block_size)
            tables = np.ascontiguousarray(self.block_tables[:nd, :max_blocks])
            key_pos = np.arange(max_blocks * block_size)[None, :]
            beyond = key_pos >= context_lens[:, None]                      # [B, T]
            if window is not None:                                         # the query sits at context_len - 1
                beyond |= key_pos <= (context_lens[:, None] - 1 - window)
            bias = np.where(beyond, np.float32(-np.inf), np.float32(0.0))[:, None, None, :]
            plan = self._plans[window] = (tables, bias)
        return plan


def write_kv(cache: PagedKVCache, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """k, v: [num_tokens, n_kv_heads, head_dim] into their slots."""
    flat_shape = (-1, cache.num_kv_heads, cache.head_dim)
    cache.k[layer].reshape(flat_shape)[slots] = k
    cache.v[layer].reshape(flat_shape)[slots] = v


def paged_attention(q: np.ndarray, cache: PagedKVCache, layer: int, meta: AttentionMetadata,
                    window: int | None = None) -> np.ndarray:
    """q: [num_tokens, n_heads, head_dim] → [num_tokens, n_heads, head_dim]; K/V already written.
    `window`: the sliding window of this layer (None: full causal attention)."""
    out = np.empty_like(q)
    nd = meta.num_decodes
    if nd:
        tables, bias = meta.decode_plan(cache.block_size, window)
        if meta.decode_kv is not None:                                 # no copy: the rows kept across steps
            kt, v = meta.decode_kv.read(layer, tables.shape[1] * cache.block_size)
        else:
            k, v = _gather(cache, layer, tables)                       # [B, T, n_kv, hd]
            kt = k.transpose(0, 2, 3, 1)                               # [B, n_kv, hd, T]
        out[:nd] = _decode_attention(q[:nd], kt, v, bias)
    for s in range(nd, meta.num_seqs):
        start, end = meta.query_start_loc[s], meta.query_start_loc[s + 1]
        out[start:end] = _prefill_attention(q[start:end], cache, layer, meta.block_tables[s],
                                            int(meta.context_lens[s]), window)
    return out


def _gather(cache: PagedKVCache, layer: int, block_table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., num_blocks] block ids → K, V of [..., num_blocks·block_size, n_kv, head_dim]."""
    k = np.take(cache.k[layer], block_table, axis=0)
    v = np.take(cache.v[layer], block_table, axis=0)
    shape = block_table.shape[:-1] + (-1, cache.num_kv_heads, cache.head_dim)
    return k.reshape(shape), v.reshape(shape)


def _decode_attention(q, kt, v, bias):
    """q: [B, n_heads, hd]; kt: [B, n_kv, hd, T] (the keys, transposed); v: [B, T, n_kv, hd];
    `bias`: the step's `AttentionMetadata.decode_plan` mask for this layer's window."""
    num_seqs, n_heads, head_dim = q.shape
    n_kv = kt.shape[1]
    qg = q.reshape(num_seqs, n_kv, n_heads // n_kv, head_dim)     # [B, n_kv, group, hd]
    scores = qg @ kt                                               # [B, n_kv, group, T]
    scores *= 1.0 / np.sqrt(head_dim)
    scores += bias
    probs = _softmax(scores)
    out = probs @ v.transpose(0, 2, 1, 3)                          # [B, n_kv, group, hd]
    return out.reshape(num_seqs, n_heads, head_dim)


def _prefill_attention(q, cache, layer, block_table, context_len, window=None):
    num_new, n_heads, head_dim = q.shape
    n_kv = cache.num_kv_heads
    # With a window only keys from the first query's window on are read (whole blocks from there).
    first_key = 0 if window is None else max(0, context_len - num_new - window + 1)
    first_block = first_key // cache.block_size
    num_blocks = -(-context_len // cache.block_size)
    k, v = _gather(cache, layer, block_table[first_block:num_blocks])
    skip = first_block * cache.block_size
    k, v = k[:context_len - skip], v[:context_len - skip]          # [T, n_kv, hd]
    return causal_attention(q, k, v, n_kv, window)          # the mask only needs relative positions


QUERY_TILE = 256  # query rows per tile: keeps the score matrix in cache, and skips masked keys


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_kv: int,
                     window: int | None = None) -> np.ndarray:
    """q: [Q, n_heads, hd] are the last Q of the T positions in k, v: [T, n_kv, hd].
    `window`: keys more than window − 1 positions behind a query are masked.

    Per KV head one contiguous matmul, the query heads of its group folded into the rows; queries
    in tiles, each attending only to the keys up to its last position (and, with a window, from
    its first query's window on)."""
    num_q, n_heads, head_dim = q.shape
    total = k.shape[0]
    group = n_heads // n_kv
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))                     # [n_kv, hd, T]
    vt = np.ascontiguousarray(v.transpose(1, 0, 2))                     # [n_kv, T, hd]
    out = np.empty_like(q)
    first = total - num_q                                               # position of q[0]
    for start in range(0, num_q, QUERY_TILE):
        end = min(num_q, start + QUERY_TILE)
        n, kv_end = end - start, first + end
        kv_start = 0 if window is None else max(0, first + start - window + 1)
        width = kv_end - kv_start
        qg = np.ascontiguousarray(q[start:end].reshape(n, n_kv, group, head_dim).transpose(1, 0, 2, 3))
        scores = (qg.reshape(n_kv, n * group, head_dim) @ kt[:, :, kv_start:kv_end])  # [n_kv, n·g, width]
        scores = scores.reshape(n_kv, n, group, width)
        scores *= 1.0 / np.sqrt(head_dim)
        query_pos = np.arange(first + start, first + end)[:, None]
        key_pos = np.arange(kv_start, kv_end)[None, :]
        masked = key_pos > query_pos                                    # [n, width]
        if window is not None:
            masked |= key_pos <= query_pos - window
        scores += np.where(masked, -np.inf, 0.0).astype(scores.dtype)[None, :, None, :]
        probs = _softmax(scores).reshape(n_kv, n * group, width)
        tile = probs @ vt[:, kv_start:kv_end]                           # [n_kv, n·group, hd]
        out[start:end] = tile.reshape(n_kv, n, group, head_dim).transpose(1, 0, 2, 3).reshape(n, n_heads, head_dim)
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in place (`x` is a scratch array of scores)."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x
