"""The shared KV tier (`--kv-shared`): the host tiers of one model's workers share their blocks
through Redis, so that a conversation that lands on another worker still finds its prefix.

- **Publishing.** Every `PUBLISH_INTERVAL_S`, the blocks the engine's host tier stored from its own
  HBM since the last round (`HostKVTier.take_exports`) are written to Redis, one key per block —
  `{prefix}:kvtier:{model key}:{block hash}` — with `SET NX EX ttl` (a block's KV is a pure function
  of the model and its prefix, so the first writer's value is everyone's; the TTL bounds what an
  idle model leaves behind, Redis's own `maxmemory` policy the rest).
- **Fetching.** Before the engine takes a new request (`AsyncLLMEngine.connect_prefetch`), its
  prompt's block hashes past what this engine already holds (HBM or host tier) are read with one
  `MGET`, up to the first block Redis lacks; the blocks found go into the host tier
  (`HostKVTier.insert`), from where the scheduler loads them like its own. The transfer is priced on
  the emulated card's inter-node link (`price_kv_transfer`) and, in realtime timing, waited for.
- **Never a wrong answer, never a failed request.** The model key covers what decides a block's KV:
  the checkpoint (its config, the size and the first and last MiB of every weight file), the KV
  dtype and shape, and the block size — with the hash's whole-prefix chaining, a key can only hold
  the KV of that prefix under that model. A value of the wrong length is skipped. Redis errors,
  timeouts or a Redis that is away only mean no fetch (the prompt is computed) and no publishing;
  after one, Redis is left alone for `SKIP_AFTER_ERROR_S`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path

import numpy as np

from mindmotor.common.block_hash import block_hashes
from mindmotor.common.tracing import CURRENT_SPAN, Tracing
from mindmotor.engine.async_engine import AsyncLLMEngine, EngineDeadError
from mindmotor.engine.llm_engine import ValidatedRequest

log = logging.getLogger("mindmotor.worker")

PUBLISH_INTERVAL_S = 0.2
PUBLISH_BATCH = 256               # blocks per round
MAX_FETCH_BLOCKS = 1024           # per request
SKIP_AFTER_ERROR_S = 5.0
_FINGERPRINT_BYTES = 2**20


def model_key(model_dir: str | Path, block_shape: tuple[int, ...], dtype: np.dtype, block_size: int) -> str:
    """What decides a block's KV, hashed: the checkpoint's config and weight files (size, first and
    last MiB), the block's shape and dtype, the block size."""
    d = Path(model_dir)
    h = hashlib.sha256()
    h.update(repr((tuple(block_shape), str(np.dtype(dtype)), block_size)).encode())
    config = d / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for path in sorted(d.glob("*.safetensors")):
        size = path.stat().st_size
        h.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as f:
            h.update(f.read(_FINGERPRINT_BYTES))
            f.seek(max(0, size - _FINGERPRINT_BYTES))
            h.update(f.read(_FINGERPRINT_BYTES))
    return h.hexdigest()[:32]


class SharedKVTier:
    def __init__(self, engine: AsyncLLMEngine, redis_url: str, *, prefix: str = "mindmotor", ttl_s: float = 600.0,
                 node_link: str = "inter_node", timeout_s: float = 0.5, metrics=None, tracing: Tracing | None = None):
        import redis.asyncio as redis

        inner = engine.engine
        tier = inner.kv_tier
        if tier is None or not tier.holds_data:
            raise ValueError("the shared KV tier needs the host tier (--kv-host-bytes > 0, prefix caching on) "
                             "and the model runner")
        self.engine = engine
        self.block_size = inner.config.block_size
        self.shape = tier.block_shape
        self.dtype = np.dtype(tier.kv_cache.dtype)
        self.block_nbytes = 2 * int(np.prod(self.shape)) * self.dtype.itemsize
        key = model_key(inner.model_dir, self.shape, self.dtype, self.block_size)
        self.key_prefix = f"{prefix}:kvtier:{key}:"
        self.ttl_s = ttl_s
        self.link = node_link
        self.realtime = engine.info.timing == "realtime"
        self.cost_model = inner.device.cost_model      # pure: priced from this thread
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.published = 0                # blocks written
        self.fetched = 0                  # blocks read and stored in the host tier
        self.errors = 0
        self._skip_until = 0.0
        self.metrics = metrics            # WorkerMetrics, or None
        self.tracing = tracing or Tracing("mindmotor-worker")     # a fetch is a span of the request's trace
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.engine.connect_prefetch(self.prefetch)
        self._task = asyncio.get_running_loop().create_task(self._publish_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        await self.redis.aclose()

    def _key(self, block_hash: bytes) -> str:
        return self.key_prefix + block_hash.hex()

    def _available(self) -> bool:
        return time.monotonic() >= self._skip_until

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        if self.metrics is not None:
            self.metrics.kv_shared_errors.inc()
        self._skip_until = time.monotonic() + SKIP_AFTER_ERROR_S
        log.warning("the shared KV tier's Redis failed; leaving it alone for a while",
                    extra={"what": what, "error": f"{type(exc).__name__}: {exc}", "skip_s": SKIP_AFTER_ERROR_S})

    # ---- publishing ---------------------------------------------------------------------------
    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S)
            try:
                await self.publish()
            except EngineDeadError:
                return

    async def publish(self) -> int:
        """Write the blocks the host tier stored since the last call; how many were taken."""
        blocks = await self.engine.take_kv_exports(PUBLISH_BATCH)
        if not blocks or not self._available():
            return 0
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for h, k, v in blocks:
                    pipe.set(self._key(h), k.tobytes() + v.tobytes(), ex=max(1, int(self.ttl_s)), nx=True)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a cache: never fatal
            self._failed("publish", exc)
            return 0
        self.published += len(blocks)
        if self.metrics is not None:
            self.metrics.kv_shared_blocks.labels(direction="published").inc(len(blocks))
        return len(blocks)

    # ---- fetching -----------------------------------------------------------------------------
    async def prefetch(self, request: ValidatedRequest) -> int:
        """Fetch the prompt's blocks this engine lacks into its host tier; how many."""
        if not self._available():
            return 0
        ids = request.prompt_token_ids
        hashes = block_hashes(ids, self.block_size)[:(len(ids) - 1) // self.block_size]
        start = self.engine.local_prefix_blocks(hashes)
        wanted = hashes[start:start + MAX_FETCH_BLOCKS]
        if not wanted:
            return 0
        started = time.monotonic()
        stored = 0
        try:
            stored = await self._fetch(wanted, started)
            return stored
        finally:
            if self.tracing.enabled:
                self.tracing.span_after("mindmotor.worker.kv_shared_fetch", CURRENT_SPAN.get(), started,
                                        time.monotonic(), {"mindmotor.blocks_wanted": len(wanted),
                                                           "mindmotor.blocks": stored})

    async def _fetch(self, wanted: list[bytes], started: float) -> int:
        try:
            values = await self.redis.mget([self._key(h) for h in wanted])
        except Exception as exc:  # noqa: BLE001 - the prompt is computed instead
            self._failed("fetch", exc)
            return 0
        blocks = []
        for h, value in zip(wanted, values):
            if value is None or len(value) != self.block_nbytes:
                break
            kv = np.frombuffer(value, dtype=self.dtype).reshape((2,) + self.shape)
            blocks.append((h, kv[0].copy(), kv[1].copy()))
        if not blocks:
            return 0
        seconds = self.cost_model.kv_transfer_seconds(len(blocks) * self.block_size, self.link)
        if self.realtime and (remaining := started + seconds - time.monotonic()) > 0:
            await asyncio.sleep(remaining)
        stored = await self.engine.insert_kv_tier(blocks)
        self.fetched += stored
        if self.metrics is not None:
            self.metrics.kv_shared_blocks.labels(direction="fetched").inc(stored)
        return stored
