"""`RedisServer`: a throwaway `redis-server` of one's own for fault tests and benchmarks — on a free
port, without persistence, that can be frozen (SIGSTOP: it accepts connections but never answers,
like a hung Redis), thawed, and restarted empty on the same port (a Redis that lost its data).

    with RedisServer() as server:
        store = RedisStore(server.url)
        server.freeze(); ...; server.thaw()
        server.restart()                 # same port, no data
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time

from mindmotor.common.ports import free_port


class RedisServer:
    def __init__(self, port: int | None = None, binary: str = "redis-server"):
        self.binary = shutil.which(binary) or binary
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        from mindmotor.runtime.child_command import child_command   # killed with this process, even by SIGKILL

        self.proc = subprocess.Popen(
            child_command([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--protected-mode", "no"], signal.SIGKILL),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Kill it and start a new one on the same port: every key is gone."""
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def __enter__(self) -> "RedisServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
