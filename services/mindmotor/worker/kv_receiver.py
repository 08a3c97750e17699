"""`KVReceiver`: the decode side of the prefill/decode split — pull a prefilled request's KV from
its prefill instance, pay the emulated transfer time, hand the blocks to the engine, release them
on the prefill instance.

Never a hang, never a lost request: when the pull fails, times out, or brings malformed blocks
(or the local pool has no room for them), the engine computes the prompt and the first token
itself (`prefill_locally`) and the stream continues the same way. The handle is released on the
prefill instance in every case (in the background; its pin timeout is the safety net).

Transfer time: `α + bytes / (η · link bandwidth)` of the emulated profile (`CostModel.
kv_transfer_seconds`) for the tokens actually pulled — blocks the local prefix cache already held
are not — over HCCS when both instances are on the same node, the inter-node link otherwise. In
realtime timing the request does not run before that time has passed since the pull started.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from mindmotor.common import rpc
from mindmotor.engine.async_engine import AsyncLLMEngine
from mindmotor.engine.kv_transfer import KVBlocks
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc

from .kv_stream import blocks_from_chunks
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


class KVReceiver:
    def __init__(self, engine: AsyncLLMEngine, metrics: WorkerMetrics, node: str, pull_timeout_s: float,
                 peers: PeerChannels | None = None):
        self.engine = engine
        self.metrics = metrics
        self.node = node
        self.pull_timeout_s = pull_timeout_s
        self.peers = peers or PeerChannels()
        self.realtime = engine.engine.config.timing == "realtime"
        self.block_size = engine.engine.config.block_size
        self._releases: set[asyncio.Task] = set()

    async def receive(self, request_id: str, remote: pb.RemotePrefill, num_prompt_tokens: int,
                      skip_blocks: int | None) -> str:
        """Get the request running: with the pulled KV ("pulled") or computed here ("fallback: ...")."""
        try:
            if skip_blocks is None:
                return await self._fallback(request_id, "no free KV blocks for the transfer")
            started = time.monotonic()
            try:
                kv = await self._pull(remote, skip_blocks)
            except (grpc.aio.AioRpcError, ValueError, asyncio.TimeoutError) as exc:
                return await self._fallback(request_id, _describe(exc))
            num_tokens = min(num_prompt_tokens, (skip_blocks + kv.num_blocks) * self.block_size) \
                - skip_blocks * self.block_size
            await self._pay_transfer(num_tokens, remote.node, started)
            try:
                committed = await self.engine.call(lambda e: e.commit_kv(request_id, kv))
            except ValueError as exc:
                return await self._fallback(request_id, str(exc))
            if committed:
                self.metrics.kv_transfers.labels(outcome="pulled").inc()
            return "pulled"
        finally:
            self._release_soon(remote)

    async def _pull(self, remote: pb.RemotePrefill, skip_blocks: int) -> KVBlocks:
        call = self.peers.stub(remote.address).PullKV(
            pb.PullKVRequest(handle=remote.handle, skip_blocks=skip_blocks), timeout=self.pull_timeout_s)
        try:
            chunks = [chunk async for chunk in call]
        finally:
            call.cancel()
        return blocks_from_chunks(chunks, skip_blocks)

    async def _pay_transfer(self, num_tokens: int, peer_node: str, started: float) -> None:
        link = "intra_node" if peer_node == self.node else "inter_node"
        seconds = await self.engine.call(lambda e: e.device.price_kv_transfer(num_tokens, link))
        nbytes = num_tokens * self.engine.engine.device.profile.kv_bytes_per_token
        self.metrics.kv_transfer_seconds.labels(link=link).observe(seconds)
        self.metrics.kv_transfer_bytes.labels(link=link).inc(nbytes)
        if self.realtime:
            remaining = started + seconds - time.monotonic()
            if remaining > 0:
                await asyncio.sleep(remaining)

    async def _fallback(self, request_id: str, reason: str) -> str:
        log.warning("KV transfer failed; prefilling here instead", extra={"reason": reason})
        self.metrics.kv_transfers.labels(outcome="fallback").inc()
        await self.engine.call(lambda e: e.prefill_locally(request_id))
        return f"fallback: {reason}"

    def _release_soon(self, remote: pb.RemotePrefill) -> None:
        async def release():
            try:
                await self.peers.stub(remote.address).ReleaseKV(pb.ReleaseKVRequest(handle=remote.handle),
                                                                timeout=RELEASE_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:     # the prefill instance's pin timeout frees it
                log.info("could not release the KV on the prefill instance",
                         extra={"address": remote.address, "error": _describe(exc)})

        task = asyncio.get_running_loop().create_task(release())
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def close(self) -> None:
        if self._releases:
            await asyncio.wait(list(self._releases), timeout=RELEASE_TIMEOUT_S)
        await self.peers.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
