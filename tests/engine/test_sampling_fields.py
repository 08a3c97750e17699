"""vLLM's extra sampling fields through the engine, each checked against what it must do to the
output: min_p, repetition_penalty, logit_bias, allowed_token_ids, bad_words (greedy runs compared
with a dense reference that applies the same rule by hand)."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor import LLM, SamplingParams
from mindmotor.engine.llm_engine import RequestError

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(model=str(tiny_ckpt), block_size=4)


def greedy(llm, **kwargs) -> list[int]:
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, **kwargs)
    return llm.generate([PROMPT], params)[0].token_ids


def reference(llm, shape, n: int = 12) -> list[int]:
    """Greedy decoding on the dense model with `shape(logits, ids_so_far, output)` applied."""
    model, ids = llm.engine.model, llm.engine.tokenizer.encode(PROMPT)
    out: list[int] = []
    for _ in range(n):
        logits = model.forward_dense(ids + out)[-1].astype(np.float64)
        token = int(shape(logits, ids + out, out).argmax())
        out.append(token)
    return out


@pytest.mark.parametrize("kwargs, param", [
    (dict(min_p=1.5), "min_p"), (dict(min_p=-0.1), "min_p"), (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=2.5), "repetition_penalty"), (dict(logit_bias={"x": 1.0}), "logit_bias"),
    (dict(logit_bias={3: 101.0}), "logit_bias"), (dict(logit_bias={3: float("nan")}), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"), (dict(allowed_token_ids=[-1]), "allowed_token_ids"),
    (dict(bad_words=[""]), "bad_words"), (dict(bad_words=["\ud800"]), "bad_words"),
])
def test_bad_values_are_refused_naming_the_field(kwargs, param):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param


def test_token_ids_outside_the_vocabulary_are_refused(llm):
    vocab = llm.engine.model.config.vocab_size
    for kwargs, param in ((dict(logit_bias={vocab: 1.0}), "logit_bias"), (dict(allowed_token_ids=[vocab]),
                                                                           "allowed_token_ids")):
        with pytest.raises(RequestError) as info:
            llm.engine.validate([1, 2], SamplingParams(**kwargs))
        assert info.value.param == param


def test_repetition_penalty_equals_the_reference(llm):
    def penalize(logits, seen, out):
        ids = np.unique(seen)
        logits[ids] = np.where(logits[ids] > 0, logits[ids] / 1.8, logits[ids] * 1.8)
        return logits
    got = greedy(llm, repetition_penalty=1.8)
    assert got == reference(llm, penalize)
    assert got != greedy(llm)


def test_logit_bias_equals_the_reference(llm):
    plain = greedy(llm)
    bias = {plain[0]: -100.0, 7: 2.5}
    def shape(logits, seen, out):
        logits[plain[0]] -= 100.0
        logits[7] += 2.5
        return logits
    got = greedy(llm, logit_bias=bias)
    assert got == reference(llm, shape)
    assert plain[0] not in got
    assert set(greedy(llm, logit_bias={11: 100.0})) == {11}


def test_allowed_token_ids_confine_greedy_and_sampled_output(llm):
    allowed = [5, 9, 40, 41, 300]
    assert set(greedy(llm, allowed_token_ids=allowed)) <= set(allowed)
    sampled = llm.generate([PROMPT] * 4, SamplingParams(max_tokens=20, temperature=1.0, seed=3, ignore_eos=True,
                                                        allowed_token_ids=allowed))
    assert all(set(o.token_ids) <= set(allowed) for o in sampled)
    assert len({t for o in sampled for t in o.token_ids}) > 1


def test_bad_words_never_appear(llm):
    tok = llm.engine.tokenizer
    plain = greedy(llm)
    word = tok.decode(plain[2:4])                 # a two-token piece of the greedy output
    words = [tok.encode(w) for w in (word, " " + word.lstrip(" "))]
    got = greedy(llm, bad_words=[word])
    for ids in words:
        assert not any(got[i:i + len(ids)] == ids for i in range(len(got)))
    assert got[:3] == plain[:3] and got != plain    # only the word's last token was blocked


def test_min_p_keeps_only_likely_tokens(llm):
    """With min_p near 1 only the most likely token survives: sampling equals greedy decoding."""
    sampled = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True,
                                                    min_p=0.999))[0].token_ids
    assert sampled == greedy(llm)
    free = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.0, seed=5,
                                                 ignore_eos=True))[0].token_ids
    assert free != sampled
