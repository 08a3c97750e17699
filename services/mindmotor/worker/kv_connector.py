"""The KV connector, worker side (vLLM's vocabulary): moves prompt KV between workers for the
prefill/decode split. The scheduler side (`mindmotor.engine.kv_connector`) decides what is held
and what must be pulled; this side does the network work, through the async engine's typed
methods only:

- **serving pins** (a prefill worker): `read` streams a pinned prompt's KV to a decode worker
  (PullKV), `release` frees it (ReleaseKV); pins the decode side never releases expire in the
  engine;
- **loads** (a decode worker): for every `KVLoad` the scheduler starts (a continuation with a KV
  source, its blocks reserved), pull the blocks the local prefix cache lacks from the source,
  pay the emulated transfer time, and hand them to the engine (`finish_kv_load`), then release
  the pin at the source (in the background; its pin timeout is the safety net).

Never a hang, never a lost request: when the pull fails, times out, or brings malformed blocks,
the engine computes the prompt itself (`finish_kv_load(..., None)`) and the stream continues the
same way.

Traced (`--otlp-traces-endpoint`): a load is a `mindmotor.worker.kv_pull` span, the child of the
continuation's `mindmotor.worker.generate` span (`trace_parents`, kept by the service while the
call runs), whose traceparent the PullKV call carries to the prefill worker (its
`mindmotor.worker.kv_read` span): one trace from the coordinator through both workers.

Transfer time: `α + bytes / (η · link bandwidth)` of the emulated profile (`CostModel.
kv_transfer_seconds`) for the tokens actually pulled, over HCCS when both workers are on the
same node, the inter-node link otherwise. In realtime timing the request does not run before
that time has passed since the pull started.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from mindmotor.common import rpc
from mindmotor.common.logging import request_context
from mindmotor.common.tracing import Tracing
from mindmotor.engine.async_engine import AsyncLLMEngine, EngineDeadError
from mindmotor.engine.continuation import KVSource
from mindmotor.engine.kv_connector import KVBlocks, KVLoad
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc

from .kv_stream import DEFAULT_BLOCKS_PER_CHUNK, blocks_from_chunks, chunks_from_blocks
from .metrics import WorkerMetrics

log = logging.getLogger("mindmotor.worker")

PEER_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
RELEASE_TIMEOUT_S = 2.0


class PeerChannels:
    """One channel (and Worker stub) per peer worker address, made on first use."""

    def __init__(self) -> None:
        self._stubs: dict[str, worker_pb2_grpc.WorkerStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = rpc.aio_channel(address, options=PEER_CHANNEL_OPTIONS)
            self._channels.append(channel)
            stub = self._stubs[address] = worker_pb2_grpc.WorkerStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close(grace=None)


class WorkerKVConnector:
    def __init__(self, engine: AsyncLLMEngine, metrics: WorkerMetrics, node: str, pull_timeout_s: float,
                 peers: PeerChannels | None = None, tracing: Tracing | None = None):
        self.engine = engine
        self.tracing = tracing or Tracing("mindmotor-worker")      # off unless an endpoint
        self.trace_parents: dict[str, object] = {}   # request id -> its call's span (tracing on)
        self.metrics = metrics
        self.node = node
        self.pull_timeout_s = pull_timeout_s
        self.peers = peers or PeerChannels()
        self.realtime = engine.info.timing == "realtime"
        self.block_size = engine.info.block_size
        self._tasks: set[asyncio.Task] = set()
        engine.connect_kv(self.start_load)

    # ---- serving pins (the prefill side) -------------------------------------------------------
    async def read(self, handle: str, skip_blocks: int, blocks_per_chunk: int = 0):
        """The chunks of a pinned prompt's KV (KeyError: no such pin)."""
        kv = await self.engine.read_pinned_kv(handle, skip_blocks)
        return chunks_from_blocks(kv, blocks_per_chunk or DEFAULT_BLOCKS_PER_CHUNK)

    async def release(self, handle: str) -> bool:
        return await self.engine.release_kv(handle)

    # ---- loads (the decode side) --------------------------------------------------------------
    def start_load(self, load: KVLoad) -> None:
        """Called by the engine (on this event loop) for each continuation that waits for its KV."""
        self._spawn(self._load(load))

    async def _load(self, load: KVLoad) -> None:
        span = None
        if self.tracing.enabled:
            span = self.tracing.start("mindmotor.worker.kv_pull", self.trace_parents.get(load.request_id), attributes={
                "mindmotor.request_id": load.request_id, "mindmotor.kv_source": load.source.address,
                "mindmotor.skip_blocks": load.skip_blocks, "mindmotor.tokens": load.num_tokens})
        outcome = "engine dead"
        with request_context(load.request_id):
            try:
                try:
                    outcome = await self._pull_and_finish(load, span)
                except (EngineDeadError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # noqa: BLE001 - never strand a continuation waiting for KV
                    log.exception("KV load failed unexpectedly")
                    outcome = await self._fallback(load, _describe(exc))
            except EngineDeadError:
                return                               # every stream ends with the engine's error
            finally:
                self._spawn(self._release_at_source(load.source))
                if span is not None:
                    span.set_attribute("mindmotor.outcome", outcome)
                    span.end()
            log.info("KV load done", extra={"outcome": outcome, "source": load.source.address,
                                            "skip_blocks": load.skip_blocks})

    async def _pull_and_finish(self, load: KVLoad, span=None) -> str:
        """Get the continuation running: with the pulled KV ("pulled") or computed here ("fallback: ...")."""
        started = time.monotonic()
        try:
            kv = await self._pull(load.source, load.skip_blocks, span)
        except (grpc.aio.AioRpcError, ValueError, asyncio.TimeoutError) as exc:
            return await self._fallback(load, _describe(exc))
        num_tokens = min(load.num_tokens, kv.num_blocks * self.block_size)
        link = await self._pay_transfer(num_tokens, load.source.node, started)
        if span is not None:
            span.set_attributes({"mindmotor.link": link, "mindmotor.tokens_pulled": num_tokens})
        try:
            finished = await self.engine.finish_kv_load(load.request_id, kv)
        except ValueError as exc:
            return await self._fallback(load, str(exc))
        if finished:
            self.metrics.kv_transfers.labels(outcome="pulled").inc()
        return "pulled" if finished else "gone"

    async def _pull(self, source: KVSource, skip_blocks: int, span=None) -> KVBlocks:
        call = self.peers.stub(source.address).PullKV(
            pb.PullKVRequest(handle=source.handle, skip_blocks=skip_blocks), timeout=self.pull_timeout_s,
            metadata=Tracing.inject(span) or None)
        try:
            chunks = [chunk async for chunk in call]
        finally:
            call.cancel()
        return blocks_from_chunks(chunks, skip_blocks)

    async def _pay_transfer(self, num_tokens: int, peer_node: str, started: float) -> str:
        link = "intra_node" if peer_node == self.node else "inter_node"
        seconds = await self.engine.price_kv_transfer(num_tokens, link)
        self.metrics.kv_transfer_seconds.labels(link=link).observe(seconds)
        self.metrics.kv_transfer_bytes.labels(link=link).inc(num_tokens * self.engine.info.kv_bytes_per_token)
        if self.realtime:
            remaining = started + seconds - time.monotonic()
            if remaining > 0:
                await asyncio.sleep(remaining)
        return link

    async def _fallback(self, load: KVLoad, reason: str) -> str:
        log.warning("KV transfer failed; prefilling here instead", extra={"reason": reason})
        self.metrics.kv_transfers.labels(outcome="fallback").inc()
        await self.engine.finish_kv_load(load.request_id, None)
        return f"fallback: {reason}"

    async def _release_at_source(self, source: KVSource) -> None:
        try:
            await self.peers.stub(source.address).ReleaseKV(pb.ReleaseKVRequest(handle=source.handle),
                                                            timeout=RELEASE_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:     # the prefill worker's pin timeout frees it
            log.info("could not release the KV on the prefill worker",
                     extra={"address": source.address, "error": _describe(exc)})

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=RELEASE_TIMEOUT_S)
        await self.peers.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
