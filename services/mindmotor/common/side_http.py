"""`SideHTTPServer`: the HTTP(S) server of a service's Prometheus /metrics side port, which a
connection that never finishes cannot freeze.

prometheus_client's own server wraps the listening socket in TLS, so each handshake happens in its
single accept loop with no timeout: one idle TCP connection (or a half-sent ClientHello) and no
later scrape is answered — `mindmotor up`'s liveness probe then SIGKILLs a healthy service. Here
the accept loop only accepts; each connection gets its own thread, which does the TLS handshake,
reads the one request (HTTP/1.0: a connection carries one request) and answers it. Per connection:

- a deadline: handshake, request and response must be done within `timeout_s` of the accept, or
  the connection is cut off (every socket operation times out too; a sweep on the accept loop's
  thread shuts down a connection past its deadline even if it is trickling bytes);
- a cap: at most `max_connections` connections are served at once (one thread each); a new one
  beyond the cap cuts off the oldest, so connections held open by someone cost at most `timeout_s`
  of one of the places each and cannot keep a scrape (which takes milliseconds) from being served.

What serves the request is a WSGI app (prometheus_client's `make_wsgi_app`), run by the standard
library's `wsgiref` handler, as in prometheus_client.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from socketserver import BaseServer
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

log = logging.getLogger("mindmotor.side_http")

TIMEOUT_S = 10.0          # a connection's whole life: TLS handshake, request, response
MAX_CONNECTIONS = 32      # served at once, one thread each; a new one beyond cuts off the oldest


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):   # noqa: A002 - the base class's signature
        """No access log line per scrape."""


class _Connection:
    __slots__ = ("sock", "deadline")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.deadline = deadline


class SideHTTPServer(WSGIServer):
    """A WSGI server for side ports: TLS with `tls` (an ssl.SSLContext; None: plain HTTP), one thread
    per connection, a deadline and a cap per connection (module docstring). Serve it with
    `serve_forever()` on a thread of its own; `shutdown()` stops it."""

    request_queue_size = 128      # the listen backlog: connections wait there, not in threads

    def __init__(self, host: str, port: int, app, tls: ssl.SSLContext | None = None,
                 timeout_s: float = TIMEOUT_S, max_connections: int = MAX_CONNECTIONS):
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        self.tls = tls
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._open: dict[_Connection, None] = {}      # insertion order: the oldest first
        self._lock = threading.Lock()
        super().__init__(address[:2], _QuietHandler)
        self.set_app(app)

    # ---- the accept loop's thread -----------------------------------------------------------
    def process_request(self, request: socket.socket, client_address) -> None:
        """Register the connection (cutting off the oldest beyond the cap) and serve it on a thread."""
        connection = _Connection(request, time.monotonic() + self.timeout_s)
        with self._lock:
            while len(self._open) >= self.max_connections:
                oldest = next(iter(self._open))
                self._cut_off(oldest, "too many connections")
            self._open[connection] = None
        threading.Thread(target=self._serve, args=(connection, client_address), daemon=True,
                         name="side-http").start()

    def service_actions(self) -> None:
        """Called by `serve_forever` between accepts (at least every 0.5 s): cut off the late ones."""
        now = time.monotonic()
        with self._lock:
            for connection in [c for c in self._open if c.deadline < now]:
                self._cut_off(connection, "deadline")

    def _cut_off(self, connection: _Connection, why: str) -> None:
        """Shut the connection down (its thread's blocked read or write returns at once and the
        thread ends). Called with the lock held, while the connection is registered: its thread
        closes the socket only after unregistering it, so the descriptor is still this socket's."""
        del self._open[connection]
        if why != "server closed":
            log.warning("side port connection cut off", extra={
                "reason": why, "timeout_s": self.timeout_s, "max_connections": self.max_connections})
        try:
            socket.socket.shutdown(connection.sock, socket.SHUT_RDWR)   # the fd, not the TLS layer
        except OSError:
            pass

    # ---- the connection's thread ------------------------------------------------------------
    def _serve(self, connection: _Connection, client_address) -> None:
        try:
            connection.sock.settimeout(self.timeout_s)
            if self.tls is not None:
                with self._lock:
                    if connection not in self._open:
                        return                          # cut off before it started
                    connection.sock = self.tls.wrap_socket(connection.sock, server_side=True,
                                                           do_handshake_on_connect=False)
                connection.sock.do_handshake()
            self.finish_request(connection.sock, client_address)
        except OSError as exc:                          # timed out, cut off, bad handshake, gone
            log.debug("side port connection failed", extra={"error": repr(exc)})
        except Exception:                               # noqa: BLE001 - the handler's own bug: logged
            log.exception("side port request failed")
        finally:
            with self._lock:
                self._open.pop(connection, None)
            self.shutdown_request(connection.sock)

    def server_close(self) -> None:
        super().server_close()
        with self._lock:
            for connection in list(self._open):
                self._cut_off(connection, "server closed")


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context for the certificate and key, TLS 1.2 at least, no client certificate asked."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def start(server: BaseServer) -> threading.Thread:
    """Serve on a daemon thread."""
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="side-http-accept")
    thread.start()
    return thread
