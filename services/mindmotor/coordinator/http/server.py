"""Run the coordinator on uvicorn: bind (port 0 picks a free one) or take over an inherited
listening socket (`listen_fd`: the replicas under `mindmotor up` all accept from one socket that
`up` holds, so a replica that dies refuses no connection), optionally a socket of its own
(`replica_port`), serve (HTTPS with `https_cert`/`https_key`, TLS 1.2 at least), print
`MINDMOTOR_COORDINATOR_READY port=N [replica_port=M]` once serving; SIGTERM/SIGINT stop it
gracefully (uvicorn stops accepting, lets open responses finish for up to `GRACEFUL_S`)."""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import sys

import uvicorn

from mindmotor.common.asgi_server import Server
from mindmotor.common.http_limits import HTTPLimits, limited_protocol

from mindmotor.coordinator.app import create_app
from mindmotor.coordinator.config import CoordinatorSettings, ready_line

GRACEFUL_S = 30


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only for sockets whose
    # protocol says TCP; without it every response waits ~40 ms for the client's delayed ACK
    # (uvicorn writes the headers and the body separately).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _tls12_at_least(config: uvicorn.Config, default_factory) -> ssl.SSLContext:
    """uvicorn's server context for the certificate and key, refusing anything older than TLS 1.2."""
    context = default_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def make_server(app, log_level: str = "warning", settings: CoordinatorSettings | None = None) -> uvicorn.Server:
    """uvicorn with the coordinator's HTTP limits (`settings`; None: the defaults): keep-alive,
    header and body deadlines, header size, connection limit, listen backlog; HTTPS (TLS 1.2 at
    least, the handshake within the header timeout) when the settings name a certificate and key.
    Without uvicorn's signal handling: `serve` below handles the signals."""
    s = settings or CoordinatorSettings.model_construct()
    limits = HTTPLimits(header_timeout_s=s.http_header_timeout_s, body_timeout_s=s.http_body_timeout_s,
                        max_connections=s.http_max_connections)
    coordinator = getattr(app.state, "coordinator", None)          # create_app's; None: a bare app
    on_refused = (lambda reason: coordinator.metrics.http_refused.labels(reason).inc()) if coordinator else None
    tls = dict(ssl_certfile=s.https_cert, ssl_keyfile=s.https_key, ssl_context_factory=_tls12_at_least) \
        if s.https_cert else {}
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", log_level=log_level.lower(),
                            timeout_graceful_shutdown=GRACEFUL_S, timeout_keep_alive=s.http_keep_alive_s,
                            h11_max_incomplete_event_size=s.http_max_header_bytes, backlog=s.http_backlog,
                            http=limited_protocol(limits, on_refused, s.http_protocol), **tls)
    return Server(config, handshake_timeout_s=s.http_header_timeout_s)


def _on_signal(server: uvicorn.Server) -> None:
    """The first SIGTERM/SIGINT stops gracefully, a second one at once."""
    if server.should_exit:
        server.force_exit = True
    server.should_exit = True


def listening_sockets(settings: CoordinatorSettings) -> list[socket.socket]:
    """The public socket (bound here, or inherited: `listen_fd`), then this process's own
    (`replica_port`), if asked for."""
    if settings.listen_fd is not None:
        public = socket.socket(fileno=settings.listen_fd)     # a replica: every replica accepts from it
    else:
        public = bind_socket(settings.host, settings.port)
    if settings.replica_port is None:
        return [public]
    return [public, bind_socket(settings.host, settings.replica_port)]


async def serve(settings: CoordinatorSettings) -> int:
    sockets = listening_sockets(settings)
    ports = [s.getsockname()[1] for s in sockets]
    server = make_server(create_app(settings), settings.log_level, settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, server)
    task = asyncio.create_task(server.serve(sockets=sockets))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        print(ready_line(ports[0], ports[1] if len(ports) > 1 else None), file=sys.stdout, flush=True)
    await task
    return 0 if server.started else 1
