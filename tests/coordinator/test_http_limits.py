"""The coordinator's HTTP limits on real sockets against a `mindmotor coordinator` process: a client
that sends its headers (or its body) a byte at a time, or nothing at all, is cut off with 408 after
the configured deadline while other clients are served; connections beyond the limit get 503 with
Retry-After in the API's error shape; a slow but complete request is answered normally. On each of
uvicorn's HTTP parsers (h11, httptools)."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from .processes import HTTP_PROTOCOLS, CoordinatorProcess, wait_until

HEADER_S, BODY_S = 1.0, 1.5


@pytest.fixture(scope="module", params=HTTP_PROTOCOLS)
def limited(request, virtual_workers, tiny_ckpt, tmp_path_factory):
    c = CoordinatorProcess(tmp_path_factory.mktemp("http-limits") / "coordinator.log",
                           "--worker", virtual_workers[0].address, "--model-dir", str(tiny_ckpt),
                           "--http-header-timeout", str(HEADER_S), "--http-body-timeout", str(BODY_S),
                           "--http-max-connections", "4", "--http-protocol", request.param)
    yield c
    c.stop()


def connect(c) -> socket.socket:
    """A raw connection; its 15 s timeout is only a backstop (the deadlines under test are shorter)."""
    return socket.create_connection(("127.0.0.1", c.port), timeout=15)


def read_to_close(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def error_of(raw: bytes, status: int) -> dict:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), raw[:200]
    return json.loads(body)["error"]


def trickle(s: socket.socket, data: bytes, stop: threading.Event) -> None:
    """Send `data` a byte at a time, one byte per 0.2 s, until it is all sent or the server closes."""
    for byte in data:
        if stop.wait(0.2):
            return
        try:
            s.sendall(bytes([byte]))
        except OSError:
            return


def refused(c, reason: str) -> float:
    text = httpx.get(c.url + "/metrics", timeout=5).text
    line = next((l for l in text.splitlines()
                 if l.startswith(f'mindmotor_coordinator_http_refused_total{{reason="{reason}"}}')), None)
    return float(line.split()[-1]) if line else 0.0


def test_headers_sent_byte_by_byte_are_cut_off_after_the_header_timeout(limited):
    before = refused(limited, "header_timeout")
    s, stop = connect(limited), threading.Event()
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Padding: " + b"a" * 200 + b"\r\n\r\n"   # ~48 s at this pace
    sender = threading.Thread(target=trickle, args=(s, request, stop), daemon=True)
    sender.start()
    with httpx.Client(base_url=limited.url, timeout=10) as http:          # meanwhile others are served
        assert http.get("/health").status_code == 200
    raw = read_to_close(s)
    stop.set()
    sender.join()
    error = error_of(raw, 408)
    assert error["code"] == "request_timeout" and "headers" in error["message"]
    s.close()
    wait_until(lambda: refused(limited, "header_timeout") == before + 1, timeout=5)


def test_a_silent_connection_is_closed_after_the_header_timeout(limited):
    s = connect(limited)
    assert error_of(read_to_close(s), 408)["code"] == "request_timeout"
    s.close()


def test_a_body_sent_byte_by_byte_is_cut_off_after_the_body_timeout(limited):
    s, stop = connect(limited), threading.Event()
    body = json.dumps({"model": "m", "prompt": "x" * 200}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    sender = threading.Thread(target=trickle, args=(s, body, stop), daemon=True)
    sender.start()
    error = error_of(read_to_close(s), 408)
    stop.set()
    sender.join()
    assert error["code"] == "request_timeout" and "body" in error["message"]
    s.close()


def test_a_complete_request_on_a_kept_alive_connection_is_answered(limited, model_name):
    with httpx.Client(base_url=limited.url, timeout=30) as http:
        for _ in range(2):                                                # the same connection twice
            response = http.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 3})
            assert response.status_code == 200


def read_response(s: socket.socket) -> bytes:
    """One response (headers and a Content-Length body) off a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(l.split(b":")[1]) for l in head.lower().split(b"\r\n") if l.startswith(b"content-length:"))
    while len(body) < length:
        body += s.recv(65536)
    return head


def test_connections_beyond_the_limit_get_503_with_retry_after(limited):
    held = [connect(limited) for _ in range(4)]                          # the limit: 4 open connections
    for s in held:                                                       # answered, then kept alive (idle)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s).startswith(b"HTTP/1.1 200")
    try:
        s = connect(limited)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = read_to_close(s)
        s.close()
        assert b"retry-after: 1" in raw.lower()
        assert error_of(raw, 503)["code"] == "too_many_connections"
    finally:
        for s in held:
            s.close()
    with httpx.Client(base_url=limited.url, timeout=10) as http:       # the held ones closed: served again
        wait_until(lambda: http.get("/health").status_code == 200, timeout=5)
    assert refused(limited, "too_many_connections") == 1
