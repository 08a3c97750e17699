"""Traces over OTLP/HTTP (--otlp-traces-endpoint): a real receiver (an HTTP server decoding the
OTLP protobuf) gets the coordinator's and the worker's spans of one request under one trace id —
the client's traceparent, through the coordinator's worker call (gRPC metadata) to the worker's
call, its queue, prefill and decode as attributes and events on that span (no span per phase: they
are what tracing costs); and the endpoint is checked at start."""

from __future__ import annotations

import httpx
import pytest

from mindmotor.common.waiting import wait_until
from otlp_receiver import OtlpReceiver
from mindmotor.coordinator.config import CoordinatorSettings

from .processes import InProcessCoordinator, WorkerProcess

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


def test_one_request_is_one_trace_from_client_to_worker(receiver, tiny_ckpt, model_name, tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")        # export batches every 50 ms (default 5 s)
    worker = WorkerProcess(tiny_ckpt, tmp_path / "worker.log", "--timing", "virtual",
                           "--otlp-traces-endpoint", receiver.url).wait_ready()
    coordinator = InProcessCoordinator(workers=[worker.address], model_dir=str(tiny_ckpt),
                                       otlp_traces_endpoint=receiver.url)
    try:
        response = httpx.post(coordinator.url + "/v1/completions", timeout=60,
                              json={"model": model_name, "prompt": "x", "max_tokens": 3, "ignore_eos": True},
                              headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
        assert response.status_code == 200, response.text
        names = {"mindmotor.choice", "mindmotor.worker_call", "mindmotor.worker.generate"}
        wait_until(lambda: names <= receiver.names(), timeout=20, what="every span exported")
    finally:
        coordinator.stop()
        worker.stop()
    by_name = {s.name: s for s in receiver.spans}
    assert len(receiver.spans) == 3, receiver.spans
    assert {s.trace_id for s in receiver.spans} == {TRACE_ID}                 # one trace, the client's
    assert by_name["mindmotor.choice"].service == "mindmotor-coordinator"
    assert by_name["mindmotor.choice"].parent_id == CLIENT_SPAN
    assert by_name["mindmotor.worker_call"].parent_id == by_name["mindmotor.choice"].span_id
    call = by_name["mindmotor.worker.generate"]
    assert call.service == "mindmotor-worker"
    assert call.parent_id == by_name["mindmotor.worker_call"].span_id           # over gRPC
    assert call.events == ("mindmotor.worker.scheduled", "mindmotor.worker.first_token")
    assert call.attributes["mindmotor.output_tokens"] == 3 and call.attributes["mindmotor.finish_reason"] == "length"
    assert all(call.attributes[f"mindmotor.{phase}_s"] >= 0 for phase in ("queue", "prefill", "decode"))
    assert call.attributes["mindmotor.decode_s"] > 0


def test_the_endpoint_is_checked(tiny_ckpt):
    with pytest.raises(ValueError, match="http"):
        CoordinatorSettings(model_dir=str(tiny_ckpt), otlp_traces_endpoint="collector:4318")


def test_a_split_request_is_one_trace_through_both_workers(receiver, tiny_ckpt, model_name, tmp_path, monkeypatch):
    """Prefill/decode split: the coordinator's prefill call and the prefill worker's prefill, the
    decode worker's call, its KV pull and the prefill worker's read of the pinned KV (PullKV, its
    traceparent from the decode worker) are all spans of the client's trace."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    args = ("--timing", "virtual", "--otlp-traces-endpoint", receiver.url)
    prefill = WorkerProcess(tiny_ckpt, tmp_path / "prefill.log", *args, "--role", "prefill")
    decode = WorkerProcess(tiny_ckpt, tmp_path / "decode.log", *args, "--role", "decode")
    coordinator = None
    try:
        prefill.wait_ready()
        decode.wait_ready()
        coordinator = InProcessCoordinator(workers=[prefill.address, decode.address], model_dir=str(tiny_ckpt),
                                           otlp_traces_endpoint=receiver.url)
        response = httpx.post(coordinator.url + "/v1/completions", timeout=60,
                              json={"model": model_name, "prompt": "a prompt of a few blocks " * 8, "max_tokens": 4,
                                    "ignore_eos": True},
                              headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
        assert response.status_code == 200, response.text
        names = {"mindmotor.choice", "mindmotor.prefill_call", "mindmotor.worker.prefill_only", "mindmotor.worker_call",
                 "mindmotor.worker.generate", "mindmotor.worker.kv_pull", "mindmotor.worker.kv_read"}
        wait_until(lambda: names <= receiver.names(), timeout=20, what="every span exported")
    finally:
        if coordinator is not None:
            coordinator.stop()
        prefill.stop()
        decode.stop()
    by_name = {s.name: s for s in receiver.spans}
    assert {s.trace_id for s in receiver.spans} == {TRACE_ID}
    parent_of = {"mindmotor.choice": None, "mindmotor.prefill_call": "mindmotor.choice",
                 "mindmotor.worker.prefill_only": "mindmotor.prefill_call", "mindmotor.worker_call": "mindmotor.choice",
                 "mindmotor.worker.generate": "mindmotor.worker_call",
                 "mindmotor.worker.kv_pull": "mindmotor.worker.generate",
                 "mindmotor.worker.kv_read": "mindmotor.worker.kv_pull"}
    for name, parent in parent_of.items():
        if parent is not None:
            assert by_name[name].parent_id == by_name[parent].span_id, name
    prefill_id, decode_id = by_name["mindmotor.worker.prefill_only"].attributes["mindmotor.worker_id"], \
        by_name["mindmotor.worker.generate"].attributes["mindmotor.worker_id"]
    assert prefill_id != decode_id
    assert by_name["mindmotor.worker.kv_pull"].attributes["mindmotor.outcome"] == "pulled"
    assert by_name["mindmotor.worker.kv_pull"].attributes["mindmotor.tokens_pulled"] > 0
