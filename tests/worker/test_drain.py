"""Draining: SIGTERM or the Drain RPC stop new work, in-flight streams finish, then exit 0."""

from __future__ import annotations

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mindmotor.protocol import worker_pb2 as pb

from .rpc import collect, request
from .worker_process import REALTIME_ARGS, wait_until

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def stream_in_background(worker, prompt: str, max_tokens: int):
    """Start a stream, wait for its first chunk, read the rest on a thread. Returns (first, join)."""
    call = worker.stub.Generate(request(prompt, max_tokens=max_tokens, ignore_eos=True), timeout=60)
    first = next(call)
    result = {}

    def read():
        try:
            result["rest"] = collect(call)
        except grpc.RpcError as exc:
            result["error"] = exc

    reader = threading.Thread(target=read)
    reader.start()

    def join():
        reader.join(timeout=30)
        return result

    return first, join


def health_status(worker) -> int:
    stub = health_pb2_grpc.HealthStub(worker.channel)
    return stub.Check(health_pb2.HealthCheckRequest(service="mindmotor.v1.Worker"), timeout=5).status


def assert_refuses_new_requests(worker):
    with pytest.raises(grpc.RpcError) as raised:
        collect(worker.stub.Generate(request("too late", max_tokens=4), timeout=5))
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "draining" in raised.value.details()


def test_sigterm_lets_the_stream_finish_refuses_new_work_and_exits_0(start_worker):
    w = start_worker(*REALTIME_ARGS)
    first, join = stream_in_background(w, "drain me", max_tokens=120)     # ~2 s of decode

    w.terminate()

    wait_until(lambda: health_status(w) == NOT_SERVING, timeout=5)
    assert_refuses_new_requests(w)
    status = w.stub.Status(pb.StatusRequest(), timeout=5)
    assert status.state == "draining" and status.load.in_flight == 1
    rest = join()["rest"]
    assert rest.finish_reason == "length"
    assert len(first.token_ids) + len(rest.token_ids) == 120
    assert w.proc.wait(timeout=15) == 0
    assert '"drained": true' in w.log_text()


def test_drain_rpc_then_sigterm(start_worker):
    w = start_worker(*REALTIME_ARGS)
    _first, join = stream_in_background(w, "drain by rpc", max_tokens=40)

    now = w.stub.Drain(pb.DrainRequest(), timeout=5)
    assert now.in_flight == 1 and not now.drained
    assert health_status(w) == NOT_SERVING
    assert_refuses_new_requests(w)
    waited = w.stub.Drain(pb.DrainRequest(wait=True, timeout_s=20), timeout=30)

    assert waited.drained and waited.in_flight == 0
    assert join()["rest"].finish_reason == "length"
    w.terminate()
    assert w.proc.wait(timeout=15) == 0


def test_drain_timeout_bounds_the_wait(start_worker):
    w = start_worker(*REALTIME_ARGS, "--drain-timeout", "0.2")
    _first, join = stream_in_background(w, "too long to wait for", max_tokens=600)   # ~10 s

    w.terminate()

    assert w.proc.wait(timeout=15) == 0
    rest = join()["rest"]
    assert rest.finish_reason == "abort" and len(rest.token_ids) < 600
    assert "drain cut short" in w.log_text()
