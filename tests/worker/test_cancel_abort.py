"""A client that cancels, an Abort call, a request id in use: blocks come back, others go on."""

from __future__ import annotations

import grpc
import pytest

from mindmotor.protocol import worker_pb2 as pb

from .rpc import collect, request
from .worker_process import wait_until

LONG = dict(max_tokens=500, ignore_eos=True)      # ~8 s on the realtime worker: cut short below


def idle_with_all_blocks_free(worker):
    load = worker.stub.Status(pb.StatusRequest(), timeout=5).load
    return (load.running == 0 and load.waiting == 0 and load.in_flight == 0 and load.kv_usage == 0.0
            and load.num_free_blocks == load.num_blocks)


def test_client_cancel_aborts_the_request_and_frees_its_blocks(realtime_worker):
    w = realtime_worker
    call = w.stub.Generate(request("cancel me " * 40, request_id="to-cancel", **LONG), timeout=30)
    for _ in range(3):
        next(call)
    load = w.stub.Status(pb.StatusRequest(), timeout=5).load
    assert load.running == 1 and load.kv_usage > 0

    call.cancel()

    wait_until(lambda: idle_with_all_blocks_free(w), timeout=5)
    assert "request cancelled by the client" in w.log_text()


def test_abort_ends_the_stream_with_finish_reason_abort(realtime_worker):
    w = realtime_worker
    call = w.stub.Generate(request("abort me", request_id="to-abort", **LONG), timeout=30)
    next(call)

    assert w.stub.Abort(pb.AbortRequest(request_id="to-abort"), timeout=5).found
    rest = collect(call)

    assert rest.finish_reason == "abort"
    assert rest.last.usage.completion_tokens < LONG["max_tokens"]
    wait_until(lambda: idle_with_all_blocks_free(w), timeout=5)


def test_abort_of_an_unknown_request_finds_nothing(realtime_worker):
    assert not realtime_worker.stub.Abort(pb.AbortRequest(request_id="nobody"), timeout=5).found


def test_request_id_in_use_is_refused_and_the_first_goes_on(realtime_worker):
    w = realtime_worker
    first = w.stub.Generate(request("first of two", request_id="twice", max_tokens=40, ignore_eos=True),
                            timeout=30)
    next(first)

    with pytest.raises(grpc.RpcError) as raised:
        collect(w.stub.Generate(request("second", request_id="twice", max_tokens=4), timeout=5))

    assert raised.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert collect(first).finish_reason == "length"
