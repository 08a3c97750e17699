"""Free TCP ports for tests, benchmarks and throwaway servers — the one helper that asks the kernel
for them (tests/test_one_free_port_helper.py keeps it the only one).

A port is found by binding port 0 and reading the port the kernel chose; the socket is closed before
returning, so another process may in principle take the port before its user binds it. `free_ports`
holds all its sockets open until it has every port, so the ports it returns are distinct.
Servers that can listen on port 0 themselves (and report the port they got) should do that instead.
"""

from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that are free on `host` now."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One TCP port that is free on `host` now."""
    (port,) = free_ports(1, host)
    return port
