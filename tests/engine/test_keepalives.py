"""A stream opened with `keepalive_s` says KEEPALIVE while its request waits and the engine thread
makes progress — and falls silent while the engine thread is stuck, as a frozen process does."""

from __future__ import annotations

import asyncio
import threading

from mindmotor.engine.async_engine import KEEPALIVE, AsyncLLMEngine
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.continuation import Continuation, KVSource
from mindmotor.rules.sampling_params import SamplingParams


async def _until(predicate, timeout: float = 10.0) -> None:
    async def poll():
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


def test_keepalives_flow_while_a_request_waits_and_stop_while_the_engine_is_stuck(tiny_ckpt):
    engine = AsyncLLMEngine(EngineConfig(model=str(tiny_ckpt), num_blocks=256), idle_check_interval_s=0.05,
                            stall_after_s=0.3)
    loads = []
    engine.connect_kv(loads.append)            # the KV pull never ends by itself: the request waits
    gate, stuck = threading.Event(), threading.Event()

    def block(_engine):
        stuck.set()
        gate.wait(20)

    async def scenario():
        items: list = []
        stream = engine.generate("d", [5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                                 continuation=Continuation((8,), 0, KVSource("p:1", "h")), keepalive_s=0.05)

        async def read():
            async for item in stream:
                items.append(item)

        reader = asyncio.ensure_future(read())
        await _until(lambda: loads and items.count(KEEPALIVE) >= 3)       # waiting for its KV: alive
        assert all(item is KEEPALIVE for item in items)

        blocker = asyncio.ensure_future(engine._call(block))               # the engine thread stuck
        await _until(lambda: stuck.is_set() and not engine.progressing)
        silent_from = len(items)
        await asyncio.sleep(0.5)                                           # ten keepalive periods
        assert len(items) - silent_from <= 1, "keepalives went on while the engine was stuck"

        gate.set()
        await blocker
        await _until(lambda: items.count(KEEPALIVE) > silent_from + 1)    # progress again: they resume
        assert await engine.finish_kv_load("d", None)                     # no KV: computed here
        await asyncio.wait_for(reader, 10)
        outputs = [item for item in items if item is not KEEPALIVE]
        assert outputs[-1].finished and sum(len(o.new_token_ids) for o in outputs) == 3

    try:
        asyncio.run(scenario())
    finally:
        gate.set()
        engine.shutdown()

