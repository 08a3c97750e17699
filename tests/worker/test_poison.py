"""Poison at the worker: requests that used to kill the engine thread (a negative seed reaching
numpy, min_tokens beyond the room left, a request id that is a pinned prefill's) are refused with
INVALID_ARGUMENT and the worker serves the next request; an exception the engine raises for one
request fails it alone (INTERNAL, `mindmotor-failure: request`); a dead engine turns the health
check NOT_SERVING and the worker exits non-zero; over its concurrency limit a worker answers
RESOURCE_EXHAUSTED."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol.failure import ENGINE_DEAD, FAILURE_METADATA_KEY, PARAM_METADATA_KEY, REQUEST_FAILED

from abuse_specs import as_json, chained_lark, optional_chain, ref_chain
from .rpc import collect, request
from .worker_process import REALTIME_ARGS, start_worker, wait_until

FAULTY_WORKER = [sys.executable, str(Path(__file__).with_name("faulty_worker.py"))]
MAX_MODEL_LEN = 1024          # the tiny checkpoint's context
VOCAB = 384

POISONS = {
    "negative seed (numpy's default_rng refuses it)": (
        request("hi", seed=-1, temperature=1.0), "seed", "seed must be in [0, 2^63 - 1], got -1"),
    "min_tokens beyond the room left, no max_tokens": (
        request([5] * 1000, min_tokens=100), "min_tokens", "min_tokens (100) exceeds the room left"),
    "largest int32 prompt id": (request([5, 2**31 - 1]), "prompt", "outside the vocabulary [0, 384)"),
    "largest int32 stop id": (request("hi", stop_token_ids=[2**31 - 1]), "stop_token_ids", "outside the vocabulary"),
    "stop id just past the vocabulary": (request("hi", stop_token_ids=[VOCAB]), "stop_token_ids", "[384]"),
}


def metadata(error: grpc.RpcError) -> dict[str, str]:
    return dict(error.trailing_metadata() or ())


def generate_ok(worker) -> None:
    out = collect(worker.stub.Generate(request("still serving", max_tokens=4, ignore_eos=True), timeout=30))
    assert out.finish_reason == "length" and len(out.token_ids) == 4


@pytest.mark.parametrize("poison, param, message", POISONS.values(), ids=POISONS.keys())
def test_poison_is_invalid_argument_and_the_worker_serves_on(worker, poison, param, message):
    with pytest.raises(grpc.RpcError) as raised:
        collect(worker.stub.Generate(poison, timeout=10))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in raised.value.details()
    assert metadata(raised.value)[PARAM_METADATA_KEY] == param
    generate_ok(worker)
    assert worker.stub.Status(pb.StatusRequest(), timeout=5).state == "serving"


def test_reusing_a_pinned_prefills_id_is_refused_alone(worker):
    """The id is checked on the engine thread (the pinned KV lives there); it used to raise there."""
    prefill = worker.stub.Prefill(pb.PrefillRequest(request_id="handle-1", prompt_token_ids=pb.TokenIds(ids=[5, 6, 7]),
                                                    sampling=pb.SamplingParams(max_tokens=8, temperature=0)),
                                  timeout=10)
    assert prefill.handle == "handle-1"
    with pytest.raises(grpc.RpcError) as raised:
        collect(worker.stub.Generate(request([5, 6], request_id="handle-1", max_tokens=4), timeout=10))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "already in use" in raised.value.details()
    assert worker.stub.ReleaseKV(pb.ReleaseKVRequest(handle="handle-1"), timeout=5).found
    generate_ok(worker)


@pytest.fixture(scope="module")
def faulty_worker(tiny_model, tmp_path_factory):
    """A worker whose engine raises for requests named `poison` (see faulty_worker.py)."""
    w = start_worker(tiny_model, tmp_path_factory.mktemp("logs") / "faulty.log", "--timing", "virtual",
                     program=FAULTY_WORKER)
    yield w
    w.stop()


def test_an_engine_exception_fails_one_request_and_the_others_finish(faulty_worker):
    long = faulty_worker.stub.Generate(request("a long request", max_tokens=300, ignore_eos=True), timeout=60)
    first = next(long)
    rest = {}
    reader = threading.Thread(target=lambda: rest.update(out=collect(long)))
    reader.start()

    with pytest.raises(grpc.RpcError) as raised:
        collect(faulty_worker.stub.Generate(request("x", request_id="poison-1", max_tokens=8, ignore_eos=True),
                                            timeout=30))
    reader.join(timeout=60)

    assert raised.value.code() == grpc.StatusCode.INTERNAL
    assert "the engine failed this request: RuntimeError: injected fault" in raised.value.details()
    assert metadata(raised.value)[FAILURE_METADATA_KEY] == REQUEST_FAILED
    assert rest["out"].finish_reason == "length" and len(first.token_ids) + len(rest["out"].token_ids) == 300
    generate_ok(faulty_worker)
    status = faulty_worker.stub.Status(pb.StatusRequest(), timeout=5)
    assert status.state == "serving" and status.load.running == 0


def test_a_dead_engine_ends_its_streams_stops_the_health_check_and_exits(tiny_model, tmp_path):
    w = start_worker(tiny_model, tmp_path / "dying.log", "--timing", "virtual", program=FAULTY_WORKER)
    try:
        health = health_pb2_grpc.HealthStub(w.channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        bystander = w.stub.Generate(request("a long request", max_tokens=900, ignore_eos=True), timeout=60)
        next(bystander)

        for stream in (bystander, w.stub.Generate(request("x", request_id="break-engine", max_tokens=8), timeout=30)):
            with pytest.raises(grpc.RpcError) as raised:
                collect(stream)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value
            assert "this worker's engine has stopped" in raised.value.details()
            assert metadata(raised.value)[FAILURE_METADATA_KEY] == ENGINE_DEAD

        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert w.proc.wait(timeout=30) == 1                  # to be replaced by its supervisor
        log = w.log_text()
        assert "the engine died; the worker stops serving and exits" in log and "does not add up" in log
    finally:
        w.stop()


def test_over_the_concurrency_limit_calls_are_resource_exhausted(start_worker):
    w = start_worker(*REALTIME_ARGS, "--max-concurrent-requests", "2")
    streams = [w.stub.Generate(request(f"long {i}", max_tokens=500, ignore_eos=True), timeout=60) for i in range(2)]
    for s in streams:
        next(s)                                   # both are running

    with pytest.raises(grpc.RpcError) as raised:
        collect(w.stub.Generate(request("one more", max_tokens=4), timeout=10))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "at its limit of 2 concurrent requests" in raised.value.details()
    with pytest.raises(grpc.RpcError) as raised:
        w.stub.Prefill(pb.PrefillRequest(prompt_text="one more", sampling=pb.SamplingParams(max_tokens=4)), timeout=10)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    for s in streams:
        s.cancel()
    wait_until(lambda: w.stub.Status(pb.StatusRequest(), timeout=5).load.in_flight == 0, what="the streams ended")
    generate_ok(w)



SPEC_POISONS = {   # issue 19: each used to SIGSEGV the process that compiled it
    "a 3,000-rule Lark chain (over the rule limit)": ("grammar", lambda: chained_lark(3000), "the limit is 2000"),
    "a grammar within the limits that overflows a helper's stack": (
        "grammar", lambda: optional_chain(1997), "the grammar compiler crashed on it"),
    "a 2,500-deep $ref chain (over the $ref limit)": ("json", lambda: as_json(ref_chain(2500)), "the limit is 500"),
}


@pytest.mark.parametrize("kind, spec, words", SPEC_POISONS.values(), ids=SPEC_POISONS.keys())
def test_a_spec_that_crashed_the_compiler_is_refused_and_the_engine_serves_on(worker, kind, spec, words):
    """A helper process compiles a spec before the engine does: the worker never crashes on one."""
    poison = request("x", max_tokens=4)
    poison.sampling.structured.CopyFrom(pb.StructuredOutput(kind=kind, spec=spec()))
    with pytest.raises(grpc.RpcError) as raised:
        collect(worker.stub.Generate(poison, timeout=30))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert words in raised.value.details()
    assert metadata(raised.value)[PARAM_METADATA_KEY] == "structured_outputs"
    assert worker.proc.poll() is None
    generate_ok(worker)
