"""Real processes and servers for the coordinator's tests: the coordinator in-process (uvicorn on a
free port, in a thread) or as a `mindmotor coordinator` subprocess. Workers and controllers are the
suite's (tests/support/service_processes.py, re-exported here). Everything is stopped and reaped at
teardown."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest

from mindmotor.common.event_loop import run
from mindmotor.common.waiting import wait_until
from mindmotor.coordinator.app import create_app
from mindmotor.coordinator.config import load_settings
from mindmotor.coordinator.http.server import bind_socket, make_server
from mindmotor.runtime.child_process import ChildProcess, ChildProcessError
from service_processes import START_TIMEOUT_S, WorkerProcess, start_controller, start_workers

__all__ = ["HTTP_PROTOCOLS", "REALTIME_ARGS", "CoordinatorProcess", "InProcessCoordinator", "WorkerProcess",
           "start_controller", "start_workers", "wait_until"]

# uvicorn's HTTP/1.1 parsers the coordinator's HTTP limits are tested on (common/http_limits.py);
# httptools only where its package is installed (it is not a dependency yet: h11 is the default).
HTTP_PROTOCOLS = [pytest.param("h11"), pytest.param("httptools", marks=pytest.mark.skipif(
    importlib.util.find_spec("httptools") is None, reason="the httptools package is not installed"))]

# ~15 ms per decode step (Llama-2-7B on a 910B3): a 150-token stream lasts ~2 s.
REALTIME_ARGS = ("--timing", "realtime", "--emulate", "llama2-7b")


class _Process:
    """A `mindmotor` service subprocess for tests: `runtime.child_process.ChildProcess` (stdout read on a
    thread, stderr to a log file, SIGTERM to it should the test process die), except that `stop`
    kills at once — tests do not wait for drains they do not test."""

    def __init__(self, name: str, args: list[str], ready_prefix: str, log_path: Path,
                 program: list[str] | None = None):
        self.child = ChildProcess(name, args, ready_prefix, log_path, program=program)
        self.proc = self.child.proc
        self.log_path = log_path

    def wait_ready(self) -> dict[str, str]:
        """The ready line's fields; the process is stopped if it never prints it."""
        try:
            return self.child.wait_ready(START_TIMEOUT_S)
        except ChildProcessError:
            self.stop()
            raise

    def log_text(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        """SIGKILL now (and reap)."""
        self.child.kill()

    def stop(self) -> None:
        self.child.kill()


class CoordinatorProcess(_Process):
    def __init__(self, log_path: Path, *args: str):
        super().__init__("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0", *args],
                         "MINDMOTOR_COORDINATOR_READY", log_path)
        self.port = int(self.wait_ready()["port"])
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
        self.server = make_server(self.app, settings=self.settings)
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(sock,), daemon=True, name="coordinator")
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), timeout=15)
        if not self.server.started:
            raise RuntimeError(f"the coordinator did not start: {self._error!r}")

    def _run(self, sock) -> None:
        try:
            run(self.server.serve(sockets=[sock]), self.settings.event_loop)   # uvloop where installed, as served
        except BaseException as exc:  # noqa: BLE001 - reported by the constructor
            self._error = exc

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
