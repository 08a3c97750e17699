"""KV blocks on the wire: `KVBlocks` cut into `KVChunk` messages (a few blocks each, all layers)
and put back together on the other side. Pure functions, no I/O."""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from mindmotor.engine.kv_connector import KVBlocks
from mindmotor.protocol import worker_pb2 as pb

DEFAULT_BLOCKS_PER_CHUNK = 8


def chunks_from_blocks(kv: KVBlocks, blocks_per_chunk: int = DEFAULT_BLOCKS_PER_CHUNK) -> Iterator[pb.KVChunk]:
    """At least one chunk (an empty pull still says how many blocks it holds: none)."""
    n = kv.num_blocks
    step = max(1, blocks_per_chunk)
    for start in range(0, max(n, 1), step):
        k = np.ascontiguousarray(kv.k[:, start:start + step])   # [L, nb, block_size, n_kv, head_dim]
        v = np.ascontiguousarray(kv.v[:, start:start + step])
        yield pb.KVChunk(first_block=kv.first_block + start, shape=list(k.shape), dtype=k.dtype.name,
                         k=k.tobytes(), v=v.tobytes(), total_blocks=n)


def blocks_from_chunks(chunks: Iterable[pb.KVChunk], first_block: int) -> KVBlocks:
    """The blocks of a whole pull; ValueError when chunks are missing, out of order or malformed."""
    ks, vs = [], []
    expected_first, total = first_block, None
    for chunk in chunks:
        if chunk.first_block != expected_first:
            raise ValueError(f"KV chunk starts at block {chunk.first_block}, expected {expected_first}")
        shape = tuple(chunk.shape)
        if len(shape) != 5:
            raise ValueError(f"KV chunk shape {shape} is not [layers, blocks, block_size, kv_heads, head_dim]")
        dtype = np.dtype(chunk.dtype)
        k = np.frombuffer(chunk.k, dtype=dtype).reshape(shape)
        v = np.frombuffer(chunk.v, dtype=dtype).reshape(shape)
        ks.append(k)
        vs.append(v)
        expected_first += shape[1]
        total = chunk.total_blocks
    if total is None:
        raise ValueError("the KV pull returned no chunk")
    k = np.concatenate(ks, axis=1)
    v = np.concatenate(vs, axis=1)
    if k.shape[1] != total:
        raise ValueError(f"the KV pull carried {k.shape[1]} blocks of {total}")
    return KVBlocks(first_block, k, v)
