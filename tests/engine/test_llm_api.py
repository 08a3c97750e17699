"""The offline API: `from mindmotor import LLM, SamplingParams`."""

from __future__ import annotations

import asyncio

import pytest

from mindmotor import LLM, SamplingParams
from mindmotor.engine.async_engine import AsyncLLMEngine
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.llm_engine import RequestError
from mindmotor.model.config import CheckpointError


def test_generate_accepts_strings_and_token_lists(tiny_ckpt):
    llm = LLM(model=str(tiny_ckpt), device="910B3", emulate=None)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    ids = llm.tokenizer.encode("print('hi')")
    by_text, by_ids = llm.generate(["print('hi')", ids], params)
    assert by_text.token_ids == by_ids.token_ids and len(by_text.token_ids) == 6
    assert by_text.text == llm.tokenizer.decode(by_text.token_ids)
    single = llm.generate(ids, params)
    assert len(single) == 1 and single[0].token_ids == by_ids.token_ids


def test_generate_returns_vllms_request_output_shape(tiny_ckpt):
    llm = LLM(model=str(tiny_ckpt))
    ids = llm.tokenizer.encode("print('hi')")
    by_text, by_ids = llm.generate(["print('hi')", ids], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert by_text.prompt == "print('hi')" and by_ids.prompt is None
    assert by_text.prompt_token_ids == by_ids.prompt_token_ids == ids
    (out,) = by_text.outputs
    assert by_text.finished and out.finished() and out.index == 0 and out.finish_reason == "length"
    assert len(out.token_ids) == 5 and out.text == llm.tokenizer.decode(out.token_ids)
    assert (by_text.text, by_text.token_ids, by_text.finish_reason) == (out.text, out.token_ids, out.finish_reason)


def test_skip_special_tokens_false_keeps_them(tiny_ckpt):
    llm = LLM(model=str(tiny_ckpt))
    (im_start,) = llm.tokenizer.encode("<|im_start|>")
    params = dict(max_tokens=2, temperature=0, logit_bias={im_start: 100})
    kept = llm.generate("hi", SamplingParams(**params, skip_special_tokens=False))[0].outputs[0]
    assert kept.token_ids == [im_start] * 2 and kept.text == "<|im_start|>" * 2
    assert llm.generate("hi", SamplingParams(**params))[0].outputs[0].text == ""


def test_unicode_text_streams_whole_characters(tiny_ckpt):
    llm = LLM(model=str(tiny_ckpt))
    engine = llm.engine
    engine.add_request("u", "你好 😀", SamplingParams(max_tokens=30, temperature=1.0, seed=0, ignore_eos=True))
    pieces = []
    while engine.has_unfinished_requests():
        pieces += [o.new_text for o in engine.step()]
    assert not any(p.endswith("\ufffd") for p in pieces[:-1] if p)   # no half characters mid-stream
    out = llm.generate(["你好 😀"], SamplingParams(max_tokens=30, temperature=1.0, seed=0, ignore_eos=True))[0]
    assert "".join(pieces) == out.text == llm.tokenizer.decode(out.token_ids)


def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        LLM(model=str(tmp_path / "nope"))


def test_engine_config_is_validated():
    with pytest.raises(ValueError, match="timing"):
        EngineConfig(timing="sometimes")


def test_async_engine_streams_and_cancels(tiny_ckpt):
    engine = AsyncLLMEngine(EngineConfig(model=str(tiny_ckpt)))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    async def collect(rid):
        tokens = []
        async for out in engine.generate(rid, "import sys", params):
            tokens += out.new_token_ids
        return tokens

    async def scenario():
        results = await asyncio.gather(*(collect(f"r{i}") for i in range(4)))
        stream = engine.generate("long", "import sys", SamplingParams(max_tokens=500, temperature=0,
                                                                     ignore_eos=True))
        await stream.__anext__()
        await stream.aclose()                            # the client went away
        with pytest.raises(RequestError, match="empty"):
            await _first(engine.generate("bad", "", params))
        for _ in range(200):
            if engine.num_requests == 0 and engine.stats().num_running == 0:
                break
            await asyncio.sleep(0.01)
        return results

    try:
        results = asyncio.run(scenario())
        assert all(r == results[0] for r in results) and len(results[0]) == 8
        stats = engine.stats()
        assert stats.num_running == stats.num_waiting == 0 and stats.kv_usage == 0.0
    finally:
        engine.shutdown()


async def _first(agen):
    return await agen.__anext__()
