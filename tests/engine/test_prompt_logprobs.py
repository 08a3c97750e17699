"""prompt_logprobs: the logprob of every prompt token after the first, from the prefill — equal
to the dense reference model's, with chunked prefill, prefix-cache hits (recomputed), batching
and preemption; each entry carries the token's rank and the top alternatives."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor import LLM, SamplingParams
from mindmotor.engine.sampler import log_softmax


def reference(model, prompt: list[int]) -> np.ndarray:
    """logprob of prompt[i + 1] given prompt[:i + 1], by the dense model (no cache)."""
    lp = log_softmax(model.forward_dense(prompt).astype(np.float64))
    return np.array([lp[i, prompt[i + 1]] for i in range(len(prompt) - 1)])


def prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(3)
    shared = list(rng.integers(0, vocab, 20))
    return [shared + list(rng.integers(0, vocab, n)) for n in (1, 9, 30)] + [list(rng.integers(0, vocab, 45))]


@pytest.mark.parametrize("options", [
    dict(block_size=4),
    dict(block_size=4, max_num_batched_tokens=16, enable_chunked_prefill=True),
    dict(block_size=4, long_prefill_token_threshold=6, max_num_batched_attention=80),   # small, 1-token chunks
    dict(block_size=4, num_blocks=20, max_num_seqs=4),       # a small pool: preemption by recompute
])
def test_prompt_logprobs_equal_the_dense_reference(tiny_ckpt, options):
    llm = LLM(model=str(tiny_ckpt), **options)
    ps = prompts(llm.engine.model.config.vocab_size)
    llm.generate(ps[:1], SamplingParams(max_tokens=1))        # its blocks are now in the prefix cache
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    outs = llm.generate(ps, params)
    assert outs[0].num_cached_tokens == 0                     # the cached prefix was recomputed
    if "num_blocks" in options:
        assert llm.engine.scheduler.num_preemptions > 0
    for prompt, out in zip(ps, outs):
        got = out.prompt_logprobs
        assert [e.token_id for e in got] == prompt[1:]
        np.testing.assert_allclose([e.logprob for e in got], reference(llm.engine.model, prompt), atol=1e-4)
        for e in got:
            assert len(e.top) == 3 and e.top[0][1] >= e.top[-1][1]
            assert e.rank == 1 + sum(1 for _, v in e.top if v > e.logprob) or e.rank > 3
            assert (e.rank == 1) == (e.top[0][0] == e.token_id)


def test_only_asked_for_and_generation_unchanged(tiny_ckpt):
    llm = LLM(model=str(tiny_ckpt), block_size=4)
    prompt = prompts(llm.engine.model.config.vocab_size)[2]
    plain = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    scored = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True,
                                                   prompt_logprobs=0))[0]
    assert plain.prompt_logprobs is None and scored.token_ids == plain.token_ids
    assert len(scored.prompt_logprobs) == len(prompt) - 1 and all(e.top == [] for e in scored.prompt_logprobs)
    one = llm.generate([[5]], SamplingParams(max_tokens=2, prompt_logprobs=1))[0]
    assert one.prompt_logprobs == []                          # a single prompt token has nothing before it
