"""The side ports' HTTPS server (common/side_http.py, behind `https_side.serve_metrics`) on real
sockets and real TLS: connections that never finish (a silent TCP connection, a half-sent TLS
ClientHello) neither block a scrape nor hold a thread past the deadline, and connections beyond
the cap cut off the oldest instead of refusing the newcomer."""

from __future__ import annotations

import ssl
import threading
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app

from mindmotor.common import certs, side_http
from mindmotor.common.https_side import serve_metrics
from mindmotor.common.waiting import wait_until
from secrets_registry import given_private_key
from stalled_tls import closed_by_server, stalled


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> certs.CertPaths:
    paths = certs.ensure_cluster_pki(tmp_path_factory.mktemp("side-http"), {"worker-a": "worker"})["worker-a"]
    given_private_key(paths.key)
    return paths


@pytest.fixture(scope="module")
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("side_http_test", "a sample to scrape", ["name"], registry=registry).labels("x").inc()
    return registry


def scrape(port: int, pki: certs.CertPaths, timeout: float = 3.0) -> str:
    response = httpx.get(f"https://127.0.0.1:{port}/metrics", timeout=timeout,
                         verify=ssl.create_default_context(cafile=str(pki.ca)))
    assert response.status_code == 200
    return response.text


def test_a_silent_connection_and_a_half_handshake_do_not_block_a_scrape(pki, registry):
    server, port = serve_metrics("127.0.0.1", 0, registry, files=(str(pki.cert), str(pki.key)))
    try:
        with stalled(port):
            assert 'side_http_test_total{name="x"} 1.0' in scrape(port, pki)
    finally:
        server.shutdown()
        server.server_close()


def test_a_stalled_connection_is_cut_off_at_the_deadline(pki, registry):
    server = side_http.SideHTTPServer("127.0.0.1", 0, make_wsgi_app(registry),
                                      tls=side_http.tls_context(str(pki.cert), str(pki.key)), timeout_s=0.5)
    side_http.start(server)
    try:
        with stalled(server.server_port) as held:
            started = time.monotonic()
            for s in held:
                assert closed_by_server(s)               # recv returns once the server cut it off
            assert time.monotonic() - started < 5
        wait_until(lambda: not server._open, timeout=5)
    finally:
        server.shutdown()
        server.server_close()


def test_beyond_the_cap_the_oldest_connection_is_cut_off_and_a_scrape_is_served(pki, registry):
    server = side_http.SideHTTPServer("127.0.0.1", 0, make_wsgi_app(registry),
                                      tls=side_http.tls_context(str(pki.cert), str(pki.key)), max_connections=4)
    side_http.start(server)
    threads_before = threading.active_count()
    try:
        with stalled(server.server_port, count=5) as held:       # 10 stalled connections, cap 4
            assert closed_by_server(held[0])                       # the oldest went first
            scrape(server.server_port, pki)
            assert len(server._open) <= 4
            wait_until(lambda: threading.active_count() <= threads_before + 4, timeout=5)
    finally:
        server.shutdown()
        server.server_close()
