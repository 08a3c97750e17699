"""A client that goes away cancels its request on the worker (streaming or not)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from .processes import wait_until


@pytest.fixture
def rt_coordinator(make_coordinator, realtime_worker):
    return make_coordinator(workers=[realtime_worker.address])


LONG = {"max_tokens": 600, "ignore_eos": True}      # ~9 s on the realtime worker: cut short below


def test_closing_a_stream_aborts_the_request_on_the_worker(rt_coordinator, realtime_worker, model_name):
    body = {"model": model_name, "prompt": "go on and on", "stream": True, **LONG}
    with httpx.Client(base_url=rt_coordinator.url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            for _ in range(6):
                next(lines)
            assert realtime_worker.status().load.running == 1
    wait_until(realtime_worker.idle, timeout=5)
    outstanding = rt_coordinator.coordinator.admission.outstanding
    wait_until(lambda: outstanding.get(model_name) == 0, timeout=5)
    wait_until(lambda: "request cancelled by the client" in realtime_worker.log_text(), timeout=5)


def test_going_away_before_a_non_streaming_answer_aborts_too(rt_coordinator, realtime_worker, model_name):
    body = json.dumps({"model": model_name, "messages": [{"role": "user", "content": "long answer"}], **LONG})
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    with socket.create_connection(("127.0.0.1", rt_coordinator.port)) as sock:
        sock.sendall(request)
        wait_until(lambda: realtime_worker.status().load.running == 1, timeout=5)
    wait_until(realtime_worker.idle, timeout=5)
    wait_until(lambda: rt_coordinator.coordinator.admission.outstanding.get(model_name) == 0, timeout=5)
