"""OutputRecall: a call's output is there while it runs and for `retention_s` after it ended, then
forgotten; the oldest go first past the token bound; retention 0 keeps nothing."""

from __future__ import annotations

from mindmotor.worker.recall import OutputRecall
from fake_clock import FakeClock


def test_kept_while_running_and_for_the_retention_after():
    clock = FakeClock()
    recall = OutputRecall(retention_s=60, clock=clock)
    record = recall.start("a", b"digest", [1, 2])
    record.output_token_ids.extend([3, 4])
    assert recall.get("a").output_token_ids == [1, 2, 3, 4]
    recall.end("a", record)
    clock.now += 59
    assert recall.get("a") is record
    clock.now += 2
    assert recall.get("a") is None


def test_the_oldest_go_first_past_the_token_bound():
    recall = OutputRecall(retention_s=60, max_tokens=5, clock=FakeClock())
    for name in "abc":
        record = recall.start(name, b"d", [7, 7])
        recall.end(name, record)
    assert recall.get("a") is None and recall.get("b") is not None and recall.get("c") is not None


def test_retention_zero_keeps_nothing():
    recall = OutputRecall(retention_s=0)
    record = recall.start("a", b"d", [1])
    recall.end("a", record)
    assert recall.get("a") is None
