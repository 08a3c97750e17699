"""Real processes and servers for the coordinator's tests: workers as subprocesses (started
together, then waited for), a controller subprocess, the coordinator in-process (uvicorn on a free
port, in a thread) or as a `mindmotor coordinator` subprocess. Everything is stopped and reaped at
teardown."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from mindmotor.common.waiting import wait_until  # noqa: F401 (re-exported to the tests)
from mindmotor.coordinator.app import create_app
from mindmotor.coordinator.config import load_settings
from mindmotor.coordinator.server import bind_socket, make_server
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc

# ~15 ms per decode step (Llama-2-7B on a 910B3): a 150-token stream lasts ~2 s.
REALTIME_ARGS = ("--timing", "realtime", "--emulate", "llama2-7b")
START_TIMEOUT_S = 60.0


class _Process:
    """A subprocess whose stdout lines are read on a thread; stderr goes to a log file."""

    def __init__(self, cmd: list[str], log_path: Path):
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_line(self, pattern: re.Pattern, timeout: float = START_TIMEOUT_S) -> re.Match:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            if m := pattern.match(line):
                return m
        self.stop()
        raise RuntimeError(f"{self.proc.args[:4]} did not become ready; its log:\n{self.log_text()}")

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def kill(self) -> None:
        """SIGKILL now (and reap)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if not self._log.closed:
            self._log.close()


class WorkerProcess(_Process):
    READY = re.compile(r"^MINDMOTOR_WORKER_READY port=(\d+) metrics_port=(\d+)$")

    def __init__(self, model_dir: Path, log_path: Path, *extra_args: str):
        super().__init__([sys.executable, "-m", "mindmotor.cli", "worker", "--model", str(model_dir),
                          "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", *extra_args], log_path)
        self.address = ""
        self.channel = None

    def wait_ready(self) -> "WorkerProcess":
        m = self.wait_line(self.READY)
        self.address = f"127.0.0.1:{m.group(1)}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        return self

    def status(self) -> pb.StatusResponse:
        return self.stub.Status(pb.StatusRequest(), timeout=5)

    def idle(self) -> bool:
        load = self.status().load
        return load.running == 0 and load.waiting == 0 and load.in_flight == 0

    def stop(self) -> None:
        super().stop()
        if self.channel is not None:
            self.channel.close()


def start_workers(model_dir: Path, log_dir: Path, count: int, *extra_args: str) -> list[WorkerProcess]:
    """`count` workers started at once, returned when all are ready."""
    workers = [WorkerProcess(model_dir, log_dir / f"worker-{i}-{time.monotonic_ns()}.log", *extra_args)
               for i in range(count)]
    try:
        return [w.wait_ready() for w in workers]
    except BaseException:
        for w in workers:
            w.stop()
        raise


class ControllerProcess(_Process):
    READY = re.compile(r"^MINDMOTOR_CONTROLLER_READY port=(\d+) admin_port=(\d+)$")

    def __init__(self, log_path: Path, *args: str):
        super().__init__([sys.executable, "-m", "mindmotor.cli", "controller", "--host", "127.0.0.1", "--port", "0",
                          "--admin-host", "127.0.0.1", "--admin-port", "0", *args], log_path)
        self.address = f"127.0.0.1:{self.wait_line(self.READY).group(1)}"


class CoordinatorProcess(_Process):
    READY = re.compile(r"^MINDMOTOR_COORDINATOR_READY port=(\d+)$")

    def __init__(self, log_path: Path, *args: str):
        super().__init__([sys.executable, "-m", "mindmotor.cli", "coordinator", "--host", "127.0.0.1",
                          "--port", "0", *args], log_path)
        self.port = int(self.wait_line(self.READY).group(1))
        self.url = f"http://127.0.0.1:{self.port}"


class InProcessCoordinator:
    """The coordinator app on uvicorn, on a free port, in a thread with its own event loop."""

    def __init__(self, **settings):
        self.settings = load_settings(None, host="127.0.0.1", port=0, **settings)
        self.app = create_app(self.settings)
        self.coordinator = self.app.state.coordinator
        sock = bind_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self.server = make_server(self.app)
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(sock,), daemon=True, name="coordinator")
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), timeout=15)
        if not self.server.started:
            raise RuntimeError(f"the coordinator did not start: {self._error!r}")

    def _run(self, sock) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[sock]))
        except BaseException as exc:  # noqa: BLE001 - reported by the constructor
            self._error = exc

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
