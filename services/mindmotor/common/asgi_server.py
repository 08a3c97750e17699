"""`Server`: uvicorn's server as MindMotor's services run it (the coordinator's public API, the
controller's admin API): on sockets the service bound itself (so port 0 works), without uvicorn's
own signal handling (the service handles SIGTERM/SIGINT), and over TLS with a handshake deadline.

uvicorn hands its TLS context to asyncio, which does each handshake on its own (the event loop
never waits on one) but gives a client 60 s to finish it, and uvicorn has no setting for that: a
connection that sends half a ClientHello holds a descriptor for a minute. Here the listening
sockets are served with `handshake_timeout_s` (default 10 s) instead; what happens after the
handshake (header and body deadlines, the connection limit) is the protocol's (`http_limits.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket

import uvicorn

HANDSHAKE_TIMEOUT_S = 10.0


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S):
        super().__init__(config)
        self.handshake_timeout_s = handshake_timeout_s

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's would re-raise the signal after shutdown (the process would not exit 0)."""
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is None or self.config.ssl is None:
            return await super().startup(sockets=sockets)
        # uvicorn's startup (the lifespan, its state) on no socket, then the sockets served here
        # with the handshake deadline; nothing awaits between the two, so no one sees `started`
        # before the sockets listen.
        await super().startup(sockets=[])
        protocol = functools.partial(self.config.http_protocol_class, config=self.config,
                                     server_state=self.server_state, app_state=self.lifespan.state)
        loop = asyncio.get_running_loop()
        for sock in sockets:
            self.servers.append(await loop.create_server(
                protocol, sock=sock, ssl=self.config.ssl, backlog=self.config.backlog,
                ssl_handshake_timeout=self.handshake_timeout_s))
