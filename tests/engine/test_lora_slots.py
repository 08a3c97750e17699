"""`LoraSlots` on a hand-moved clock: each step chooses its adapters (newcomers first, then the
running ones by work left, with aging: none starves), short slot copies are made before the step
(a stall), long ones beside the steps (the adapter's requests wait)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mindmotor.engine.lora_slots import LoraSlots
from mindmotor.model.lora import AdapterError


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def slots(max_loras: int = 1, copy_bytes: int = 1000):
    clock = Clock()
    s = LoraSlots(max_loras=max_loras, max_cpu_loras=4, max_rank=16, config=None,
                  price_copy=lambda nbytes: nbytes / 1e6, now=clock)
    for name in ("a", "b", "c"):
        s.add_virtual(name, 8, ("q_proj",), copy_bytes)      # 1 ms to copy (1000 bytes)
    return s, clock


def seq(s, name, rid, left: int = 10):
    return SimpleNamespace(lora=s.get(name), request_id=rid, params=SimpleNamespace(max_tokens=left),
                           num_output_tokens=0, order=rid)


class Queued(SimpleNamespace):
    def __lt__(self, other):
        return self.order < other.order


def queued(s, name, rid):
    return Queued(**vars(seq(s, name, rid)))


def test_a_short_copy_is_made_before_the_step_a_long_one_beside_the_steps():
    s, clock = slots()
    a1 = queued(s, "a", "a1")
    s.begin_step([], [a1])
    assert s.ready(a1) and s.loads == 1 and not s.loading          # 1 ms: made before the step ...
    assert s.take_stall() == pytest.approx(0.001) and s.take_stall() == 0.0   # ... which waits for it

    s, clock = slots(copy_bytes=10_000)                              # 10 ms: beside the steps
    a1 = queued(s, "a", "a1")
    s.begin_step([], [a1])
    assert not s.ready(a1) and s.loading and s.idle() == pytest.approx(0.01) and s.take_stall() == 0.0
    clock.t = 0.01
    s.begin_step([], [a1])
    assert s.ready(a1) and s.loads == 1


def test_each_step_chooses_its_adapters_newcomers_first_one_place_kept_for_the_running():
    s, clock = slots(max_loras=2)
    a1, b1, c1 = seq(s, "a", "a1", left=50), seq(s, "b", "b1", left=5), queued(s, "c", "c1")
    s.begin_step([a1, b1], [c1])
    assert s.ready(c1) and s.ready(a1) and not s.ready(b1)         # c's first token; a has more left
    s.begin_step([a1, b1, c1], [])
    assert s.ready(a1) and s.ready(c1) != s.ready(b1)               # two of three; the other keeps its KV
    assert sum(s.slot_of(x.lora) is not None for x in (a1, b1, c1)) == 2


def test_a_rare_adapter_is_not_starved_by_a_popular_one():
    s, clock = slots()
    popular = [seq(s, "a", f"a{i}", left=100) for i in range(8)]
    rare = seq(s, "b", "b1", left=5)
    ran = []
    for _ in range(60):
        s.begin_step(popular + [rare], [])
        ran.append(s.ready(rare))
        assert s.ready(popular[0]) != s.ready(rare)                  # one slot: one adapter per step
    assert any(ran) and not all(ran)


def test_unknown_and_too_large_adapters():
    s, _ = slots()
    with pytest.raises(KeyError):
        s.get("zzz")
    with pytest.raises(AdapterError, match="rank 32"):
        s.add_virtual("big", 32, ("q_proj",), 1)
    assert s.remove("a") and not s.remove("a") and s.names() == ["b", "c"]


def test_with_a_backlog_the_running_adapters_go_first_and_a_newcomer_after_its_patience():
    from mindmotor.engine.lora_slots import PATIENCE, SHORT_QUEUE

    s, clock = slots(max_loras=2)
    a1, b1 = seq(s, "a", "a1"), seq(s, "b", "b1")
    backlog = [queued(s, "c", f"c{i}") for i in range(SHORT_QUEUE * 2 + 1)]
    for step in range(PATIENCE):
        s.begin_step([a1, b1], backlog)
        assert s.ready(a1) and s.ready(b1) and not s.ready(backlog[0]), step
    s.begin_step([a1, b1], backlog)                                  # c has waited long enough
    assert s.ready(backlog[0]) and s.ready(a1) != s.ready(b1)
    s.begin_step([a1, b1], backlog[:SHORT_QUEUE * 2])                # a short queue: newcomers first
    assert s.ready(backlog[0])


def test_running_sequences_skip_the_steps_their_adapter_is_not_in_and_finish_the_same(tiny_ckpt, tmp_path):
    """A real engine, 3 adapters through 1 slot: every step runs one adapter's sequences, the others
    keep their KV; every output equals that request run alone."""
    from mindmotor.engine.config import EngineConfig
    from mindmotor.engine.llm_engine import LLMEngine
    from mindmotor.model.config import LlamaConfig
    from mindmotor.model.testing import write_random_adapter
    from mindmotor.rules.sampling_params import SamplingParams

    config = LlamaConfig.from_dir(tiny_ckpt)
    paths = {n: write_random_adapter(tmp_path / n, config, seed=i) for i, n in enumerate("abc")}

    def engine(max_loras):
        e = LLMEngine(EngineConfig(model=str(tiny_ckpt), enable_lora=True, max_loras=max_loras, max_cpu_loras=3,
                                   block_size=4, num_blocks=256))
        for n, p in paths.items():
            e.add_lora(n, str(p))
        return e

    def run(e, names, first: int = 0):
        params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
        got = {}
        for i, n in enumerate(names, start=first):
            e.add_request(f"r{i}", [3, 5, 7 + i], params, lora=n)
        while e.has_unfinished_requests():
            for out in e.step():
                got.setdefault(out.request_id, []).extend(out.new_token_ids)
        return got

    names = ["a", "b", "c", None, "a", "c"]
    mixed = run(engine(1), names)
    alone = {f"r{i}": run(engine(3), [n], first=i)[f"r{i}"] for i, n in enumerate(names)}
    assert mixed == alone
