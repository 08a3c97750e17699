"""Connections that stall a TLS server, for the side-port tests: silent ones and ones that sent half
a ClientHello, held open; and whether the server cut one off."""

from __future__ import annotations

import contextlib
import socket
import ssl


def client_hello() -> bytes:
    """The first flight of a real TLS client (its ClientHello)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@contextlib.contextmanager
def stalled(port: int, count: int = 1):
    """`count` silent connections and `count` half-sent ClientHellos to `port`, held open
    (yielded: [silent, half, silent, half, ...])."""
    held = []
    try:
        for _ in range(count):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            half = socket.create_connection(("127.0.0.1", port), timeout=30)
            half.sendall(client_hello()[:40])
            held.append(half)
        yield held
    finally:
        for s in held:
            s.close()


def closed_by_server(s: socket.socket) -> bool:
    """Blocks until the server ends the connection (or the socket's timeout)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
