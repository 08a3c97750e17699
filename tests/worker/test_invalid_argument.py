"""Bad input fails alone, with INVALID_ARGUMENT and the engine's message."""

from __future__ import annotations

import threading

import grpc
import pytest

from mindmotor.protocol import worker_pb2 as pb

from .rpc import collect, request

MAX_MODEL_LEN = 1024          # the tiny checkpoint's context


def resumed(req: pb.GenerateRequest, token_ids: list[int], sent_chars: int = 0) -> pb.GenerateRequest:
    """`req` continuing after `token_ids` produced elsewhere."""
    req.continuation.output_token_ids.extend(token_ids)
    req.continuation.sent_chars = sent_chars
    return req


def with_kv_source(req: pb.GenerateRequest, **source) -> pb.GenerateRequest:
    req.continuation.kv_source.CopyFrom(pb.KVSource(**source))
    return req


CASES = {
    "prompt longer than the context": (
        request([5] * (MAX_MODEL_LEN + 10)), "maximum context length is 1024 tokens"),
    "prompt plus max_tokens over the context": (
        request([5] * 1000, max_tokens=100), "reduce the prompt or max_tokens"),
    "empty prompt": (request(""), "the prompt is empty"),
    "no prompt": (pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=4)), "has no prompt"),
    "prompt ids outside the vocabulary": (request([1, 2, 100000]), "outside the vocabulary"),
    "unknown stop token id": (request("hi", stop_token_ids=[99999]), "stop_token_ids [99999]"),
    "negative stop token id": (request("hi", stop_token_ids=[-1]), "stop_token_ids [-1]"),
    "temperature too high": (request("hi", temperature=3.0), "temperature must be in [0, 2], got 3.0"),
    "top_p zero": (request("hi", top_p=0.0), "top_p must be in (0, 1]"),
    "top_k below -1": (request("hi", top_k=-5), "top_k must be -1"),
    "max_tokens zero": (request("hi", max_tokens=0), "max_tokens must be at least 1, got 0"),
    "min_tokens over max_tokens": (request("hi", max_tokens=2, min_tokens=5), "must not exceed max_tokens"),
    "presence penalty": (request("hi", presence_penalty=2.5), "presence_penalty must be in [-2, 2]"),
    "frequency penalty": (request("hi", frequency_penalty=-3.0), "frequency_penalty must be in [-2, 2]"),
    "too many logprobs": (request("hi", logprobs=21), "logprobs must be in [0, 20], got 21"),
    "empty stop string": (request("hi", stop=[""]), "stop strings must be non-empty"),
    "continuation ids outside the vocabulary": (
        resumed(request("hi", max_tokens=8), [3, 100000]), "continuation output token ids [100000] are outside"),
    "continuation output reaching max_tokens": (
        resumed(request("hi", max_tokens=2), [3, 4]), "the output so far has 2 tokens, but max_tokens is 2"),
    "prompt plus continuation output filling the context": (
        resumed(request([5] * 1000), [6] * 24), "fill this model's maximum context length of 1024 tokens"),
    "continuation sent_chars beyond its text": (
        resumed(request("hi", max_tokens=8), [3], sent_chars=500), "sent_chars (500) is outside"),
    "KV source without its first token": (
        with_kv_source(request([5, 6, 7], max_tokens=8), address="127.0.0.1:1", handle="h"),
        "carries the first token made with that KV"),
    "KV source without a handle": (
        with_kv_source(resumed(request([5, 6, 7], max_tokens=8), [9]), address="127.0.0.1:1"),
        "needs the address and handle"),
}


@pytest.mark.parametrize("bad_request, message", CASES.values(), ids=CASES.keys())
def test_invalid_argument_with_the_engines_message(worker, bad_request, message):
    with pytest.raises(grpc.RpcError) as raised:
        collect(worker.stub.Generate(bad_request, timeout=10))

    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in raised.value.details()


def test_bad_requests_do_not_disturb_a_running_stream(worker):
    good = worker.stub.Generate(request("a good request", max_tokens=300, ignore_eos=True), timeout=30)
    first = next(good)                         # it is running
    result = {}
    reader = threading.Thread(target=lambda: result.update(rest=collect(good)))
    reader.start()

    for bad_request, _message in CASES.values():
        with pytest.raises(grpc.RpcError):
            collect(worker.stub.Generate(bad_request, timeout=10))
    reader.join(timeout=30)

    rest = result["rest"]
    assert rest.finish_reason == "length"
    assert len(first.token_ids) + len(rest.token_ids) == 300
    status = worker.stub.Status(pb.StatusRequest(), timeout=5)
    assert status.state == "serving" and status.load.running == 0
