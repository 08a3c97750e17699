"""The decodes' K/V workspace (model/decode_kv.py) changes nothing but the cost: an engine with it
and one that gathers from the paged cache every step produce the same tokens and the same logprobs,
bit for bit, while sequences join, finish, are preempted and outgrow the rows."""

from __future__ import annotations

import numpy as np

from mindmotor import SamplingParams
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.llm_engine import LLMEngine


def _run(ckpt, use_workspace: bool, num_blocks: int | None = None, every: int = 3):
    engine = LLMEngine(EngineConfig(model=str(ckpt), block_size=4, seed=3, num_blocks=num_blocks))
    if not use_workspace:
        engine.runner.decode_kv.max_bytes = 0        # every step gathers from the paged cache
    vocab = engine.model.config.vocab_size
    rng = np.random.default_rng(0)
    outputs, step = [], 0
    pending = [(i, rng.integers(3, vocab, 5 + 3 * i).tolist(), 6 + 7 * (i % 4)) for i in range(10)]
    while pending or engine.has_unfinished_requests():
        if pending and step % every == 0:                # arrivals while others decode
            i, prompt, max_tokens = pending.pop(0)
            engine.add_request(f"r{i}", prompt, SamplingParams(
                max_tokens=max_tokens, temperature=0.0 if i % 2 else 0.9, seed=i, logprobs=2, ignore_eos=True))
        for o in engine.step():
            outputs.append((step, o.request_id, o.new_token_ids, o.finished,
                            [(lp.token_id, lp.logprob, lp.top) for lp in o.new_logprobs]))
        step += 1
    return outputs, engine


def test_workspace_is_bit_identical_to_the_gather(tiny_ckpt):
    with_ws, engine = _run(tiny_ckpt, True)
    without, other = _run(tiny_ckpt, False)
    assert with_ws == without
    dk = engine.runner.decode_kv
    assert dk.reuses > 0 and dk.rebuilds > 0          # both paths of the workspace ran
    assert other.runner.decode_kv.reuses == 0


def test_workspace_under_preemption(tiny_ckpt):
    with_ws, engine = _run(tiny_ckpt, True, num_blocks=24, every=1)
    without, _ = _run(tiny_ckpt, False, num_blocks=24, every=1)
    assert engine.scheduler.num_preemptions > 0
    assert with_ws == without
