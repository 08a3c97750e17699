"""uvicorn as the services run it (common/asgi_server.py) over real TLS: a client that never
finishes its handshake (silent, or half a ClientHello) is cut off at the handshake deadline instead
of asyncio's 60 s, and is served around meanwhile."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from mindmotor.common import certs
from mindmotor.common.asgi_server import Server
from mindmotor.common.http_limits import HTTPLimits, limited_h11
from mindmotor.common.waiting import wait_until
from secrets_registry import given_private_key
from stalled_tls import client_hello, closed_by_server

DEADLINE_S = 0.5


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> certs.CertPaths:
    paths = certs.ensure_cluster_pki(tmp_path_factory.mktemp("asgi-tls"), {"controller-a": "controller"})
    given_private_key(paths["controller-a"].key)
    return paths["controller-a"]


@pytest.fixture(scope="module")
def https_port(pki):
    app = Starlette(routes=[Route("/health", lambda request: PlainTextResponse("ok"))])
    server = Server(uvicorn.Config(app, log_config=None, lifespan="off", ssl_certfile=str(pki.cert),
                                   ssl_keyfile=str(pki.key), http=limited_h11(HTTPLimits(header_timeout_s=5))),
                    handshake_timeout_s=DEADLINE_S)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=10)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=10)


def test_an_unfinished_handshake_is_cut_off_at_the_deadline_and_others_are_served(https_port, pki):
    with socket.create_connection(("127.0.0.1", https_port), timeout=10) as idle, \
            socket.create_connection(("127.0.0.1", https_port), timeout=10) as half:
        half.sendall(client_hello()[:40])
        response = httpx.get(f"https://127.0.0.1:{https_port}/health", timeout=5,
                             verify=ssl.create_default_context(cafile=str(pki.ca)))
        assert response.status_code == 200
        started = time.monotonic()
        assert closed_by_server(idle) and closed_by_server(half)
        assert time.monotonic() - started < 5          # the deadline (0.5 s), not asyncio's 60 s
