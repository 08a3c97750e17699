"""A non-streamed request goes to its worker as one unary call (GenerateUnary): the same answer as
streamed, the worker's refusal as OpenAI's error JSON, and a client that goes away cancels the
call (the worker aborts the request)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from .processes import wait_until


class CallLog:
    """Which Worker RPCs a coordinator made (its stubs' methods wrapped: the real calls still go out)."""

    def __init__(self, coordinator):
        self.calls: list[str] = []
        channels = coordinator.coordinator.channels
        make_stub = channels.stub

        def stub(address):
            real = make_stub(address)
            return _Spy(real, self.calls)

        channels.stub = stub


class _Spy:
    def __init__(self, stub, calls):
        self._stub, self._calls = stub, calls

    def __getattr__(self, name):
        method = getattr(self._stub, name)

        def call(*args, **kwargs):
            self._calls.append(name)
            return method(*args, **kwargs)
        return call


@pytest.fixture
def spied(make_coordinator, virtual_workers):
    c = make_coordinator(workers=[w.address for w in virtual_workers])
    return c, CallLog(c)


def test_a_non_streamed_request_is_one_unary_call_with_the_streamed_answer(spied, model_name):
    c, log = spied
    body = {"model": model_name, "prompt": "one answer", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    with httpx.Client(base_url=c.url, timeout=30) as http:
        whole = http.post("/v1/completions", json=body)
        streamed = http.post("/v1/completions", json={**body, "stream": True})
    assert whole.status_code == 200 and streamed.status_code == 200
    assert log.calls.count("GenerateUnary") == 1 and log.calls.count("Generate") == 1

    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    text = "".join(ch["choices"][0]["text"] for ch in chunks if ch.get("choices"))
    choice = whole.json()["choices"][0]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == 8
    assert whole.json()["usage"]["completion_tokens"] == 8


def test_a_refusal_of_the_unary_call_is_openai_error_json(spied, model_name):
    c, log = spied
    with httpx.Client(base_url=c.url, timeout=30) as http:
        # ids the coordinator cannot check (no vocabulary here): the worker's vocabulary refuses them
        r = http.post("/v1/completions", json={"model": model_name, "prompt": [3, 2_000_000_000], "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "vocabulary" in error["message"]
    assert error["param"] == "prompt"
    assert "GenerateUnary" in log.calls and "Generate" not in log.calls


def test_going_away_cancels_the_unary_call(make_coordinator, realtime_worker, model_name):
    c = make_coordinator(workers=[realtime_worker.address])
    log = CallLog(c)
    body = json.dumps({"model": model_name, "prompt": "a long one", "max_tokens": 600, "ignore_eos": True})
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    with socket.create_connection(("127.0.0.1", c.port)) as sock:
        sock.sendall(request)
        wait_until(lambda: realtime_worker.status().load.running == 1, timeout=10)
    wait_until(realtime_worker.idle, timeout=5)
    wait_until(lambda: c.coordinator.admission.outstanding.get(model_name) == 0, timeout=5)
    assert log.calls == ["GenerateUnary"]
