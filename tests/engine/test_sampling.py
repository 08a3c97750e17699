"""Sampling options end to end through the engine, and SamplingParams validation."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor import LLM, SamplingParams
from mindmotor.engine.llm_engine import RequestError
from mindmotor.engine.sampler import log_softmax


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(model=str(tiny_ckpt), block_size=4)


PROMPT = "def add(a, b):\n    return"


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=2.5), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(max_tokens=0), "max_tokens"), (dict(presence_penalty=3), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"), (dict(min_tokens=5, max_tokens=2), "min_tokens"),
    (dict(logprobs=21), "logprobs"), (dict(stop=[""]), "stop"),
])
def test_out_of_range_values_are_refused_with_the_field_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_request_errors(llm):
    engine = llm.engine
    with pytest.raises(RequestError, match="empty"):
        engine.validate("", SamplingParams())
    with pytest.raises(RequestError, match="maximum context length"):
        engine.validate([1] * engine.max_model_len, SamplingParams())
    with pytest.raises(RequestError, match="requested"):
        engine.validate([1, 2], SamplingParams(max_tokens=engine.max_model_len))
    with pytest.raises(RequestError, match="stop_token_ids"):
        engine.validate([1, 2], SamplingParams(stop_token_ids=[10**6]))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.validate([1, -3], SamplingParams())
    params = engine.validate([1, 2], SamplingParams(max_tokens=None)).params
    assert params.max_tokens == engine.max_model_len - 2


def test_seed_reproduces_regardless_of_batch(llm):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    alone = llm.generate([PROMPT], params)[0].token_ids
    others = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    batched = llm.generate(["x = 1", PROMPT, "import os"], [others, params, others])[1].token_ids
    assert alone == batched
    different = llm.generate([PROMPT], SamplingParams(max_tokens=16, temperature=1.0, seed=99,
                                                      ignore_eos=True))[0].token_ids
    assert different != alone


def test_top_k_1_and_tiny_top_p_are_greedy(llm):
    greedy = llm.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0].token_ids
    for params in (SamplingParams(max_tokens=10, temperature=1.5, top_k=1, ignore_eos=True),
                   SamplingParams(max_tokens=10, temperature=1.0, top_p=1e-6, ignore_eos=True, seed=3)):
        assert llm.generate([PROMPT], params)[0].token_ids == greedy


def test_top_k_restricts_to_the_k_most_likely(llm):
    engine = llm.engine
    prompt_ids = engine.tokenizer.encode(PROMPT)
    top3 = set(np.argsort(-engine.model.forward_dense(prompt_ids)[-1])[:3].tolist())
    firsts = {llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=2.0, top_k=3, seed=s))[0]
              .token_ids[0] for s in range(30)}
    assert firsts <= top3 and len(firsts) > 1


def test_frequency_penalty_breaks_repetition(llm):
    plain = llm.generate([PROMPT], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0]
    penalized = llm.generate([PROMPT], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True,
                                                      frequency_penalty=2.0, presence_penalty=2.0))[0]
    assert len(set(penalized.token_ids)) > len(set(plain.token_ids))


def test_stop_token_ids_and_eos(llm):
    base = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].token_ids
    stop_at = base[5]
    first = base.index(stop_at)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop_at]))[0]
    assert out.token_ids == base[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    # min_tokens masks stop tokens until enough have been produced
    later = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop_at],
                                                  min_tokens=first + 2))[0]
    assert stop_at not in later.token_ids[:first + 2]


def test_eos_ends_unless_ignored(llm, tiny_ckpt, tmp_path):
    import json
    import shutil

    base = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].token_ids
    eos = base[4]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["eos_token_id"] = [config["eos_token_id"], eos]      # a token this model produces
    (ckpt / "config.json").write_text(json.dumps(config))
    llm2 = LLM(model=str(ckpt), block_size=4)
    greedy = SamplingParams(max_tokens=12, temperature=0)
    out = llm2.generate([PROMPT], greedy)[0]
    assert out.token_ids == base[:base.index(eos) + 1]
    assert out.finish_reason == "stop" and out.stop_reason is None
    ignored = llm2.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert ignored.token_ids == base and ignored.finish_reason == "length"
    held = llm2.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, min_tokens=12))[0]
    assert eos not in held.token_ids and len(held.token_ids) == 12


def test_stop_string_truncates_and_is_never_streamed(llm):
    base = llm.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    text = base.text
    stop = text[8:11]
    assert len(stop) == 3
    cut = text.find(stop)
    engine = llm.engine
    engine.add_request("s", PROMPT, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[stop]))
    streamed, final = "", None
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed += out.new_text
            final = out
    assert streamed == text[:cut]
    assert final.finish_reason == "stop" and final.stop_reason == stop
    inc = llm.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[stop],
                                                include_stop_str_in_output=True))[0]
    assert inc.text == text[:cut] + stop


def test_logprobs_are_those_of_the_model(llm):
    engine = llm.engine
    out = llm.generate([PROMPT], SamplingParams(max_tokens=3, temperature=0, logprobs=5, ignore_eos=True))[0]
    ids = engine.tokenizer.encode(PROMPT)
    for lp, token in zip(out.logprobs, out.token_ids):
        expected = log_softmax(engine.model.forward_dense(ids)[-1].astype(np.float64))
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(expected[token], abs=1e-4)
        assert [t for t, _ in lp.top] == np.argsort(-expected)[:5].tolist()
        assert lp.top[0][0] == token                 # greedy: the chosen token is the most likely
        ids.append(token)


def test_unseeded_requests_draw_fresh_entropy_on_every_engine(tiny_ckpt, llm):
    """Two engines (two workers) built alike give different text for the same unseeded request; an
    engine given `seed` is reproducible; a request's own seed gives the same text on any engine."""
    other = LLM(model=str(tiny_ckpt), block_size=4)
    unseeded = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    assert llm.generate([PROMPT], unseeded)[0].token_ids != other.generate([PROMPT], unseeded)[0].token_ids
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=77, ignore_eos=True)
    assert llm.generate([PROMPT], seeded)[0].token_ids == other.generate([PROMPT], seeded)[0].token_ids
    runs = [LLM(model=str(tiny_ckpt), block_size=4, seed=5).generate([PROMPT] * 2, unseeded) for _ in range(2)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    assert runs[0][0].token_ids != runs[0][1].token_ids
