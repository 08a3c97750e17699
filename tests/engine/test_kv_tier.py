"""The KV host tier (engine/kv_tier.py): greedy output is the same with and without it — after
forced HBM eviction, with blocks evicted from the tier mid-load, with a failing copy — and its host
memory never exceeds its budget."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mindmotor.engine.config import EngineConfig
from mindmotor.engine.llm_engine import LLMEngine
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.vocabulary import SequenceStatus

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(engine: LLMEngine, clock: Clock, on_step=None) -> dict[str, list[int]]:
    """Step to completion on the emulated clock (it jumps to a host-tier load's end when nothing
    else can run). {request id: output token ids}."""
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
        if on_step is not None:
            on_step(engine)
        clock.now += engine.last_step_s
        if engine.last_step_s == 0.0:
            ready = engine.next_kv_ready_at()
            assert ready is not None, "the engine has unfinished requests but nothing can run"
            clock.now = max(clock.now, ready)
    engine.check_invariants()
    return outputs


def sessions(engine: LLMEngine, clock: Clock, num_sessions: int = 5, turns: int = 4, seed: int = 3,
             on_step=None) -> dict[str, list[int]]:
    """Multi-turn chat: each turn's prompt is the last turn's prompt and answer plus new user tokens."""
    rng = np.random.default_rng(seed)
    vocab = engine.vocab_size
    prompts = [list(rng.integers(1, vocab, 12)) for _ in range(num_sessions)]
    got: dict[str, list[int]] = {}
    for turn in range(turns):
        for s in range(num_sessions):
            engine.add_request(f"s{s}-t{turn}", prompts[s], GREEDY)
        outs = run(engine, clock, on_step)
        got.update(outs)
        for s in range(num_sessions):
            prompts[s] = prompts[s] + outs[f"s{s}-t{turn}"] + list(rng.integers(1, vocab, int(rng.integers(3, 9))))
    return got


def engine(ckpt, clock: Clock, **options) -> LLMEngine:
    defaults = dict(model=str(ckpt), block_size=4, num_blocks=24, max_num_batched_tokens=64)
    return LLMEngine(EngineConfig(**{**defaults, **options}), clock=clock)


@pytest.fixture(scope="module")
def reference(tiny_ckpt):
    """The outputs with a roomy pool (no eviction at all)."""
    clock = Clock()
    return sessions(engine(tiny_ckpt, clock, num_blocks=400), clock)


def test_outputs_identical_with_the_host_tier_after_forced_eviction(tiny_ckpt, reference):
    clock = Clock()
    hbm_only = engine(tiny_ckpt, clock)
    without = sessions(hbm_only, clock)
    clock = Clock()
    eng = engine(tiny_ckpt, clock, kv_host_bytes=2**20, cache_chunk_size=4096)
    with_tier = sessions(eng, clock, on_step=lambda e: e.kv_tier.check())
    assert with_tier == without == reference
    stats = eng.kv_tier.stats
    assert eng.block_manager.evictions > 0 and stats.blocks_stored > 0
    assert stats.loads > 0 and stats.hits > 0 and stats.bytes_loaded > 0
    assert stats.loads_failed == stats.loads_partial == 0
    # what the tier loaded was not computed again
    assert eng.prompt_tokens < hbm_only.prompt_tokens


def test_blocks_evicted_from_the_tier_mid_load_are_computed(tiny_ckpt, reference):
    clock = Clock()
    eng = engine(tiny_ckpt, clock, kv_host_bytes=2**20, cache_chunk_size=4096)
    cleared = []

    def evict_mid_load(e: LLMEngine) -> None:
        if e.kv_tier.num_loading and len(cleared) < 3:    # a load in flight loses its blocks
            e.kv_tier.clear()
            cleared.append(True)
    assert sessions(eng, clock, on_step=evict_mid_load) == reference
    assert cleared and eng.kv_tier.stats.loads_partial >= len(cleared)


def test_a_failing_load_falls_back_to_computing(tiny_ckpt, reference, monkeypatch):
    clock = Clock()
    eng = engine(tiny_ckpt, clock, kv_host_bytes=2**20, cache_chunk_size=4096)
    write = eng.kv_cache.write_blocks
    failures = []

    def flaky_write(block_ids, k, v):
        if len(failures) < 2:
            failures.append(block_ids)
            write(block_ids[:1], k[:, :1], v[:, :1])      # half-written, then the copy fails
            raise OSError("host link error")
        write(block_ids, k, v)
    monkeypatch.setattr(eng.kv_cache, "write_blocks", flaky_write)
    assert sessions(eng, clock) == reference
    assert len(failures) == 2 and eng.kv_tier.stats.loads_failed == 2


def test_a_request_aborted_while_loading_frees_its_blocks(tiny_ckpt):
    clock = Clock()
    eng = engine(tiny_ckpt, clock, kv_host_bytes=2**20, cache_chunk_size=4096)
    sessions(eng, clock, num_sessions=5, turns=2)
    assert eng.kv_tier.num_blocks > 0
    # the first session's next turn: its prefix was evicted from HBM to the tier
    rng = np.random.default_rng(3)
    prompt = list(rng.integers(1, eng.vocab_size, 12))
    hit = eng.kv_tier.lookup(__import__("mindmotor.common.block_hash", fromlist=["x"]).block_hashes(prompt, 4))
    assert hit > 0
    seq = eng.add_request("again", prompt, GREEDY)
    eng.step()
    assert seq.status == SequenceStatus.WAITING_FOR_KV and eng.kv_tier.num_loading == 1
    eng.abort_request("again")
    clock.now = eng.next_kv_ready_at()
    assert eng.step() == []
    assert eng.kv_tier.num_loading == 0 and not eng.has_unfinished_requests()
    eng.check_invariants()
    assert eng.block_manager.num_used_blocks == 0


def test_the_tier_stays_under_its_byte_budget(tiny_ckpt):
    """Distinct prompts through a tiny HBM pool: every evicted block goes to the tier, which keeps
    its arrays (counted from the arrays themselves) under --kv-host-bytes, evicting whole chunks."""
    budget = 64 * 2**10
    clock = Clock()
    eng = engine(tiny_ckpt, clock, num_blocks=16, kv_host_bytes=budget, cache_chunk_size=2048)
    rss_before = _rss()
    rng = np.random.default_rng(0)
    peak = 0
    for i in range(16):
        eng.add_request(f"r{i}", list(rng.integers(1, eng.vocab_size, 40)), SamplingParams(max_tokens=2))

    def check(e):
        nonlocal peak
        e.kv_tier.check()
        peak = max(peak, e.kv_tier.held_array_bytes())
    run(eng, clock, on_step=check)
    tier = eng.kv_tier
    assert tier.stats.blocks_stored * tier.host_block_bytes > 2 * budget      # it was filled, and more
    assert tier.stats.chunks_evicted > 0
    assert budget - tier.host_block_bytes * tier.blocks_per_chunk < peak <= budget
    if rss_before is not None:            # the process grew by far less than what was stored
        assert _rss() - rss_before < 32 * 2**20


def _rss() -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def test_host_memory_stays_under_the_budget_while_12x_the_budget_goes_through():
    """The tier alone, fed blocks of 128 KiB (K and V): 384 MiB through a 32 MiB budget; the
    process's resident memory grows by the budget at most (plus the allocator's slack)."""
    from mindmotor.engine.kv_tier import HostKVTier, TierConfig
    from mindmotor.model.kv_cache import PagedKVCache

    budget = 32 * 2**20
    cache = PagedKVCache(num_layers=4, num_blocks=1, block_size=16, num_kv_heads=8, head_dim=64, initial_blocks=1)
    tier = HostKVTier(TierConfig(budget, chunk_bytes=2 * 2**20), cache, block_size=16, link_block_bytes=2**17,
                      copy_seconds=lambda nbytes, dmas: 0.0)
    rss_before = _rss()
    peak_rss = 0
    for i in range(3 * 2**10):                         # 3,072 blocks of 128 KiB: 384 MiB
        k = np.full(tier.block_shape, i, dtype=np.float32)
        tier.insert([(i.to_bytes(16, "little"), k, k.copy())])
        if i % 256 == 0:
            tier.check()
            peak_rss = max(peak_rss, _rss() or 0)
    tier.check()
    assert tier.stats.blocks_inserted == 3 * 2**10 and tier.stats.chunks_evicted > 150
    assert budget - 2 * 2**20 <= tier.held_array_bytes() <= budget
    if rss_before is not None:
        assert peak_rss - rss_before < budget + 16 * 2**20, f"RSS grew {(peak_rss - rss_before) / 2**20:.0f} MiB"


def test_a_worker_that_dies_mid_load_loses_nothing(tiny_ckpt, reference):
    """The sessions run on worker `a` until a request is loading its prefix from `a`'s host tier;
    then `a` dies (dropped with its tier and its KV) and every unfinished request goes on on a fresh
    worker `b`, as the coordinator's failover sends it: a continuation carrying the tokens made so
    far. The outputs are the reference's: nothing of the tier's is needed to be right."""
    from mindmotor.engine.continuation import Continuation

    clock = Clock()
    current = engine(tiny_ckpt, clock, kv_host_bytes=2**20, cache_chunk_size=4096)
    rng = np.random.default_rng(3)                       # the same sessions as `sessions` makes
    prompts = [list(rng.integers(1, current.vocab_size, 12)) for _ in range(5)]
    got: dict[str, list[int]] = {}
    died = False
    for turn in range(4):
        asked = {f"s{s}-t{turn}": prompts[s] for s in range(5)}
        for rid, prompt in asked.items():
            current.add_request(rid, prompt, GREEDY)
        outs: dict[str, list[int]] = {rid: [] for rid in asked}
        while current.has_unfinished_requests():
            if not died and current.kv_tier.num_loading:          # mid-load: the worker dies here
                died = True
                unfinished = [rid for rid in asked if current.requests.get(rid) is not None]
                current = engine(tiny_ckpt, clock, kv_host_bytes=2**20, cache_chunk_size=4096)
                for rid in unfinished:
                    current.add_request(rid, asked[rid], GREEDY, continuation=Continuation(tuple(outs[rid])))
                continue
            for out in current.step():
                outs[out.request_id].extend(out.new_token_ids)
            clock.now += current.last_step_s
            if current.last_step_s == 0.0:
                clock.now = max(clock.now, current.next_kv_ready_at())
        got.update(outs)
        for s in range(5):
            prompts[s] = prompts[s] + outs[f"s{s}-t{turn}"] + list(rng.integers(1, current.vocab_size,
                                                                                 int(rng.integers(3, 9))))
    assert died
    assert got == reference
