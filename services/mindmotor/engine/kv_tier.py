"""The KV host tier: prefix-cache blocks evicted from the card's HBM kept in host memory, and loaded
back instead of recomputed (the idea of LMCache, vLLM's OffloadingConnector, SGLang's HiCache).

Storing. When the block manager evicts a cached block (its LRU reuses the id for new KV), the
block's KV is copied out first (`on_evict`, before anything can overwrite it) into the open host
chunk, keyed by the block's hash — the prefix cache's key (`common/block_hash.py`). Chunks hold up
to `chunk_bytes` of KV (`--cache-chunk-size`, counted in the emulated card's bytes, what crosses
the host link); the whole tier holds at most `host_bytes` (`--kv-host-bytes`) of host memory, and
evicts whole chunks, least recently used first (a lookup hit or a load touches a chunk). The
device-to-host copy is priced on the host link (`CostModel.host_copy_seconds`, one DMA per chunk
flushed per step) but never on a step's critical path: the card's copy engine runs it beside the
step (recorded as `store_s`).

Loading. A waiting request whose prefix (after what the HBM prefix cache has) is in the tier is
admitted with blocks for the prefix and parked in `WAITING_FOR_KV` — the state P/D transfer uses —
while its chunks cross the host link (`admit`); the scheduler keeps running everyone else. Loads
share the host-to-device direction first come first served; `prefetch_depth` chunk copies are in
flight at once, so a load of c chunks pays ceil(c / depth) DMA latencies plus its bytes at the
link's rate. When the emulated clock reaches a load's end (`poll`, at the start of each engine
step) its blocks are written into the reserved ones and the request runs from there. Blocks that
left the tier meanwhile (evicted mid-load), or a copy that fails, end the load early: the request
computes what is missing, exactly as after a prefix-cache miss, so the output never differs.
With `sync_load` (a baseline for benchmarks) the copy is on the critical path instead: the next
step does not start before it is done, for everyone.

What is held is measured, never estimated: with the model runner the tier's bytes are its numpy
arrays' (`used_bytes` is their sum, ≤ `host_bytes` at every moment); the cost-only runner has no
KV data, so the tier counts the emulated card's bytes per block against the budget — the capacity
a real worker's tier would have, which is what the simulator plans with.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from .sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from .scheduler import Scheduler

log = logging.getLogger("mindmotor.engine")

DEFAULT_CHUNK_BYTES = 256 * 2**20        # the design's cache_chunk_size
DEFAULT_PREFETCH_DEPTH = 2               # the design's prefetch_depth
# seconds; the buckets of the load time histogram (mindmotor_kv_tier_load_seconds)
LOAD_TIME_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_QUERIED_MEMORY = 4096                   # sequences whose lookup was counted (a waiting head retries)
_EXPORT_MEMORY = 8192                    # blocks stored and not yet taken by the shared tier (oldest dropped)


@dataclass(frozen=True)
class TierConfig:
    host_bytes: int                           # the tier's host memory budget; 0: no tier
    chunk_bytes: int = DEFAULT_CHUNK_BYTES    # KV per chunk (emulated bytes)
    prefetch_depth: int = DEFAULT_PREFETCH_DEPTH  # chunk copies in flight at once
    sync_load: bool = False                   # baseline: loads stall the next step

    def __post_init__(self):
        if self.host_bytes < 0:
            raise ValueError(f"kv_host_bytes must be at least 0 (0: no host tier), got {self.host_bytes}")
        if self.chunk_bytes < 1:
            raise ValueError(f"cache_chunk_size must be positive, got {self.chunk_bytes}")
        if self.prefetch_depth < 1:
            raise ValueError(f"prefetch_depth must be at least 1, got {self.prefetch_depth}")


@dataclass
class TierStats:
    queries: int = 0                 # tokens looked up in the tier (after the HBM prefix cache's hits)
    hits: int = 0                    # of them, loaded from it
    blocks_stored: int = 0
    bytes_stored: int = 0            # emulated bytes copied card -> host
    bytes_loaded: int = 0            # emulated bytes copied host -> card
    store_s: float = 0.0             # emulated copy time of the stores (off the critical path)
    stall_s: float = 0.0             # sync_load: emulated time steps waited for loads
    blocks_inserted: int = 0         # stored from elsewhere (the shared tier)
    loads: int = 0                   # loads finished (whole, partial or failed)
    loads_partial: int = 0           # blocks evicted from the tier mid-load: the rest is computed
    loads_failed: int = 0            # the copy raised: the whole prefix after HBM's is computed
    chunks_evicted: int = 0
    load_s_sum: float = 0.0
    load_s_buckets: list[int] = field(default_factory=lambda: [0] * len(LOAD_TIME_BUCKETS))

    def observe_load(self, seconds: float) -> None:
        self.load_s_sum += seconds
        i = bisect.bisect_left(LOAD_TIME_BUCKETS, seconds)
        if i < len(self.load_s_buckets):
            self.load_s_buckets[i] += 1


class _Chunk:
    __slots__ = ("hashes", "k", "v", "nbytes", "link_bytes")

    def __init__(self):
        self.hashes: list[bytes] = []
        self.k: list[np.ndarray | None] = []      # per block: [num_layers, 1, block_size, n_kv, head_dim]
        self.v: list[np.ndarray | None] = []
        self.nbytes = 0                           # host bytes held
        self.link_bytes = 0                       # emulated bytes of its blocks


@dataclass
class _Load:
    seq: Sequence
    first_block: int                 # index in the block table of the first block loaded
    hashes: list[bytes]
    seconds: float                   # its emulated copy time
    ready_at: float                  # on the engine's clock


class HostKVTier:
    def __init__(self, config: TierConfig, kv_cache, block_size: int, link_block_bytes: int,
                 copy_seconds: Callable[[float, int], float], clock: Callable[[], float] = time.monotonic):
        """`kv_cache`: the engine's (PagedKVCache, or the cost-only NoKVCache: no data);
        `link_block_bytes`: one block's KV on the emulated card; `copy_seconds(bytes, dmas)`: the
        host link's price (`CostModel.host_copy_seconds`)."""
        self.config = config
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.link_block_bytes = link_block_bytes
        self.copy_seconds = copy_seconds
        self.clock = clock
        self.holds_data = kv_cache.num_layers > 0
        self.host_block_bytes = kv_cache.bytes_per_block if self.holds_data else link_block_bytes
        self.blocks_per_chunk = max(1, config.chunk_bytes // max(1, link_block_bytes))
        self.stats = TierStats()
        self.used_bytes = 0                                   # host bytes of every chunk's arrays
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()  # least recently used first
        self._where: dict[bytes, tuple[int, int]] = {}        # block hash -> (chunk id, index)
        self._open: int | None = None                          # the chunk new blocks go into
        self._next_id = 0
        self._unflushed_bytes = 0                             # stored since the last flush
        self._loads: deque[_Load] = deque()                   # by ready_at (the link is FIFO)
        self._link_free_at = 0.0                              # host -> device direction
        self._stall_s = 0.0                                   # sync_load: owed by the next step
        self._queried: OrderedDict[tuple, None] = OrderedDict()
        self._exports: deque[bytes] = deque(maxlen=_EXPORT_MEMORY)   # stored here, not yet taken

    # ---- what it holds ------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self._where)

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    @property
    def num_loading(self) -> int:
        return len(self._loads)

    @property
    def usage(self) -> float:
        return self.used_bytes / self.config.host_bytes if self.config.host_bytes else 0.0

    def held_array_bytes(self) -> int:
        """The host bytes of every array the tier holds, counted from the arrays themselves."""
        return sum(a.nbytes for c in self._chunks.values() for arrays in (c.k, c.v) for a in arrays
                   if a is not None)

    def lookup(self, hashes: list[bytes]) -> int:
        """How many of `hashes`, from the first, the tier holds."""
        n = 0
        for h in hashes:
            if h not in self._where:
                break
            n += 1
        return n

    # ---- storing ------------------------------------------------------------------------------
    def on_evict(self, block: int, block_hash: bytes) -> None:
        """The block manager is about to reuse cached block `block`: keep its KV (called before
        anything can overwrite it)."""
        where = self._where.get(block_hash)
        if where is not None:                       # already here (it was loaded from here)
            self._chunks.move_to_end(where[0])
            return
        if self.host_block_bytes > self.config.host_bytes:
            return
        k, v = self.kv_cache.read_blocks([block]) if self.holds_data else (None, None)
        self._put(block_hash, k, v)
        if self.holds_data:
            self._exports.append(block_hash)        # for the shared tier, if any (worker/kv_shared.py)

    def _put(self, block_hash: bytes, k: np.ndarray | None, v: np.ndarray | None) -> None:
        while self.used_bytes + self.host_block_bytes > self.config.host_bytes:
            self._evict_oldest()
        chunk_id = self._open_chunk()
        chunk = self._chunks[chunk_id]
        self._where[block_hash] = (chunk_id, len(chunk.hashes))
        chunk.hashes.append(block_hash)
        chunk.k.append(k)
        chunk.v.append(v)
        nbytes = k.nbytes + v.nbytes if k is not None else self.host_block_bytes
        chunk.nbytes += nbytes
        chunk.link_bytes += self.link_block_bytes
        self.used_bytes += nbytes
        self._unflushed_bytes += self.link_block_bytes
        self.stats.blocks_stored += 1
        if len(chunk.hashes) >= self.blocks_per_chunk:
            self._flush()
            self._open = None

    def _open_chunk(self) -> int:
        if self._open is None or self._open not in self._chunks:
            self._open = self._next_id
            self._next_id += 1
            self._chunks[self._open] = _Chunk()
        return self._open

    def _evict_oldest(self) -> None:
        chunk_id, chunk = self._chunks.popitem(last=False)
        for h in chunk.hashes:
            if self._where.get(h, (None,))[0] == chunk_id:
                del self._where[h]
        self.used_bytes -= chunk.nbytes
        self.stats.chunks_evicted += 1
        if chunk_id == self._open:
            self._open = None

    def _flush(self) -> None:
        """The blocks stored since the last flush cross the host link as one DMA (off the step's
        critical path)."""
        if self._unflushed_bytes:
            self.stats.store_s += self.copy_seconds(self._unflushed_bytes, 1)
            self.stats.bytes_stored += self._unflushed_bytes
            self._unflushed_bytes = 0

    # ---- loading ------------------------------------------------------------------------------
    def admit(self, sched: "Scheduler", seq: Sequence) -> bool:
        """`seq` is the head of the waiting queue: if the tier has its prefix (past what HBM's
        prefix cache holds), admit it with blocks for that prefix and park it in WAITING_FOR_KV
        while the prefix loads. False (nothing changed) if the tier cannot help or the pool has no
        room: the scheduler then admits it as usual."""
        if seq.kv_source is not None or seq.needs_prompt_logits:
            return False
        bm = sched.block_manager
        bs = self.block_size
        num_hbm = len(bm.get_computed_blocks(seq))     # also brings seq.block_hashes up to date
        max_blocks = (seq.num_tokens - 1) // bs         # one token is left to compute (its logits)
        num_host = self.lookup(seq.block_hashes[num_hbm:max_blocks]) if self._where else 0
        key = (seq.request_id, id(seq), seq.num_preemptions)
        if key not in self._queried:                    # the head of the queue may retry
            self._queried[key] = None
            if len(self._queried) > _QUERIED_MEMORY:
                self._queried.popitem(last=False)
            self.stats.queries += seq.num_tokens - num_hbm * bs
        if num_host == 0:           # (an empty tier answers at once: nothing to look up)
            return False
        hashes = seq.block_hashes[num_hbm:num_hbm + num_host]
        chunks = {self._where[h][0] for h in hashes}
        for chunk_id in chunks:          # a hit makes its chunks recently used (before the blocks
            self._chunks.move_to_end(chunk_id)   # admitting it evicts from HBM come in here)
        admitted = bm.admit(seq, lambda num_remaining: num_host * bs)
        if admitted is None:
            return False
        heapq.heappop(sched.waiting)
        seq.num_computed_tokens = admitted.num_cached_tokens
        seq.status = SequenceStatus.WAITING_FOR_KV
        sched.kv.park(seq)
        first = admitted.num_cached_tokens // bs
        seconds = self.copy_seconds(len(hashes) * self.link_block_bytes,
                                    -(-len(chunks) // self.config.prefetch_depth))
        now = self.clock()
        if self.config.sync_load:
            self._stall_s += seconds
            ready_at = now
        else:
            ready_at = max(now, self._link_free_at) + seconds
            self._link_free_at = ready_at
        self._loads.append(_Load(seq, first, hashes, seconds, ready_at))
        seq.kv_tier_load = (now, ready_at, len(hashes))     # (a span of the worker's trace)
        return True

    def next_ready_at(self) -> float | None:
        """When the next load ends (the engine's clock); None with none in flight."""
        return self._loads[0].ready_at if self._loads else None

    def take_stall(self) -> float:
        """sync_load: the copy time the step about to run must wait for."""
        stall, self._stall_s = self._stall_s, 0.0
        self.stats.stall_s += stall
        return stall

    def poll(self, sched: "Scheduler") -> int:
        """Finish the loads whose copy has ended (their requests run from the next schedule);
        flush the stores. How many finished."""
        self._flush()
        now = self.clock()
        done = 0
        while self._loads and self._loads[0].ready_at <= now:
            load = self._loads.popleft()
            seq = load.seq
            if sched.kv.loading(seq.request_id) is not seq:   # aborted while loading
                continue
            num_loaded = self._copy_in(load)
            tokens = (load.first_block + num_loaded) * self.block_size
            sched.finish_kv_load(seq.request_id, loaded=True, num_computed_tokens=tokens)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = min(tokens, seq.num_prompt_tokens)
            s = self.stats
            s.loads += 1
            s.hits += num_loaded * self.block_size
            s.bytes_loaded += num_loaded * self.link_block_bytes
            s.observe_load(load.seconds)
            done += 1
        return done

    def _copy_in(self, load: _Load) -> int:
        """Write the load's blocks that are still in the tier into the request's blocks; how many
        (from the first). A copy that raises loads none: the prefix is computed instead."""
        parts = []
        for h in load.hashes:
            where = self._where.get(h)
            if where is None:
                break
            parts.append(where)
        if len(parts) < len(load.hashes):
            self.stats.loads_partial += 1
        if not parts or not self.holds_data:
            return len(parts)
        targets = load.seq.block_table[load.first_block:load.first_block + len(parts)]
        try:
            k = np.concatenate([self._chunks[c].k[i] for c, i in parts], axis=1)
            v = np.concatenate([self._chunks[c].v[i] for c, i in parts], axis=1)
            self.kv_cache.write_blocks(targets, k, v)
        except Exception:  # noqa: BLE001 - the prefix is computed instead; never a wrong answer
            log.exception("a KV host tier load failed; computing the prefix instead",
                          extra={"request_id": load.seq.request_id})
            self.stats.loads_failed += 1
            return 0
        return len(parts)

    # ---- the shared tier's side (worker/kv_shared.py) -----------------------------------------
    @property
    def block_shape(self) -> tuple[int, ...]:
        """One block's K (or V) as the tier stores it: [num_layers, 1, block_size, n_kv, head_dim]."""
        c = self.kv_cache
        return (c.num_layers, 1, c.block_size, c.num_kv_heads, c.head_dim)

    def take_exports(self, max_blocks: int) -> list[tuple[bytes, np.ndarray, np.ndarray]]:
        """Blocks stored here from this engine's HBM since the last call, still held: (hash, K, V)."""
        out = []
        while self._exports and len(out) < max_blocks:
            h = self._exports.popleft()
            where = self._where.get(h)
            if where is not None:
                chunk = self._chunks[where[0]]
                out.append((h, chunk.k[where[1]], chunk.v[where[1]]))
        return out

    def insert(self, blocks: list[tuple[bytes, np.ndarray, np.ndarray]]) -> int:
        """Store blocks that came from elsewhere (another worker, through the shared tier); those
        already here, or of another shape or dtype than this engine's, are skipped. How many stored."""
        if not self.holds_data:
            return 0
        shape, dtype, n = self.block_shape, self.kv_cache.dtype, 0
        for h, k, v in blocks:
            if h in self._where or k.shape != shape or v.shape != shape or k.dtype != dtype or v.dtype != dtype \
                    or self.host_block_bytes > self.config.host_bytes:
                continue
            self._put(h, k, v)
            n += 1
        self.stats.blocks_inserted += n
        return n

    def clear(self) -> None:
        """Forget every stored block (loads in flight then find theirs gone, and compute them)."""
        while self._chunks:
            self._evict_oldest()

    def check(self) -> None:
        """The index and the byte count agree with the chunks; within the budget."""
        assert self.used_bytes <= self.config.host_bytes, f"{self.used_bytes} > {self.config.host_bytes}"
        assert self.used_bytes == sum(c.nbytes for c in self._chunks.values())
        if self.holds_data:
            assert self.used_bytes == self.held_array_bytes()
        for h, (chunk_id, i) in self._where.items():
            assert self._chunks[chunk_id].hashes[i] == h
