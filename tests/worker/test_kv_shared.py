"""The shared KV tier (worker/kv_shared.py): blocks one engine evicted to its host tier reach
another engine of the same model through Redis, and its output is the same as computing them; a
Redis that is away only means computing."""

from __future__ import annotations

import asyncio

import numpy as np

from mindmotor.common.ports import free_port
from mindmotor.engine.async_engine import AsyncLLMEngine
from mindmotor.engine.config import EngineConfig
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.worker.kv_shared import SharedKVTier
from tests.support.service_processes import REDIS_URL

GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)


def engine(ckpt, **options) -> AsyncLLMEngine:
    config = dict(model=str(ckpt), block_size=4, num_blocks=24, max_num_batched_tokens=64, kv_host_bytes=2**20,
                  timing="virtual")
    return AsyncLLMEngine(EngineConfig(**{**config, **options}), idle_check_interval_s=0.05)


async def generate(eng: AsyncLLMEngine, rid: str, prompt: list[int]) -> list[int]:
    tokens: list[int] = []
    async for out in eng.generate(rid, prompt, GREEDY):
        tokens.extend(out.new_token_ids)
    return tokens


def test_another_worker_finds_the_prefix_in_the_shared_tier(tiny_ckpt, redis_prefix):
    rng = np.random.default_rng(5)
    prompts = [[int(x) for x in rng.integers(1, 300, 30)] for _ in range(6)]
    a, b, reference = engine(tiny_ckpt), engine(tiny_ckpt), engine(tiny_ckpt, num_blocks=400, kv_host_bytes=0)

    async def scenario():
        shared_a = SharedKVTier(a, REDIS_URL, prefix=redis_prefix.rstrip(":"))
        shared_b = SharedKVTier(b, REDIS_URL, prefix=redis_prefix.rstrip(":"))
        shared_b.start()                       # b fetches before its engine takes a request
        try:
            for i, p in enumerate(prompts):    # a's small pool evicts the first prompts' blocks
                await generate(a, f"a{i}", p)
            while await shared_a.publish():
                pass
            assert shared_a.published > 0
            first = prompts[0] + [7, 8, 9, 10, 11]          # the first conversation goes on, on b
            got = await generate(b, "b0", first)
            want = await generate(reference, "r0", first)
            return got, want, shared_b.fetched
        finally:
            await shared_a.close()
            await shared_b.close()
    try:
        got, want, fetched = asyncio.run(scenario())
        assert got == want
        assert fetched >= 7                    # 30 prompt tokens: 7 full blocks
        stats = b.stats()
        assert stats.kv_tier_hits >= 28 and stats.prefix_hits == 0
    finally:
        for e in (a, b, reference):
            e.shutdown()


def test_a_redis_that_is_away_only_means_computing(tiny_ckpt):
    eng = engine(tiny_ckpt)
    reference = engine(tiny_ckpt, num_blocks=400, kv_host_bytes=0)

    async def scenario():
        shared = SharedKVTier(eng, f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
        shared.start()
        try:
            prompt = list(range(1, 40))
            return await generate(eng, "x", prompt), await generate(reference, "r", prompt), shared.errors
        finally:
            await shared.close()
    try:
        got, want, errors = asyncio.run(scenario())
        assert got == want and errors == 1
    finally:
        eng.shutdown()
        reference.shutdown()
