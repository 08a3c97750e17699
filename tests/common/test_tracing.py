"""common/tracing.py on its own: W3C traceparent in and out (a malformed one is no parent), a
parent's "not sampled" is respected (its children propagate but are not exported), spans reach
an OTLP/HTTP receiver in batches, and a collector that is away only drops spans."""

from __future__ import annotations

import pytest

from mindmotor.common.ports import free_port
from mindmotor.common.tracing import Tracing
from mindmotor.common.waiting import wait_until
from otlp_receiver import OtlpReceiver

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.mark.parametrize("value", ["", "00-xyz", f"00-{TRACE}-{PARENT}", f"ff-{TRACE}-{PARENT}-01",
                                   f"00-{'0' * 32}-{PARENT}-01", f"00-{TRACE}-{'0' * 16}-01",
                                   f"00-{TRACE}-{PARENT}-01-extra", f"00-{TRACE[:-1]}g-{PARENT}-01"])
def test_a_malformed_traceparent_is_no_parent(value):
    assert Tracing.extract({"traceparent": value}) is None


def test_traceparent_round_trip_and_sampling(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    receiver = OtlpReceiver()
    tracing = Tracing("svc", receiver.url)
    try:
        parent = Tracing.extract([("TraceParent", f"00-{TRACE}-{PARENT}-01")])
        span = tracing.start("a", parent, attributes={"n": 1, "f": 0.5, "b": True, "s": "x"})
        assert Tracing.inject(span) == [("traceparent", f"00-{TRACE}-{span.span_id.hex()}-01")]
        span.add_event("e")
        span.end()
        span.end()                                           # once
        unsampled = tracing.start("b", Tracing.extract({"traceparent": f"00-{TRACE}-{PARENT}-00"}))
        assert Tracing.inject(unsampled)[0][1].endswith("-00")
        unsampled.end()
        with tracing.span("c"):
            pass
        wait_until(lambda: {"a", "c"} <= receiver.names(), timeout=10, what="the spans exported")
    finally:
        tracing.shutdown()
        receiver.close()
    (a,) = receiver.named("a")
    assert (a.service, a.trace_id, a.parent_id, a.events) == ("svc", TRACE, PARENT, ("e",))
    assert a.attributes == {"n": 1, "f": 0.5, "b": True, "s": "x"}
    (c,) = receiver.named("c")
    assert c.parent_id == "" and c.trace_id != TRACE
    assert not receiver.named("b") and receiver.count == 2
    assert Tracing("off").start("x") is None and Tracing.inject(None) == []


def test_a_collector_that_is_away_only_drops_spans(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    tracing = Tracing("svc", f"http://127.0.0.1:{free_port()}")
    for i in range(20):
        tracing.start(f"s{i}").end()
    assert tracing.dropped >= 10
    tracing.shutdown()                                      # does not raise, does not hang
    with pytest.raises(ValueError, match="http"):
        Tracing("svc", "collector:4318")
