"""HTTP/1.1 on one raw connection to the real coordinator app: pipelined requests (all sent before
the first answer) are each answered, in order; a request with both Content-Length and
Transfer-Encoding is refused with 400 in the API's error shape and the connection closed, so a
request smuggled behind it is never answered. On each of uvicorn's HTTP parsers (h11, httptools)."""

from __future__ import annotations

import json
import socket

import pytest

from .processes import HTTP_PROTOCOLS, InProcessCoordinator


@pytest.fixture(scope="module", params=HTTP_PROTOCOLS)
def served(request, virtual_workers, tiny_ckpt):
    """A coordinator over the virtual workers on uvicorn's `request.param` parser."""
    c = InProcessCoordinator(workers=[w.address for w in virtual_workers], model_dir=str(tiny_ckpt),
                             http_protocol=request.param)
    yield c
    c.stop()


def connect(c) -> socket.socket:
    return socket.create_connection(("127.0.0.1", c.port), timeout=15)


def read_answers(s: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """`count` Content-Length responses off the connection, as (status line, body)."""
    answers, data = [], b""
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, f"the connection closed after {len(answers)} answers"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        while len(data) < length:
            chunk = s.recv(65536)
            assert chunk, "the connection closed in a body"
            data += chunk
        answers.append((head.split(b"\r\n")[0], data[:length]))
        data = data[length:]
    return answers


def read_to_close(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def completion(model: str, prompt: str) -> bytes:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


def test_pipelined_requests_are_each_answered_in_order(served, model_name):
    with connect(served) as s:
        # the completion takes longer than /health: its answer must still come first
        s.sendall(completion(model_name, "one") + HEALTH + MODELS + completion(model_name, "two"))
        (first, body1), (second, body2), (third, body3), (fourth, body4) = read_answers(s, 4)
    assert first.startswith(b"HTTP/1.1 200") and json.loads(body1)["object"] == "text_completion"
    assert second.startswith(b"HTTP/1.1 ") and "instances" in json.loads(body2)           # /health
    assert third.startswith(b"HTTP/1.1 200") and json.loads(body3)["object"] == "list"    # /v1/models
    assert fourth.startswith(b"HTTP/1.1 200") and json.loads(body4)["object"] == "text_completion"


def test_a_request_pipelined_while_the_first_is_answered_is_answered_too(served, model_name):
    with connect(served) as s:
        s.sendall(completion(model_name, "first"))
        s.sendall(MODELS)                           # a separate segment, most likely mid-generation
        (first, _), (second, body) = read_answers(s, 2)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["object"] == "list"


def test_content_length_with_transfer_encoding_is_400_and_closes(served, model_name):
    body = json.dumps({"model": model_name, "prompt": "x"}).encode()
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    with connect(served) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body) + chunked + smuggled)
        raw = read_to_close(s)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head.lower()
    error = json.loads(rest)["error"]
    assert error["type"] == "invalid_request_error"       # code: ambiguous_framing (h11), invalid_request
    assert error["code"] in ("ambiguous_framing", "invalid_request")   # (httptools' llhttp refuses it itself)
    assert raw.count(b"HTTP/1.1 ") == 1                      # nothing answered the smuggled request
    with connect(served) as s:                          # and the coordinator serves on
        s.sendall(MODELS)
        assert read_answers(s, 1)[0][0].startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("protocol", HTTP_PROTOCOLS)
def test_a_pipelined_request_left_unfinished_is_timed_only_once_the_stream_before_it_ends(
        protocol, realtime_worker, tiny_ckpt, model_name):
    """The header deadline (1 s here) of a pipelined request does not run while the ~2 s stream
    before it is written (cutting it off would lose an answer the client is reading); it runs after."""
    c = InProcessCoordinator(workers=[realtime_worker.address], model_dir=str(tiny_ckpt), http_protocol=protocol,
                             http_header_timeout_s=1.0)
    try:
        body = json.dumps({"model": model_name, "prompt": "x", "max_tokens": 150, "ignore_eos": True,
                           "stream": True}).encode()
        with connect(c) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body + b"GET /health HTTP/1.1\r\nHo")
            raw = read_to_close(s)
    finally:
        c.stop()
    stream, _, refusal = raw.partition(b"data: [DONE]\n\n")
    assert stream.startswith(b"HTTP/1.1 200 ") and b'"finish_reason":"length"' in stream   # all of it
    assert b"HTTP/1.1 408 " in refusal and b"request_timeout" in refusal


def test_pipelined_requests_then_a_half_close_are_each_answered(served, model_name):
    """`printf 'req1 req2' | nc`: the client shuts its side after the last request; every request
    is still answered, in order, then the connection closes (uvicorn alone dropped the second)."""
    with connect(served) as s:
        s.sendall(completion(model_name, "one") + completion(model_name, "two") + MODELS)
        s.shutdown(socket.SHUT_WR)
        data = read_to_close(s)
    assert data.count(b"HTTP/1.1 200") == 3, data[:600]
    assert data.index(b'"text_completion"') < data.rindex(b'"object":"list"')
