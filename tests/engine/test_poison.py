"""Poison containment inside the engine: the shared request rules refuse every value that could
not cross the wire or would raise on the engine thread, and an exception raised for one request
(injected here into a real engine's output processing, sampler or model runner) finishes that
request alone, while the others produce exactly what they would have without it."""

from __future__ import annotations

import asyncio

import pytest

from mindmotor.common.waiting import wait_until
from mindmotor.engine.continuation import Continuation, KVSource
from mindmotor.engine.async_engine import AsyncLLMEngine, EngineDeadError, RequestFailed
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.llm_engine import MAX_STEP_FAILURES, EngineBroken, LLMEngine, RequestError
from mindmotor.rules.request_rules import (InvalidRequest, check_choices, check_text, check_token_ids,
                                            resolve_max_tokens)
from mindmotor.rules.sampling_params import SamplingParams


@pytest.mark.parametrize("fields, param, words", [
    ({"seed": -1}, "seed", "[0, 2^63 - 1]"),
    ({"seed": 2**63}, "seed", "[0, 2^63 - 1]"),
    ({"top_k": 2**31}, "top_k", "below 2^31"),
    ({"stop_token_ids": [2**31]}, "stop_token_ids", "outside [0, 2^31)"),
    ({"stop_token_ids": [-1]}, "stop_token_ids", "outside [0, 2^31)"),
    ({"stop_token_ids": [1.5]}, "stop_token_ids", "must be integers"),
    ({"stop": ["\ud800 x"]}, "stop", "lone surrogate"),
    ({"temperature": float("nan")}, "temperature", "finite"),
    ({"top_p": float("inf")}, "top_p", "finite"),
    ({"max_tokens": 2**32}, "max_tokens", "below 2^32"),
    ({"min_tokens": 2**32}, "min_tokens", "below 2^32"),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens", "must not exceed max_tokens"),
])
def test_sampling_params_refuse_what_the_wire_or_numpy_cannot_take(fields, param, words):
    with pytest.raises(InvalidRequest) as raised:
        SamplingParams(**fields)
    assert raised.value.param == param and words in str(raised.value)


def test_the_largest_accepted_values_fit_the_wire_and_numpy():
    params = SamplingParams(seed=2**63 - 1, top_k=2**31 - 1, stop_token_ids=[2**31 - 1], max_tokens=2**32 - 1)
    assert params.seed == 2**63 - 1 and params.stop_token_ids == [2**31 - 1]
    assert SamplingParams(temperature=1e-300).greedy       # 1 / t would overflow: sampled as greedy


def test_request_rules():
    assert check_text("ok ✓", "prompt") == "ok ✓"
    with pytest.raises(InvalidRequest, match=r"U\+D800 at character 3") as raised:
        check_text("ab \ud800", "messages.0.content")
    assert raised.value.param == "messages.0.content"
    assert check_token_ids([0, 2**31 - 1], "ids") == [0, 2**31 - 1]
    with pytest.raises(InvalidRequest, match=r"\[2147483648\] are outside \[0, 2\^31\)"):
        check_token_ids([2**31], "ids")
    with pytest.raises(InvalidRequest, match=r"\[384\] are outside the vocabulary \[0, 384\)"):
        check_token_ids([3, 384], "ids", vocab_size=384)
    with pytest.raises(InvalidRequest, match="must be integers"):
        check_token_ids([True], "ids")

    assert resolve_max_tokens(10, None, 0, 100) == 90
    assert resolve_max_tokens(10, 5, 5, 100) == 5
    with pytest.raises(InvalidRequest, match="at most 90 can be generated") as raised:
        resolve_max_tokens(10, None, 91, 100)
    assert raised.value.param == "min_tokens" and raised.value.code == "context_length_exceeded"
    with pytest.raises(InvalidRequest, match="110 were requested"):
        resolve_max_tokens(10, 100, 0, 100)

    assert check_choices(32, 128, 128, 10000) == 4096
    with pytest.raises(InvalidRequest, match="12800 choices .* could never be admitted") as raised:
        check_choices(100, 128, 128, 10000)
    assert raised.value.code == "too_many_choices"
    with pytest.raises(InvalidRequest, match="n must be at most 128"):
        check_choices(1, 129, 128, 10000)


@pytest.fixture(scope="module")
def engine(tiny_ckpt):
    return LLMEngine(EngineConfig(model=str(tiny_ckpt), num_blocks=512))


@pytest.mark.parametrize("prompt, fields, param, words", [
    ([2**31], {}, "prompt", "outside the vocabulary"),
    ([5, 384], {}, "prompt", "[384] are outside the vocabulary [0, 384)"),
    ("\ud800 x", {}, "prompt", "lone surrogate"),
    ("hi", {"stop_token_ids": [384]}, "stop_token_ids", "outside the vocabulary"),
    ([5] * 10, {"max_tokens": None, "min_tokens": 1015}, "min_tokens", "at most 1014 can be generated"),
])
def test_engine_validation_refuses_poison(engine, prompt, fields, param, words):
    with pytest.raises(RequestError) as raised:
        engine.validate(prompt, SamplingParams(**fields))
    assert raised.value.param == param and words in str(raised.value)


def _run(engine: LLMEngine, requests: dict[str, tuple]) -> dict[str, dict]:
    """Add the requests, step to the end; per request its tokens, finish reason and error."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    out = {rid: {"tokens": [], "finish": None, "error": None} for rid in requests}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[o.request_id]["tokens"] += o.new_token_ids
            if o.finished:
                out[o.request_id].update(finish=o.finish_reason, error=o.error)
    engine.check_invariants()
    return out


REQUESTS = {
    "greedy": ([5, 6, 7, 8], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)),
    "seeded": ([9, 10, 11], SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)),
    "penalized": ([12, 13], SamplingParams(max_tokens=12, temperature=0.8, seed=3, presence_penalty=1.0,
                                           min_tokens=4, ignore_eos=True)),
}
POISON = ([20, 21, 22], SamplingParams(max_tokens=12, temperature=1.0, seed=1, ignore_eos=True))


def test_an_exception_in_one_requests_output_processing_fails_it_alone(engine, monkeypatch):
    clean = _run(engine, REQUESTS)
    on_token = engine.outputs.on_token

    def failing(seq, token):
        if seq.request_id == "poison" and seq.num_output_tokens >= 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected: this request's detokenizer raises")
        return on_token(seq, token)

    monkeypatch.setattr(engine.outputs, "on_token", failing)
    results = _run(engine, {**REQUESTS, "poison": POISON})

    assert results["poison"]["finish"] == "error" and "UnicodeDecodeError" in results["poison"]["error"]
    for rid in REQUESTS:
        assert results[rid] == clean[rid]                # the same tokens as without the poison
    assert engine.stats().kv_usage == 0.0 and engine.stats().request_failures >= 1


def test_an_exception_sampling_one_row_fails_that_request_alone(engine, monkeypatch):
    clean = _run(engine, REQUESTS)
    sample_row = engine.sampler._sample_row

    def failing(row, seq):
        if seq.request_id == "poison":
            raise ValueError("injected: probabilities contain NaN")
        return sample_row(row, seq)

    monkeypatch.setattr(engine.sampler, "_sample_row", failing)
    results = _run(engine, {**REQUESTS, "poison": POISON})

    assert results["poison"] == {"tokens": [], "finish": "error", "error": "ValueError: injected: probabilities contain NaN"}
    for rid in REQUESTS:
        assert results[rid] == clean[rid]                # other rows drew from their own generators


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(engine, monkeypatch):
    run = engine.runner.run
    failures = {"left": 1}

    def failing(sched):
        if failures["left"]:
            failures["left"] -= 1
            raise MemoryError("injected: the forward pass failed")
        return run(sched)

    monkeypatch.setattr(engine.runner, "run", failing)
    results = _run(engine, REQUESTS)
    assert {r["finish"] for r in results.values()} == {"error"}
    assert all("the engine step that computed it failed: MemoryError" in r["error"] for r in results.values())
    assert _run(engine, REQUESTS)["greedy"]["finish"] == "length"     # the next requests are served


def test_steps_failing_in_a_row_break_the_engine(tiny_ckpt, monkeypatch):
    engine = LLMEngine(EngineConfig(model=str(tiny_ckpt), num_blocks=256))

    def failing(sched):
        raise RuntimeError("injected: the device is gone")

    monkeypatch.setattr(engine.runner, "run", failing)
    for i in range(MAX_STEP_FAILURES - 1):
        engine.add_request(f"r{i}", [5, 6], SamplingParams(max_tokens=2))
        assert [o.finish_reason for o in engine.step()] == ["error"]
    engine.add_request("last", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(EngineBroken, match=f"{MAX_STEP_FAILURES} engine steps in a row failed"):
        engine.step()


def test_the_async_engine_survives_per_request_failures(tiny_ckpt):
    """Real paths: a request id that is a pinned prefill's (refused on the engine thread), a
    decode request whose first token already finishes it (refused while its blocks were being
    reserved), and an injected detokenizer failure — each fails alone, a long stream goes on."""
    engine = AsyncLLMEngine(EngineConfig(model=str(tiny_ckpt), num_blocks=512))
    on_token = engine.engine.outputs.on_token

    def failing(seq, token):
        if seq.request_id == "poison":
            raise RuntimeError("injected")
        return on_token(seq, token)

    engine.engine.outputs.on_token = failing
    long_params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)

    async def collect(rid, prompt, params, **kw):
        outs = [o async for o in engine.generate(rid, prompt, params, **kw)]
        return sum((o.new_token_ids for o in outs), []), outs[-1].finish_reason

    async def scenario():
        long = asyncio.ensure_future(collect("long", [5, 6, 7], long_params))
        assert (await collect("pinned", [8, 9, 10], SamplingParams(max_tokens=4), prefill_only=True))[1] == "prefilled"
        with pytest.raises(RequestError, match="already in use"):
            await collect("pinned", [8, 9], SamplingParams(max_tokens=4))
        with pytest.raises(RequestFailed, match="RuntimeError: injected"):
            await collect("poison", [11, 12], SamplingParams(max_tokens=4))
        with pytest.raises(RequestError, match="nothing is left to generate"):
            await collect("decode", [13, 14], SamplingParams(max_tokens=1),
                          continuation=Continuation((15,), 0, KVSource("p:1", "h")))
        assert await engine.release_kv("pinned")
        return await long

    try:
        tokens, finish = asyncio.run(scenario())
        assert len(tokens) == 200 and finish == "length"
        assert engine.dead is None
        engine.engine.check_invariants()
    finally:
        engine.shutdown()


def test_a_broken_engine_ends_every_stream_and_calls_on_dead(tiny_ckpt):
    engine = AsyncLLMEngine(EngineConfig(model=str(tiny_ckpt), num_blocks=256), idle_check_interval_s=0.05)
    died = []
    engine.on_dead(died.append)

    def broken(live=None):
        raise AssertionError("injected: the KV pool does not add up")

    def failing_run(sched):
        raise RuntimeError("injected: the forward pass failed")

    async def scenario():
        stream = engine.generate("r", [5, 6], SamplingParams(max_tokens=300, temperature=0, ignore_eos=True))
        await stream.__anext__()
        engine.engine.block_manager.check_invariants = broken     # checked on the first failed step
        engine.engine.runner.run = failing_run
        with pytest.raises(EngineDeadError, match="no longer adds up"):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            engine.generate("after", [5], SamplingParams(max_tokens=2))

    try:
        asyncio.run(scenario())
        wait_until(lambda: died, timeout=10)                 # the callbacks run after the streams end
        assert len(died) == 1 and isinstance(died[0], EngineBroken)
        late = []
        engine.on_dead(late.append)                          # registered after the death: called at once
        assert late == died
    finally:
        engine.shutdown()
