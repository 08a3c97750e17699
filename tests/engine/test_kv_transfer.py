"""The prefill/decode split inside the engine: a prefill-only request pins its KV, a second engine
receives it (skipping blocks its prefix cache holds) and decodes — greedy tokens identical to one
engine doing everything; pins are released or expire; the pool adds up throughout."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor.engine.config import EngineConfig
from mindmotor.engine.llm_engine import LLMEngine
from mindmotor.engine.sampling_params import SamplingParams
from mindmotor.engine.sequence import SequenceStatus

BLOCK = 4
GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engines(tiny_ckpt):
    def make(**options) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(tiny_ckpt), block_size=BLOCK, num_blocks=64, **options))
    return make


def run(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        engine.check_invariants()
    return tokens


def prefill(engine: LLMEngine, rid: str, prompt: list[int], max_tokens: int, sampling=GREEDY):
    engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, **sampling), prefill_only=True)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    (out,) = outs
    return out


def transfer(prefill_engine: LLMEngine, decode_engine: LLMEngine, rid: str, prompt: list[int],
             max_tokens: int, sampling=GREEDY) -> tuple[list[int], int]:
    """Prefill on one engine, pull (minus the decode side's cached blocks), decode on the other."""
    first = prefill(prefill_engine, rid, prompt, max_tokens, sampling)
    assert first.finish_reason == "prefilled" and len(first.new_token_ids) == 1
    params = SamplingParams(max_tokens=max_tokens, **sampling)
    skip = decode_engine.add_prefilled(rid, decode_engine.validate(prompt, params), first.new_token_ids[0],
                                       sent_chars=len(first.new_text))
    assert skip is not None
    kv = prefill_engine.read_pinned_kv(rid, skip)
    assert decode_engine.commit_kv(rid, kv)
    assert prefill_engine.release_kv(rid)
    prefill_engine.check_invariants()
    return first.new_token_ids + run(decode_engine)[rid], skip


def prompts(n: int, length: int, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 300, length + 3 * i).tolist() for i in range(n)]


def test_split_greedy_equals_one_engine(engines):
    mixed, p, d = engines(), engines(), engines()
    for i, prompt in enumerate(prompts(4, 13)):         # 13, 16, 19, 22 tokens: partial and full last blocks
        mixed.add_request(f"m{i}", prompt, SamplingParams(max_tokens=12, **GREEDY))
    expected = run(mixed)
    for i, prompt in enumerate(prompts(4, 13)):
        tokens, _ = transfer(p, d, f"s{i}", prompt, 12)
        assert tokens == expected[f"m{i}"]
    assert p.stats().num_pinned == 0 and d.stats().num_receiving == 0
    p.check_invariants()
    d.check_invariants()


def test_split_seeded_sampling_equals_one_engine(engines):
    """The decode side continues the request's seeded generator where the prefill side left it."""
    seeded = dict(temperature=1.0, top_p=0.9, seed=11, ignore_eos=True)
    mixed, p, d = engines(), engines(), engines()
    prompt = prompts(1, 14)[0]
    mixed.add_request("m", prompt, SamplingParams(max_tokens=16, **seeded))
    expected = run(mixed)["m"]
    tokens, _ = transfer(p, d, "s", prompt, 16, seeded)
    assert tokens == expected
    unseeded_repeat = dict(seeded, seed=12)
    assert transfer(engines(), engines(), "t", prompt, 16, unseeded_repeat)[0] != expected


def test_decode_side_prefix_hits_skip_blocks(engines):
    p, d = engines(), engines()
    shared = prompts(1, 16)[0]                                     # 4 full blocks
    tokens_a, skip_a = transfer(p, d, "a", shared + [5, 6, 7], 8)
    tokens_b, skip_b = transfer(p, d, "b", shared + [9, 10], 8)
    assert skip_a == 0 and skip_b == 4                             # b's shared blocks are already on d
    mixed = engines()
    mixed.add_request("b", shared + [9, 10], SamplingParams(max_tokens=8, **GREEDY))
    assert tokens_b == run(mixed)["b"]


def test_local_prefill_fallback_continues_after_first_token(engines):
    p, d, mixed = engines(), engines(), engines()
    prompt = prompts(1, 21)[0]
    mixed.add_request("r", prompt, SamplingParams(max_tokens=10, **GREEDY))
    expected = run(mixed)["r"]
    first = prefill(p, "r", prompt, 10)
    params = SamplingParams(max_tokens=10, **GREEDY)
    assert d.add_prefilled("r", d.validate(prompt, params), first.new_token_ids[0]) is not None
    assert d.prefill_locally("r")                                   # the pull failed
    assert first.new_token_ids + run(d)["r"] == expected


def test_first_token_that_finishes_does_not_pin(engines):
    p = engines()
    out = prefill(p, "one", prompts(1, 9)[0], 1)
    assert out.finish_reason == "length" and p.stats().num_pinned == 0
    with pytest.raises(KeyError):
        p.read_pinned_kv("one")


def test_pins_expire_and_aborts_free_everything(engines):
    p = engines(kv_pin_ttl_s=5.0)
    now = [100.0]
    p.pins.clock = lambda: now[0]
    prefill(p, "x", prompts(1, 10)[0], 5)
    assert p.stats().num_pinned_blocks == 3
    p.check_invariants()
    assert p.expire_pins() == 0
    now[0] += 5.0
    assert p.expire_pins() == 1 and p.stats().num_pinned == 0
    assert not p.release_kv("x")
    prefill(p, "y", prompts(1, 10)[0], 5)
    p.abort_request("y")                                            # the caller went away
    assert p.stats().num_pinned == 0
    d = engines()
    params = SamplingParams(max_tokens=5, **GREEDY)
    assert d.add_prefilled("z", d.validate(prompts(1, 10)[0], params), 7) is not None
    d.check_invariants()
    out = d.abort_request("z")
    assert out.finish_reason == SequenceStatus.FINISHED_ABORTED.value
    d.check_invariants()
    assert d.block_manager.num_free_blocks == d.block_manager.num_blocks
    assert p.block_manager.num_free_blocks == p.block_manager.num_blocks
