"""Every listening port of every service of the mutual-TLS cluster speaks TLS: gRPC with the
service's certificate, the HTTP side ports (controller admin API, each /metrics) with the same
certificate (common/https_side.py). Each port found from /proc (the process's sockets in
/proc/net/tcp, state LISTEN) completes a TLS handshake verified with the cluster CA, and plain
HTTP gets no HTTP response. The coordinator's public API is the one exception: HTTP unless given
`--https-cert` (tests/security/test_https.py).

No side port can be frozen by a connection that never finishes: with a silent TCP connection and a
half-sent TLS handshake held open on it, each side port (worker, deployer and `mindmotor up`
/metrics, controller admin API) still answers a scrape at once."""

from __future__ import annotations

import os
import socket
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from mindmotor.launcher.up import serve_up_metrics
from mindmotor.runtime.supervisor_metrics import SupervisorMetrics
from stalled_tls import stalled

LISTEN = "0A"


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def handshake(port: int, context: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.version()


def plaintext_answer(port: int) -> bytes:
    """What a plain-HTTP request gets back (b"" when the server closes or says nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        s.settimeout(5)
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return data


def test_every_listening_port_of_every_service_speaks_tls(mtls_cluster, pki):
    context = ssl.create_default_context(cafile=str(pki["admin"].ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(pki["admin"].cert, pki["admin"].key)      # the gRPC ports want a client certificate
    context.set_alpn_protocols(["h2", "http/1.1"])
    public = int(mtls_cluster.coordinator_url.rsplit(":", 1)[1])
    checked: dict[str, set[int]] = {}
    for child in mtls_cluster.children:
        ports = listening_ports(child.proc.pid) - {public}    # the coordinator has no other port
        checked[child.name] = ports
        for port in ports:
            assert handshake(port, context) in ("TLSv1.2", "TLSv1.3"), (child.name, port)
            answer = plaintext_answer(port)
            assert not answer.startswith(b"HTTP/"), (child.name, port, answer[:80])
    # each of the other services has its gRPC port and its HTTP side port, all checked above
    assert {name: len(ports) >= 2 for name, ports in checked.items()} == \
        {"controller": True, "worker": True, "deployer": True, "coordinator": False}


def test_no_side_port_is_frozen_by_a_silent_connection_or_a_half_done_handshake(mtls_cluster, pki):
    up_server, up_port = serve_up_metrics(SupervisorMetrics(), "127.0.0.1", 0,
                                          files=(str(pki["admin"].cert), str(pki["admin"].key)))
    try:
        side_ports = {"controller admin": f"{mtls_cluster.controller_admin}/metrics",
                      "worker": mtls_cluster.worker_metrics, "deployer": mtls_cluster.deployer_metrics,
                      "up": f"https://127.0.0.1:{up_port}/metrics"}
        for name, url in side_ports.items():
            with stalled(urlsplit(url).port):       # held for less than the side ports' 10 s deadline
                response = httpx.get(url, timeout=5, verify=mtls_cluster.verify)
                assert response.status_code == 200 and "# TYPE" in response.text, name
    finally:
        up_server.shutdown()
        up_server.server_close()
