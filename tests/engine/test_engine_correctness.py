"""Greedy output of the full engine (paged, batched, chunked prefill, preemption, prefix-cache hits)
equals a plain reference loop that recomputes the whole sequence without any cache."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor import LLM, SamplingParams
from mindmotor.model.llama import LlamaModel


def reference_greedy(model: LlamaModel, prompt: list[int], n: int) -> list[int]:
    ids, out = list(prompt), []
    for _ in range(n):
        token = int(model.forward_dense(ids)[-1].argmax())
        out.append(token)
        ids.append(token)
    return out


def prompts_with_shared_prefixes(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    system = list(rng.integers(0, vocab, 24))            # shared by several prompts: prefix-cache hits
    lengths = [3, 17, 40, 9, 31, 1, 22, 55]
    prompts = [list(rng.integers(0, vocab, n)) for n in lengths]
    prompts += [system + list(rng.integers(0, vocab, n)) for n in (5, 12, 1)]
    prompts += [system + prompts[2]]
    return prompts


@pytest.mark.parametrize("options", [
    dict(),                                                   # roomy pool, one big batch
    dict(num_blocks=20, max_num_batched_tokens=24),           # tiny pool: preemption; small budget: chunks
    dict(num_blocks=20, max_num_batched_tokens=64, max_num_seqs=3, enable_prefix_caching=False),
    dict(num_blocks=40, max_num_batched_tokens=80, enable_chunked_prefill=False, max_model_len=80),
    # fair prefill: chunks capped at 5 tokens and 60 query-key pairs (1 token deep in a prompt),
    # decodes first, one partial prefill at a time
    dict(max_num_batched_tokens=32, long_prefill_token_threshold=5, max_num_batched_attention=60),
])
@pytest.mark.parametrize("fixture", ["tiny_ckpt", "tiny_qwen2_ckpt"])
def test_engine_greedy_equals_reference(request, fixture, options):
    llm = LLM(model=str(request.getfixturevalue(fixture)), block_size=4, **options)
    prompts = prompts_with_shared_prefixes(llm.engine.model.config.vocab_size)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == reference_greedy(llm.engine.model, prompt, 12)
        assert out.finish_reason == "length"
    llm.engine.check_invariants()
    stats = llm.engine.stats()
    assert stats.num_running == stats.num_waiting == 0
    if options.get("num_blocks") == 20 and options.get("max_num_batched_tokens") == 24:
        assert stats.num_preemptions > 0, "the tiny pool was meant to force preemption"


def test_prefix_cache_is_hit_for_a_repeated_prompt(tiny_ckpt):
    llm = LLM(model=str(tiny_ckpt), block_size=4)
    prompt = list(range(1, 30))
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    first = llm.generate([prompt], params)[0]
    second = llm.generate([prompt], params)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 28                    # 7 full blocks; the last token is recomputed
    assert first.token_ids == second.token_ids


def test_host_kv_memory_follows_tokens_held_not_emulated_capacity(tiny_ckpt):
    """A small model with the KV capacity of Qwen2-7B on a 64 GiB 910B3 allocates host memory only
    for the blocks it hands out."""
    llm = LLM(model=str(tiny_ckpt), device="910B3", emulate="qwen2-7b")
    engine = llm.engine
    assert engine.block_manager.num_blocks == engine.device.kv_plan.num_blocks > 35_000   # after MindIE's 3 GB runtime rule
    llm.generate([list(range(1, 200))] * 4, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert engine.block_manager.watermark < 64
    assert engine.kv_cache.host_bytes < 8 * 2**20
