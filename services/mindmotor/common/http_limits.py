"""`limited_protocol(limits, on_refused, "h11" | "httptools")`: uvicorn's HTTP/1.1 protocol, on
either of its parsers, with the limits uvicorn does not have (the coordinator's public API, the
controller's admin API).

uvicorn closes idle keep-alive connections (`timeout_keep_alive`), caps a header block's size
(`h11_max_incomplete_event_size`, h11 only) and sets the listen backlog, but a client that opens a
connection and sends its headers (or its body) a byte at a time holds the connection for as long
as it likes, and there is no cap on open connections that answers in the API's error shape. This
protocol adds, per connection:

- a header deadline: the request line and headers must be complete `header_timeout_s` after the
  connection opened, or after the first byte of a following request on a kept-alive connection
  (for a pipelined request: once the responses before it are written);
- a body deadline: the body must be complete `body_timeout_s` after its headers;
  either one missed → `408` (OpenAI error JSON, `code: request_timeout`) and the connection closed;
- a connection limit: beyond `max_connections` open connections, a new one gets `503` with
  `Retry-After` (`code: too_many_connections`) once its request line and headers are in, then is
  closed;
- unambiguous framing: a request with both `Content-Length` and `Transfer-Encoding` (the classic
  request-smuggling shape: h11 would frame it by Transfer-Encoding, a proxy in front may have
  framed it by Content-Length) gets `400` (`code: ambiguous_framing`) and the connection is closed
  (RFC 9112 section 6.3), the app never sees it (httptools' parser refuses it itself: `400`,
  `code: invalid_request`, as for any request uvicorn cannot parse);
- the header-size cap of h11 also with httptools (whose parser has none).

A refusal is a lingering close: the response, then the sending side shut (the client reads the
response and EOF), whatever else the client sends discarded for `LINGER_S`, then the close — an
immediate close with the client still sending would reset the connection and could destroy the
response before the client read it.

Once a request is complete nothing is timed here: generating the response (a long stream) takes
what it takes; after it, uvicorn's keep-alive timeout applies.

Pipelined requests (several sent before the first answer) are uvicorn's: answered one after the
other, in order (`tests/coordinator/test_http_pipelining.py`). A client that shuts its sending
side (FIN) is taken as gone, as by uvicorn — that is what stops a generation whose client went
away — except on a connection it pipelined on (it sent a request while an answer was being
written): there the FIN is a half-close (`printf 'req1 req2' | nc`), every request received is
answered in order, then the connection is closed. uvicorn alone wrote the first answer and
dropped the second.

How it fits either parser: the limits (`_Limits`) use only what uvicorn's two protocol classes
share — `connection_made`/`data_received`/`on_response_complete`/`connection_lost`,
`send_400_response`, the request `cycle`, `connections`, and `self.app`, which both read exactly
once per request when its headers are complete (a refusal is an app run in its place); the one
thing each parser knows its own way — what the client still owes, headers or body — comes from a
small class per parser (`_H11Reading`: h11's states; `_HttpToolsReading`: the parser's
callbacks). It reads uvicorn's internals, so a uvicorn upgrade is checked by
`tests/coordinator/test_http_limits.py` and `test_http_pipelining.py`, on both parsers where
httptools is installed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Callable

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("mindmotor.http")

LINGER_S = 2.0


@dataclass(frozen=True)
class HTTPLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 0          # 0: no limit


def _error_response(status: int, reason: str, message: str, type_: str, code: str,
                    extra_headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close", *(f"{k}: {v}" for k, v in extra_headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def ambiguous_framing(headers: list[tuple[bytes, bytes]]) -> bool:
    """Both Content-Length and Transfer-Encoding (names as uvicorn gives them: lower case)."""
    names = {name for name, _ in headers}
    return b"content-length" in names and b"transfer-encoding" in names


PROTOCOLS = ("h11", "httptools")


def resolve_protocol(protocol: str = "auto") -> str:
    """"auto": httptools where it is installed (as `uvicorn[standard]` picks it: a C parser), else h11."""
    if protocol != "auto":
        return protocol
    import importlib.util

    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def limited_protocol(limits: HTTPLimits, on_refused: Callable[[str], None] | None = None,
                     protocol: str = "h11") -> type:
    """The protocol class to give uvicorn (`uvicorn.Config(http=...)`): uvicorn's `protocol` ("h11",
    or "httptools", which needs the httptools package) with the limits. `on_refused(reason)` is
    called for every connection cut off: "header_timeout", "body_timeout", "too_many_connections",
    "ambiguous_framing" or "invalid_request". "auto": `resolve_protocol`."""
    protocol = resolve_protocol(protocol)
    if protocol == "h11":
        return type("LimitedH11Protocol", (_Limits, _H11Reading, H11Protocol),
                    {"limits": limits, "on_refused": staticmethod(on_refused)})
    if protocol == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return type("LimitedHttpToolsProtocol", (_Limits, _HttpToolsReading, HttpToolsProtocol),
                    {"limits": limits, "on_refused": staticmethod(on_refused)})
    raise ValueError(f"HTTP protocol {protocol!r}: expected one of {PROTOCOLS}")


def limited_h11(limits: HTTPLimits, on_refused: Callable[[str], None] | None = None) -> type:
    """`limited_protocol` on h11 (uvicorn's pure-Python parser: no package beyond uvicorn's own)."""
    return limited_protocol(limits, on_refused, "h11")


class _H11Reading:
    """What the client owes, read off h11's state. h11 parses a pipelined request only once the
    previous response is complete, so nothing is owed while a response is being written."""

    def _owed(self) -> str | None:
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            return "body"
        if state is h11.IDLE and (self.cycle is None or self.conn.trailing_data[0]):
            return "headers"            # a new connection, or the start of a following request
        return None

    def _pipelining_now(self) -> bool:
        """Bytes of a following request arrived while an answer is being written."""
        return self.cycle is not None and not self.cycle.response_complete and bool(self.conn.trailing_data[0])

    def _queued(self) -> bool:
        return bool(self.conn.trailing_data[0])


class _HttpToolsReading:
    """What the client owes, followed through httptools' parser callbacks. httptools parses
    pipelined requests as they come and queues them (`pipeline`); what a queued request still owes
    is not timed until the responses before it are complete, as with h11. llhttp has no cap on the
    request line and headers: the one h11 has (`h11_max_incomplete_event_size`) is applied here."""

    _reading: str | None = "headers"
    _head_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading, self._head_bytes = "headers", 0

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading = "body"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = None

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        cap = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        if self._head_bytes > cap:
            raise ValueError(f"request line and headers over {cap} bytes")   # → send_400_response

    def _owed(self) -> str | None:
        if self._reading == "headers" and self.cycle is not None and not self.cycle.response_complete:
            return None                 # a pipelined request, behind a response being written
        if self._reading == "body" and self.pipeline:
            return None
        return self._reading

    def _pipelining_now(self) -> bool:
        return bool(self.pipeline)

    def _queued(self) -> bool:
        return bool(self.pipeline)


class _Limits:
    """The limits, on top of a uvicorn protocol and a `_...Reading` class saying what is owed."""

    limits: HTTPLimits
    on_refused: Callable[[str], None] | None

    # uvicorn reads `self.app` once per request, when its headers are in, to start it
    @property
    def app(self):
        if self._over_limit:
            return self._answer(503, "Service Unavailable", f"the server has {self.limits.max_connections} "
                                "open connections, its limit; retry later", "server_error",
                                "too_many_connections", (("retry-after", "1"),))
        if ambiguous_framing(self.headers or []):
            return self._answer(400, "Bad Request", "a request may not have both Content-Length and "
                                "Transfer-Encoding", "invalid_request_error", "ambiguous_framing")
        return self._app

    @app.setter
    def app(self, app) -> None:
        self._app = app

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None
        self._pipelined = False                 # the client sent a request while an answer was written
        self._half_closed = False               # ... and then shut its side: answer, then close
        limit = self.limits.max_connections
        self._over_limit = bool(limit) and len(self.connections) > limit
        self._refused = False
        self._follow()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return                                  # lingering: read and dropped
        super().data_received(data)
        self._pipelined = self._pipelined or self._pipelining_now()
        self._follow()

    def eof_received(self) -> bool | None:
        """The client shut its side. On a connection it pipelined on, a half-close: keep writing
        (True) until every request received is answered. Otherwise it is gone (uvicorn's reading:
        the answer under way is dropped, a generation stopped)."""
        if self._pipelined and not self._refused:
            self._half_closed = True
            self._close_when_answered()
            return True
        return super().eof_received()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()                              # a pipelined request may be owing now
        self._close_when_answered()

    def _close_when_answered(self) -> None:
        if self._half_closed and (self.cycle is None or self.cycle.response_complete) and not self._queued():
            self._set_deadline(None)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_deadline(None)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, as an API error and a lingering close."""
        self._refused_for("invalid_request", "HTTP request not understood")
        self._refuse(_error_response(400, "Bad Request", "invalid HTTP request", "invalid_request_error",
                                     "invalid_request"))

    # ---- deadlines --------------------------------------------------------------------------
    def _follow(self) -> None:
        """Time the part of the request the client owes now (nothing while it owes nothing)."""
        if self.transport.is_closing() or self._refused:
            return
        self._set_deadline(self._owed())

    def _set_deadline(self, phase: str | None) -> None:
        if phase == self._phase:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None:
            timeout = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
            self._deadline = self.loop.call_later(timeout, self._expired, phase, timeout)

    def _expired(self, phase: str, timeout: float) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._refused:
            return
        log.warning("HTTP client too slow; connection closed", extra={
            "phase": phase, "timeout_s": timeout, "client": "%s:%d" % self.client if self.client else None})
        if self.on_refused is not None:
            self.on_refused(f"{phase.rstrip('s')}_timeout")
        if self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete:
            self.transport.close()                  # mid-answer: no room for a 408
            return
        self._refuse(_error_response(408, "Request Timeout",
                                     f"the request's {phase} did not arrive within {timeout:g} s",
                                     "invalid_request_error", "request_timeout"))

    # ---- refusals ---------------------------------------------------------------------------
    def _answer(self, status: int, reason: str, message: str, type_: str, code: str,
                extra_headers: tuple[tuple[str, str], ...] = ()):
        """An app for uvicorn to run instead of the real one: the error and a lingering close,
        written here; it returns once the connection is gone (so uvicorn adds no answer of its own)."""
        response = _error_response(status, reason, message, type_, code, extra_headers)

        async def refuse(scope, receive, send) -> None:
            self._refused_for(code, message)
            self._refuse(response)
            while (await receive())["type"] != "http.disconnect":
                pass

        return refuse

    def _refused_for(self, reason: str, message: str) -> None:
        if self.on_refused is not None:
            self.on_refused(reason)
        log.warning("HTTP request refused", extra={
            "reason": reason, "detail": message, "client": "%s:%d" % self.client if self.client else None})

    def _refuse(self, response: bytes) -> None:
        """Answer, shut the sending side, drop what still comes for LINGER_S, close."""
        self._set_deadline(None)
        self._refused = True
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()
