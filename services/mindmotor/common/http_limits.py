"""`limited_h11(limits)`: uvicorn's h11 protocol with the limits uvicorn does not have (the
coordinator's public API, the controller's admin API).

uvicorn closes idle keep-alive connections (`timeout_keep_alive`), caps a header block's size
(`h11_max_incomplete_event_size`) and sets the listen backlog, but a client that opens a
connection and sends its headers (or its body) a byte at a time holds the connection for as long
as it likes, and there is no cap on open connections that answers in the API's error shape. This
protocol adds, per connection:

- a header deadline: the request line and headers must be complete `header_timeout_s` after the
  connection opened, or after the first byte of a following request on a kept-alive connection;
- a body deadline: the body must be complete `body_timeout_s` after its headers;
  either one missed → `408` (OpenAI error JSON, `code: request_timeout`) and the connection closed;
- a connection limit: beyond `max_connections` open connections, a new one gets `503` with
  `Retry-After` (`code: too_many_connections`) once its request line and headers are in, then is
  closed;
- unambiguous framing: a request with both `Content-Length` and `Transfer-Encoding` (the classic
  request-smuggling shape: h11 would frame it by Transfer-Encoding, a proxy in front may have
  framed it by Content-Length) gets `400` (`code: ambiguous_framing`) and the connection is closed
  (RFC 9112 section 6.3), the app never sees it.

A refusal is a lingering close: the response, then the sending side shut (the client reads the
response and EOF), whatever else the client sends discarded for `LINGER_S`, then the close — an
immediate close with the client still sending would reset the connection and could destroy the
response before the client read it.

Once a request is complete nothing is timed here: generating the response (a long stream) takes
what it takes; after it, uvicorn's keep-alive timeout applies.

Pipelined requests (several sent before the first answer) are uvicorn's: answered one after the
other, in order (`tests/coordinator/test_http_pipelining.py`). A client that half-closes its side
(FIN) after its last request is taken as gone, as by uvicorn and most servers: the request still
being answered then is cancelled (that is what stops a generation whose client went away) and no
answer is written; one must keep its side open until it has read its answers.

It subclasses uvicorn's `H11Protocol` and reads its connection state (`conn`, `cycle`,
`connections`, the `app` it reads when a request's headers are complete), so a uvicorn upgrade is
checked by `tests/coordinator/test_http_limits.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Callable

import h11
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


def limited_h11(limits: HTTPLimits, on_refused: Callable[[str], None] | None = None) -> type[H11Protocol]:
    """The protocol class to give uvicorn (`uvicorn.Config(http=...)`). `on_refused(reason)` is
    called for every connection cut off: "header_timeout", "body_timeout", "too_many_connections" or
    "ambiguous_framing"."""

    class LimitedH11Protocol(H11Protocol):
        # uvicorn reads `self.app` once a request's headers are in (`self.headers` set), to start it
        @property
        def app(self):
            return self._refuse_ambiguous if ambiguous_framing(self.headers or []) else self._app

        @app.setter
        def app(self, app) -> None:
            self._app = app

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._deadline: asyncio.TimerHandle | None = None
            self._phase: str | None = None
            self._over_limit = bool(limits.max_connections) and len(self.connections) > limits.max_connections
            self._refused = False
            self._follow()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return                                  # lingering: read and dropped
            if self._over_limit:
                self._refuse_when_headers_are_in(data)
                return
            super().data_received(data)
            self._follow()

        def connection_lost(self, exc: Exception | None) -> None:
            self._set_deadline(None)
            super().connection_lost(exc)

        # ---- deadlines ----------------------------------------------------------------------
        def _follow(self) -> None:
            """Time the part of the request being read now (nothing once it is complete)."""
            if self.transport.is_closing() or self._refused:
                return
            state = self.conn.their_state
            self._set_deadline("headers" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None)

        def _set_deadline(self, phase: str | None) -> None:
            if phase == self._phase:
                return
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            self._phase = phase
            if phase is not None:
                timeout = limits.header_timeout_s if phase == "headers" else limits.body_timeout_s
                self._deadline = self.loop.call_later(timeout, self._expired, phase, timeout)

        def _expired(self, phase: str, timeout: float) -> None:
            self._deadline = None
            if self.transport.is_closing() or self._refused:
                return
            log.warning("HTTP client too slow; connection closed", extra={
                "phase": phase, "timeout_s": timeout, "client": "%s:%d" % self.client if self.client else None})
            if on_refused is not None:
                on_refused(f"{phase.rstrip('s')}_timeout")
            if self.cycle is not None and self.cycle.response_started:
                self.transport.close()
                return
            self._refuse(_error_response(408, "Request Timeout",
                                         f"the request's {phase} did not arrive within {timeout:g} s",
                                         "invalid_request_error", "request_timeout"))

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

        # ---- framing -----------------------------------------------------------------------
        async def _refuse_ambiguous(self, scope, receive, send) -> None:
            """The app uvicorn runs for a request with ambiguous framing: 400, then close."""
            if on_refused is not None:
                on_refused("ambiguous_framing")
            log.warning("HTTP request with both Content-Length and Transfer-Encoding refused", extra={
                "client": "%s:%d" % self.client if self.client else None})
            self.cycle.response_started = self.cycle.response_complete = True   # answered here
            self._refuse(_error_response(
                400, "Bad Request", "a request may not have both Content-Length and Transfer-Encoding",
                "invalid_request_error", "ambiguous_framing"))

        # ---- the connection limit -----------------------------------------------------------
        def _refuse_when_headers_are_in(self, data: bytes) -> None:
            self.conn.receive_data(data)
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                self.transport.close()
                return
            if event is h11.NEED_DATA:
                return                                  # the header deadline still runs
            if on_refused is not None:
                on_refused("too_many_connections")
            log.warning("too many HTTP connections; one refused", extra={"max_connections": limits.max_connections})
            self._refuse(_error_response(
                503, "Service Unavailable", f"the server has {limits.max_connections} open connections, "
                "its limit; retry later", "server_error", "too_many_connections", (("retry-after", "1"),)))

    return LimitedH11Protocol
