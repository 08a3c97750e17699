"""KV-tier transfers in the request's trace (--otlp-traces-endpoint, a real OTLP receiver): a
prefix loaded back from the worker's host tier is a `mindmotor.worker.kv_tier_load` span under the
call's span, in the caller's trace; a prefix fetched from the shared tier (Redis) is a
`mindmotor.worker.kv_shared_fetch` span under the span of the request that runs."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mindmotor.common.tracing import CURRENT_SPAN, Tracing
from mindmotor.common.waiting import wait_until
from mindmotor.engine.async_engine import AsyncLLMEngine
from mindmotor.engine.config import EngineConfig
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.worker.kv_shared import SharedKVTier
from otlp_receiver import OtlpReceiver
from tests.support.service_processes import REDIS_URL

from .rpc import collect, request

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


def prompts(n: int, length: int = 30) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [[int(x) for x in rng.integers(1, 300, length)] for _ in range(n)]


def test_a_host_tier_load_is_a_span_of_the_call(start_worker, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    worker = start_worker("--timing", "virtual", "--block-size", "4", "--num-blocks", "24",
                          "--kv-host-bytes", "1MiB", "--otlp-traces-endpoint", receiver.url)
    batch = prompts(6)
    for i, p in enumerate(batch):              # the small pool evicts the first prompts' blocks to the tier
        assert collect(worker.stub.Generate(request(p, f"r{i}", max_tokens=2, ignore_eos=True))).finish_reason
    metadata = (("traceparent", f"00-{TRACE_ID}-{CLIENT_SPAN}-01"),)
    out = collect(worker.stub.Generate(request(batch[0] + [7, 8, 9], "again", max_tokens=2, ignore_eos=True),
                                       metadata=metadata))
    assert out.finish_reason == "length"
    wait_until(lambda: receiver.named("mindmotor.worker.kv_tier_load"), timeout=20, what="the tier load's span")
    (load,) = receiver.named("mindmotor.worker.kv_tier_load")
    (call,) = [s for s in receiver.named("mindmotor.worker.generate") if s.trace_id == TRACE_ID]
    assert load.trace_id == TRACE_ID and load.parent_id == call.span_id and call.parent_id == CLIENT_SPAN
    assert load.attributes["mindmotor.blocks"] >= 1


def test_a_shared_tier_fetch_is_a_span_of_the_request(tiny_model, redis_prefix, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    config = dict(model=str(tiny_model), block_size=4, num_blocks=24, max_num_batched_tokens=64,
                  kv_host_bytes=2**20, timing="virtual")
    a, b = (AsyncLLMEngine(EngineConfig(**config), idle_check_interval_s=0.05) for _ in range(2))
    tracing = Tracing("mindmotor-worker", receiver.url)
    greedy = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    batch = prompts(6)

    async def run(eng, rid, prompt):
        async for _ in eng.generate(rid, prompt, greedy):
            pass

    async def scenario():
        shared_a = SharedKVTier(a, REDIS_URL, prefix=redis_prefix.rstrip(":"))
        shared_b = SharedKVTier(b, REDIS_URL, prefix=redis_prefix.rstrip(":"), tracing=tracing)
        shared_b.start()
        try:
            for i, p in enumerate(batch):
                await run(a, f"a{i}", p)
            while await shared_a.publish():
                pass
            span = tracing.start("mindmotor.worker.generate")
            token = CURRENT_SPAN.set(span)         # what the worker's Generate does
            try:
                await run(b, "b0", batch[0] + [7, 8, 9])
            finally:
                CURRENT_SPAN.reset(token)
                span.end()
            return span, shared_b.fetched
        finally:
            await shared_a.close()
            await shared_b.close()
    try:
        span, fetched = asyncio.run(scenario())
        assert fetched >= 7
        wait_until(lambda: receiver.named("mindmotor.worker.kv_shared_fetch"), timeout=20, what="the fetch's span")
    finally:
        tracing.shutdown()
        for e in (a, b):
            e.shutdown()
    (fetch,) = receiver.named("mindmotor.worker.kv_shared_fetch")
    assert fetch.trace_id == span.trace_id.hex() and fetch.parent_id == span.span_id.hex()
    assert fetch.attributes["mindmotor.blocks"] == fetched
