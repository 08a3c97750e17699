"""Poison through the real coordinator and real workers: every input that used to bring the
platform down (issue 9) is answered with a 4xx naming the parameter, no instance is marked failed,
and afterwards every worker serves the next request. An engine that raises for one request, or
that the request kills, costs that request alone (it is not sent to a third instance); busy
workers (their concurrency limit) mean 429, not dead workers; 4,096 choices are served."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import grpc
import httpx
import pytest

from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol.failure import ENGINE_DEAD, FAILURE_METADATA_KEY

from .processes import InProcessCoordinator, start_controller, start_workers, wait_until

FAULTY_WORKER = [sys.executable, str(Path(__file__).parent.parent / "worker" / "faulty_worker.py")]
VOCAB = 384                 # the tiny checkpoint's


def post(c: InProcessCoordinator, path: str, body: dict, **headers) -> httpx.Response:
    """`body` as JSON with non-ASCII escaped, so lone surrogates travel as `\\ud800` (as any JSON
    client may send them)."""
    return httpx.post(c.url + path, content=json.dumps(body), timeout=120,
                      headers={"content-type": "application/json", **headers})


def generated(worker) -> int:
    return worker.status().load.generation_tokens


def assert_every_worker_serves(c: InProcessCoordinator, workers, model: str) -> None:
    """No instance is marked failed, and the next requests are served by every worker."""
    table = c.coordinator.table
    assert all(table.is_routable(v) for v in table.all()), [v.instance_id for v in table.all()]
    before = [generated(w) for w in workers]
    for i in range(len(workers)):
        response = post(c, "/v1/completions", {"model": model, "prompt": f"next {i}", "max_tokens": 3,
                                               "ignore_eos": True, "temperature": 0})
        assert response.status_code == 200, response.text
    assert all(generated(w) > b for w, b in zip(workers, before)), "a worker did not serve"


@pytest.fixture(scope="module")
def rr_coordinator(virtual_workers, tiny_ckpt):
    """Round robin over the two shared workers, so that consecutive requests reach both."""
    c = InProcessCoordinator(workers=[w.address for w in virtual_workers], model_dir=str(tiny_ckpt),
                             policy="round_robin")
    wait_until(lambda: len(c.coordinator.table.candidates(tiny_ckpt.name)) == 2, what="both workers routable")
    yield c
    c.stop()


COMPLETION_POISONS = {
    "negative seed": ({"seed": -1}, "seed", "greater than or equal to 0"),
    "seed 2^63": ({"seed": 2**63}, "seed", "less than or equal to 9223372036854775807"),
    "top_k 2^31": ({"top_k": 2**31}, "top_k", "less than or equal to 2147483647"),
    "stop id 2^31": ({"stop_token_ids": [2**31]}, "stop_token_ids", "outside [0, 2^31)"),
    "stop id past the vocabulary": ({"stop_token_ids": [VOCAB]}, "stop_token_ids", "outside the vocabulary"),
    "prompt id 2^31": ({"prompt": [5, 2**31]}, "prompt", "outside [0, 2^31)"),
    "prompt id past the vocabulary": ({"prompt": [5, VOCAB]}, "prompt", "outside the vocabulary [0, 384)"),
    "lone surrogate in the prompt": ({"prompt": "\ud800 x"}, "prompt", "lone surrogate"),
    "lone surrogate in a prompt list": ({"prompt": ["ok", "\udfff"]}, "prompt", "lone surrogate"),
    "lone surrogate in stop": ({"stop": ["\ud800"]}, "stop", "lone surrogate"),
    "min_tokens beyond the room left": ({"prompt": [5] * 1000, "max_tokens": None, "min_tokens": 100},
                                        "min_tokens", "exceeds the room left in the context"),
    "max_tokens 2^32": ({"prompt": [5], "max_tokens": 2**32}, "max_tokens", "below 2^32"),
    "100 prompts × n 128": ({"prompt": ["x"] * 100, "n": 128}, "prompt", "could never be admitted"),
    "NaN temperature": ({"temperature": float("nan")}, "temperature", ""),
}


@pytest.mark.parametrize("fields, param, words", COMPLETION_POISONS.values(), ids=COMPLETION_POISONS.keys())
def test_completion_poison_is_400_and_every_worker_serves_next(rr_coordinator, virtual_workers, model_name,
                                                              fields, param, words):
    response = post(rr_coordinator, "/v1/completions", {"model": model_name, "prompt": "hi", **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"]
    assert_every_worker_serves(rr_coordinator, virtual_workers, model_name)


CHAT_POISONS = {
    "lone surrogate in a message": ({"messages": [{"role": "user", "content": "\ud800 x"}]},
                                    "messages.0.content", "lone surrogate"),
    "lone surrogate in a text part": ({"messages": [{"role": "system", "content": "ok"}, {
        "role": "user", "content": [{"type": "text", "text": "a\udc00"}]}]}, "messages.1.content", "lone surrogate"),
    "min_tokens beyond the room left (no max_tokens)": (
        {"messages": [{"role": "user", "content": "hi"}], "min_tokens": 5000}, "min_tokens",
        "exceeds the room left in the context"),
    "negative seed": ({"messages": [{"role": "user", "content": "hi"}], "seed": -1}, "seed", "greater than"),
}


@pytest.mark.parametrize("body, param, words", CHAT_POISONS.values(), ids=CHAT_POISONS.keys())
def test_chat_poison_is_400_and_every_worker_serves_next(rr_coordinator, virtual_workers, model_name,
                                                        body, param, words):
    response = post(rr_coordinator, "/v1/chat/completions", {"model": model_name, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert_every_worker_serves(rr_coordinator, virtual_workers, model_name)


def test_tokenize_with_a_lone_surrogate_is_400(rr_coordinator, model_name):
    response = post(rr_coordinator, "/tokenize", {"model": model_name, "prompt": "\ud800"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


def test_4096_choices_are_served_and_no_instance_looks_failed(rr_coordinator, virtual_workers, model_name):
    """32 prompts × n 128: more calls at once than gRPC's default pending-call limit, which used
    to shed them as CANCELLED and have every instance marked failed."""
    retries = rr_coordinator.coordinator.metrics.retries
    response = post(rr_coordinator, "/v1/completions", {
        "model": model_name, "prompt": [f"prompt {i}" for i in range(32)], "n": 128, "max_tokens": 1,
        "ignore_eos": True})
    assert response.status_code == 200, response.text[:500]
    assert len(response.json()["choices"]) == 4096
    assert sum(s.value for m in retries.collect() for s in m.samples if s.name.endswith("_total")) == 0
    assert_every_worker_serves(rr_coordinator, virtual_workers, model_name)


@pytest.fixture(scope="module")
def faulty_workers(tiny_ckpt, tmp_path_factory):
    """Two workers whose engines raise for requests named `poison` (tests/worker/faulty_worker.py)."""
    workers = start_workers(tiny_ckpt, tmp_path_factory.mktemp("faulty-logs"), 2, "--timing", "virtual",
                            program=FAULTY_WORKER)
    yield workers
    for w in workers:
        w.stop()


def test_a_request_the_engine_fails_is_tried_on_two_instances_only(faulty_workers, tiny_ckpt, model_name):
    c = InProcessCoordinator(workers=[w.address for w in faulty_workers], model_dir=str(tiny_ckpt),
                             policy="round_robin")
    try:
        wait_until(lambda: len(c.coordinator.table.candidates(model_name)) == 2, what="both workers routable")
        response = post(c, "/v1/completions", {"model": model_name, "prompt": "x", "max_tokens": 8,
                                               "ignore_eos": True}, **{"X-Request-Id": "poison-1"})
        assert response.status_code == 500, response.text
        error = response.json()["error"]
        assert error["code"] == "request_failed_on_instances"
        assert "failed 2 times, on 2 instances" in error["message"] and "injected fault" in error["message"]
        assert_every_worker_serves(c, faulty_workers, model_name)    # neither was marked failed
    finally:
        c.stop()


def test_a_request_that_kills_engines_is_not_sent_to_a_third(tiny_ckpt, tmp_path, model_name):
    workers = start_workers(tiny_ckpt, tmp_path, 3, "--timing", "virtual", program=FAULTY_WORKER)
    c = InProcessCoordinator(workers=[w.address for w in workers], model_dir=str(tiny_ckpt))
    try:
        wait_until(lambda: len(c.coordinator.table.candidates(model_name)) == 3, what="three workers routable")
        response = post(c, "/v1/completions", {"model": model_name, "prompt": "x", "max_tokens": 8},
                        **{"X-Request-Id": "break-engine-1"})
        assert response.status_code == 500, response.text
        assert response.json()["error"]["code"] == "request_failed_on_instances"
        assert "this worker's engine has stopped" in response.json()["error"]["message"]

        codes = [w.proc.wait(timeout=30) if w.address in response.text else None for w in workers]
        assert sorted(codes, key=str) == [1, 1, None]           # two engines died, their workers exited 1
        survivor = next(w for w, code in zip(workers, codes) if code is None)
        assert survivor.status().state == "serving"
        response = post(c, "/v1/completions", {"model": model_name, "prompt": "next", "max_tokens": 3})
        assert response.status_code == 200, response.text
    finally:
        c.stop()
        for w in workers:
            w.stop()


def test_busy_workers_mean_429_not_failed_instances(tiny_ckpt, tmp_path, model_name):
    (worker,) = start_workers(tiny_ckpt, tmp_path, 1, "--timing", "realtime", "--emulate", "llama2-7b",
                              "--max-concurrent-requests", "2")
    c = InProcessCoordinator(workers=[worker.address], model_dir=str(tiny_ckpt))
    try:
        wait_until(lambda: c.coordinator.table.candidates(model_name), what="the worker routable")
        response = post(c, "/v1/completions", {"model": model_name, "prompt": "x", "n": 4, "max_tokens": 200,
                                               "ignore_eos": True})
        assert response.status_code == 429, response.text
        assert response.json()["error"]["code"] == "instances_busy" and response.headers["Retry-After"]
        wait_until(worker.idle, what="the admitted choices were cancelled")
        assert_every_worker_serves(c, [worker], model_name)
    finally:
        c.stop()
        worker.stop()



def test_a_dead_engines_worker_leaves_the_controllers_table_and_the_other_serves(tiny_ckpt, tmp_path, model_name):
    """Through the controller: the dying worker heartbeats "draining", deregisters and exits 1;
    the coordinator's routing table (the controller's Watch) drops it and the survivor serves."""
    controller = start_controller(tmp_path / "controller.log", "--heartbeat-interval", "0.2")
    started = [controller]
    try:
        started += start_workers(tiny_ckpt, tmp_path, 2, "--timing", "virtual", "--controller", controller.address,
                                 program=FAULTY_WORKER)
        victim, survivor = started[1], started[2]
        c = InProcessCoordinator(controllers=[controller.address], model_dir=str(tiny_ckpt))
        try:
            table = c.coordinator.table
            wait_until(lambda: len(table.candidates(model_name)) == 2, timeout=30, what="both workers routable")
            with pytest.raises(grpc.RpcError) as raised:
                list(victim.stub.Generate(pb.GenerateRequest(request_id="break-engine", prompt_text="x",
                                                             sampling=pb.SamplingParams(max_tokens=4)), timeout=30))
            assert dict(raised.value.trailing_metadata())[FAILURE_METADATA_KEY] == ENGINE_DEAD
            assert victim.proc.wait(timeout=30) == 1
            wait_until(lambda: [v.address for v in table.candidates(model_name)] == [survivor.address], timeout=30,
                       what="the dead worker out of the routing table")
            for _ in range(3):
                response = post(c, "/v1/completions", {"model": model_name, "prompt": "next", "max_tokens": 3})
                assert response.status_code == 200, response.text
        finally:
            c.stop()
    finally:
        for process in reversed(started):
            process.stop()


@pytest.mark.parametrize("code, details, metadata, expected", [
    (grpc.StatusCode.INVALID_ARGUMENT, "seed must be ...", (("mindmotor-param", "seed"),), "400 seed"),
    (grpc.StatusCode.OUT_OF_RANGE, "x", (), "400 None"),
    (grpc.StatusCode.FAILED_PRECONDITION, "x", (), "400 None"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "at its limit", (), "busy"),
    (grpc.StatusCode.CANCELLED, "CANCELLED", (), "busy"),                       # gRPC's load shedding
    (grpc.StatusCode.CANCELLED, "Locally cancelled by application!", (), "ours"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", (), "ours"),
    (grpc.StatusCode.UNAVAILABLE, "Socket closed", (), "instance"),
    (grpc.StatusCode.UNAVAILABLE, "engine stopped", ((FAILURE_METADATA_KEY, ENGINE_DEAD),), "instance engine"),
    (grpc.StatusCode.INTERNAL, "the engine failed this request", ((FAILURE_METADATA_KEY, "request"),), "request"),
    (grpc.StatusCode.UNKNOWN, "Unexpected error", (), "request"),
    (grpc.StatusCode.UNIMPLEMENTED, "no such method", (), "500"),
])
def test_failure_classes(code, details, metadata, expected):
    from mindmotor.coordinator.http.errors import BadRequest, InternalError
    from mindmotor.coordinator.dispatch.failures import OwnCancellation, WorkerFailure, classify

    error = classify(grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*metadata), details))
    if isinstance(error, BadRequest):
        got = f"400 {error.param}"
    elif isinstance(error, WorkerFailure):
        got = error.kind + (" engine" if error.engine_died else "")
        assert error.marks_instance == (error.kind == "instance")
        assert error.counts_against_request == (error.kind == "request" or error.engine_died)
    elif isinstance(error, OwnCancellation):
        got = "ours"
    else:
        assert isinstance(error, InternalError)
        got = "500"
    assert got == expected


def test_the_coordinators_own_cancellations_are_no_ones_failure(realtime_worker, tiny_ckpt, model_name):
    """A client that goes away mid-stream and an n > 1 fan-out whose other choices are stopped
    cancel worker calls; neither marks the instance or counts as a retry."""
    c = InProcessCoordinator(workers=[realtime_worker.address], model_dir=str(tiny_ckpt))
    try:
        wait_until(lambda: c.coordinator.table.candidates(model_name), what="the worker routable")
        body = {"model": model_name, "prompt": "x", "n": 3, "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=c.url, timeout=30) as http:
            with http.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                lines = response.iter_lines()
                while not next(lines).startswith("data: {"):
                    pass                                  # the choices are streaming; now go away
        wait_until(realtime_worker.idle, what="the worker aborted the three calls")
        retries = c.coordinator.metrics.retries
        assert sum(s.value for m in retries.collect() for s in m.samples if s.name.endswith("_total")) == 0
        assert_every_worker_serves(c, [realtime_worker], model_name)
    finally:
        c.stop()
