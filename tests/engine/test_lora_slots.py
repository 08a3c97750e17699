"""`LoraSlots` on a hand-moved clock: slot loads take the host link's time, a busy slot is never
taken, LRU reuse, and the starvation guard (a slot stops admitting for a request refused too long)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mindmotor.engine.lora_slots import LoraSlots
from mindmotor.model.lora import AdapterError


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def slots(max_loras: int = 1):
    clock = Clock()
    s = LoraSlots(max_loras=max_loras, max_cpu_loras=4, max_rank=16, config=None,
                  price_copy=lambda nbytes: nbytes / 1e6, now=clock)
    for name in ("a", "b", "c"):
        s.add_virtual(name, 8, ("q_proj",), 1000)           # 1 ms to copy
    return s, clock


def seq(s, name, rid):
    return SimpleNamespace(lora=s.get(name), request_id=rid)


def test_a_load_takes_the_copy_time_and_a_busy_slot_is_not_taken():
    s, clock = slots()
    a1, b1 = seq(s, "a", "a1"), seq(s, "b", "b1")
    s.begin_step([])
    assert not s.ready(a1) and s.loading and s.idle() == pytest.approx(0.001)
    assert not s.ready(b1)                                   # the only slot is reserved for a's copy
    clock.t = 0.001
    s.begin_step([])
    assert s.ready(a1) and not s.loading
    s.begin_step([a1])                                       # a1 runs: its slot is busy
    assert not s.ready(b1) and s.loads == 1
    s.begin_step([])                                         # a1 finished: the slot is reused for b
    assert not s.ready(b1) and s.loads == 2 and s.slot_of(b1.lora) == 0


def test_a_rare_adapter_is_not_starved_by_a_popular_one():
    s, clock = slots()
    a1, b1 = seq(s, "a", "a1"), seq(s, "b", "b1")
    s.begin_step([])
    s.ready(a1)
    clock.t = 0.001
    s.begin_step([])
    assert s.ready(a1)
    for i in range(3):                                       # a steady stream of a's requests ...
        clock.t += 0.5
        s.begin_step([a1])
        assert not s.ready(b1)                               # ... b waits
        assert s.ready(seq(s, "a", f"a{i + 2}"))             # ... and a's newcomers still get in
    clock.t = 2.6                                            # b refused for over 2 s: a's slot drains
    s.begin_step([a1])
    assert not s.ready(b1)
    assert not s.ready(seq(s, "a", "late"))                  # no new request of a is admitted
    s.begin_step([])                                         # a's running ones ended
    assert not s.ready(b1) and s.slot_of(b1.lora) == 0       # b's copy starts


def test_unknown_and_too_large_adapters():
    s, _ = slots()
    with pytest.raises(KeyError):
        s.get("zzz")
    with pytest.raises(AdapterError, match="rank 32"):
        s.add_virtual("big", 32, ("q_proj",), 1)
    assert s.remove("a") and not s.remove("a") and s.names() == ["b", "c"]
