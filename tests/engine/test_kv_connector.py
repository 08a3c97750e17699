"""The prefill/decode split inside the engine, through the KV connector's scheduler side: a
prefill-only request pins its KV; on a second engine a continuation with a KV source is admitted
in its turn (blocks for its prompt, skipping those its prefix cache holds), waits in
WAITING_FOR_KV — not finished, not running — until `finish_kv_load`, and decodes: greedy and
seeded tokens identical to one engine doing everything, and to a migrated (KV-less) continuation;
pins are released or expire; the pool adds up throughout, counting every holder."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor.engine.config import EngineConfig
from mindmotor.engine.continuation import Continuation, KVSource
from mindmotor.engine.kv_connector import KVBlocks
from mindmotor.engine.llm_engine import LLMEngine, RequestError
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.engine.sequence import SequenceStatus

BLOCK = 4
GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engines(tiny_ckpt):
    def make(**options) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(tiny_ckpt), block_size=BLOCK, **{"num_blocks": 64, **options}))
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


def continue_with_kv(engine: LLMEngine, rid: str, prompt: list[int], first, params: SamplingParams):
    """Add the decode half: a continuation of `first` whose prompt KV is pinned under `rid`; one
    step admits it (and computes nothing for it); returns its one KV load."""
    cont = Continuation((first.new_token_ids[0],), len(first.new_text), KVSource("prefill:1", rid))
    seq = engine.add_request(rid, prompt, params, continuation=cont)
    assert engine.step() == [] and seq.status == SequenceStatus.WAITING_FOR_KV
    assert not seq.status.finished and not engine.has_unfinished_requests()
    engine.check_invariants()                                       # its blocks are counted
    (load,) = engine.take_kv_loads()
    assert (load.request_id, load.source) == (rid, cont.kv_source)
    assert engine.stats().num_receiving == 1 and engine.step() == []   # it waits
    return load


def transfer(prefill_engine: LLMEngine, decode_engine: LLMEngine, rid: str, prompt: list[int],
             max_tokens: int, sampling=GREEDY) -> tuple[list[int], int]:
    """Prefill on one engine, pull (minus the decode side's cached blocks), decode on the other."""
    first = prefill(prefill_engine, rid, prompt, max_tokens, sampling)
    assert first.finish_reason == "prefilled" and len(first.new_token_ids) == 1
    params = SamplingParams(max_tokens=max_tokens, **sampling)
    load = continue_with_kv(decode_engine, rid, prompt, first, params)
    kv = prefill_engine.read_pinned_kv(rid, load.skip_blocks)
    assert decode_engine.finish_kv_load(rid, kv)
    assert prefill_engine.release_kv(rid)
    prefill_engine.check_invariants()
    return first.new_token_ids + run(decode_engine)[rid], load.skip_blocks


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


def test_a_migrated_continuation_and_a_kv_continuation_draw_alike(engines):
    """One mechanism: the same continuation without a KV source (a migration, recomputed here)
    gives the seeded tokens the KV continuation gives."""
    seeded = dict(temperature=0.9, top_p=0.95, seed=5, presence_penalty=0.3, ignore_eos=True)
    prompt = prompts(1, 15)[0]
    with_kv, _ = transfer(engines(), engines(), "k", prompt, 14, seeded)
    first = prefill(engines(), "m", prompt, 14, seeded)
    moved = engines()
    moved.add_request("m", prompt, SamplingParams(max_tokens=14, **seeded),
                      continuation=Continuation(tuple(first.new_token_ids), len(first.new_text)))
    assert first.new_token_ids + run(moved)["m"] == with_kv


def test_decode_side_prefix_hits_skip_blocks(engines):
    p, d = engines(), engines()
    shared = prompts(1, 16)[0]                                     # 4 full blocks
    tokens_a, skip_a = transfer(p, d, "a", shared + [5, 6, 7], 8)
    tokens_b, skip_b = transfer(p, d, "b", shared + [9, 10], 8)
    assert skip_a == 0 and skip_b == 4                             # b's shared blocks are already on d
    mixed = engines()
    mixed.add_request("b", shared + [9, 10], SamplingParams(max_tokens=8, **GREEDY))
    assert tokens_b == run(mixed)["b"]


def test_a_failed_load_is_recomputed_after_the_first_token(engines):
    p, d, mixed = engines(), engines(), engines()
    prompt = prompts(1, 21)[0]
    mixed.add_request("r", prompt, SamplingParams(max_tokens=10, **GREEDY))
    expected = run(mixed)["r"]
    first = prefill(p, "r", prompt, 10)
    continue_with_kv(d, "r", prompt, first, SamplingParams(max_tokens=10, **GREEDY))
    assert d.finish_kv_load("r", None)                              # the pull failed
    assert d.stats().num_receiving == 0 and d.has_unfinished_requests()
    assert first.new_token_ids + run(d)["r"] == expected


def test_a_load_that_does_not_fit_its_blocks_changes_nothing(engines):
    p, d = engines(), engines()
    prompt = prompts(1, 13)[0]
    first = prefill(p, "r", prompt, 6)
    load = continue_with_kv(d, "r", prompt, first, SamplingParams(max_tokens=6, **GREEDY))
    good = p.read_pinned_kv("r", load.skip_blocks)
    wrong = [KVBlocks(good.first_block, good.k[:, :-1], good.v[:, :-1]),          # one block short
             KVBlocks(good.first_block, good.k[:1], good.v[:1]),                  # one layer only
             KVBlocks(good.first_block, good.k.astype(np.float16), good.v.astype(np.float16)),
             KVBlocks(good.first_block + 1, good.k, good.v)]                      # from another block
    for kv in wrong:
        with pytest.raises(ValueError, match="KV blocks"):
            d.finish_kv_load("r", kv)
    assert d.stats().num_receiving == 1                             # still waiting: the caller falls back
    assert d.finish_kv_load("r", None) and len(run(d)["r"]) == 5


def test_a_kv_continuation_waits_for_room_in_its_turn(engines):
    """No room for the prompt's blocks: the continuation waits in the queue (no load started)
    until a finishing request frees blocks; then it is admitted and loads."""
    p, d = engines(), engines(num_blocks=8)                         # 8 blocks of 4 tokens
    d.add_request("big", prompts(1, 20)[0], SamplingParams(max_tokens=8, **GREEDY))   # 7 blocks at its end
    d.step()
    prompt = prompts(1, 13, seed=9)[0]                              # 4 blocks
    first = prefill(p, "c", prompt, 6)
    d.add_request("c", prompt, SamplingParams(max_tokens=6, **GREEDY),
                  continuation=Continuation((first.new_token_ids[0],), 0, KVSource("p:1", "c")))
    loads = []
    while not loads:
        d.step()
        loads = d.take_kv_loads()
        d.check_invariants()
        if not loads:
            assert d.requests["c"].status == SequenceStatus.WAITING
    assert "big" not in d.requests                                  # admitted once big finished
    assert d.finish_kv_load("c", p.read_pinned_kv("c", loads[0].skip_blocks))
    assert len(run(d)["c"]) == 5


@pytest.mark.parametrize("cont, message", [
    (Continuation((), 0, KVSource("p:1", "h")), "first token"),
    (Continuation((5,) * 6, 0), "max_tokens"),
    (Continuation((5, 6), 10_000), "sent_chars"),
    (Continuation((10**6,), 0), "vocabulary"),
])
def test_a_continuation_that_cannot_be_is_refused(engines, cont, message):
    d = engines()
    with pytest.raises(RequestError, match=message) as refused:
        d.validate(prompts(1, 9)[0], SamplingParams(max_tokens=6), cont)
    assert refused.value.param == "continuation"
    with pytest.raises(RequestError, match="prefill-only"):
        d.add_request("x", prompts(1, 9)[0], SamplingParams(max_tokens=6),
                      continuation=Continuation((5,), 0), prefill_only=True)
    assert not d.requests and d.block_manager.num_free_blocks == d.block_manager.num_blocks


def test_first_token_that_finishes_does_not_pin(engines):
    p = engines()
    out = prefill(p, "one", prompts(1, 9)[0], 1)
    assert out.finish_reason == "length" and p.stats().num_pinned == 0
    with pytest.raises(KeyError):
        p.read_pinned_kv("one")


def test_pins_expire_and_aborts_free_everything(engines):
    p = engines(kv_pin_ttl_s=5.0)
    now = [100.0]
    p.scheduler.kv.clock = lambda: now[0]
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
    d.add_request("z", prompts(1, 10)[0], params, continuation=Continuation((7,), 0, KVSource("p:1", "z")))
    d.step()
    assert d.stats().num_receiving == 1
    d.check_invariants()
    out = d.abort_request("z")                                      # aborted while waiting for its KV
    assert out.finish_reason == SequenceStatus.FINISHED_ABORTED.value
    assert not d.finish_kv_load("z", None) and d.take_kv_loads() == []
    d.check_invariants()
    assert d.block_manager.num_free_blocks == d.block_manager.num_blocks
    assert p.block_manager.num_free_blocks == p.block_manager.num_blocks


def test_continuations_waiting_for_kv_count_against_max_num_seqs(engines):
    """max_num_seqs 2: two KV continuations admitted and loading fill it; a third waits (no load
    started) until one of them finishes."""
    p, d = engines(), engines(max_num_seqs=2)
    params = SamplingParams(max_tokens=3, **GREEDY)
    firsts = {}
    for rid, prompt in zip("abc", prompts(3, 9)):
        firsts[rid] = prefill(p, rid, prompt, 3)
        d.add_request(rid, prompt, params, continuation=Continuation(
            (firsts[rid].new_token_ids[0],), 0, KVSource("p:1", rid)))
    d.step()
    loads = d.take_kv_loads()
    assert sorted(load.request_id for load in loads) == ["a", "b"] and d.requests["c"].status == SequenceStatus.WAITING
    for load in loads:
        assert d.finish_kv_load(load.request_id, p.read_pinned_kv(load.request_id, load.skip_blocks))
    started = []
    while d.has_unfinished_requests():
        d.step()
        started += d.take_kv_loads()
        d.check_invariants()
        if started:
            break
    assert [load.request_id for load in started] == ["c"]
