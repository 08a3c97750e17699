"""A real `mindmotor worker` subprocess for tests: started with `--port 0`, ready when it prints
its ready line, always stopped (and reaped) at teardown."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc

from mindmotor.common.waiting import wait_until  # noqa: F401 (re-exported to the tests)
from mindmotor.protocol import worker_pb2_grpc
from mindmotor.runtime.child_process import ChildProcess, ChildProcessError

# A realtime worker sized and timed like Qwen2-7B on a 910B3: ~16 ms per decode step, so a
# stream of 100+ tokens lasts long enough to cancel, abort or drain in the middle of it.
REALTIME_ARGS = ("--timing", "realtime", "--emulate", "qwen2-7b")

START_TIMEOUT_S = 60.0


class WorkerProcess:
    """`runtime.child_process.ChildProcess` running `mindmotor worker`, with a gRPC stub; `stop` kills
    at once (tests that drain call `terminate` and wait themselves)."""

    def __init__(self, model_dir: Path, log_path: Path, *extra_args: str, program: list[str] | None = None):
        """`program`: what runs `worker ...` (default: the `mindmotor` command; see faulty_worker.py)."""
        self.log_path = log_path
        self.child = ChildProcess("worker", ["worker", "--model", str(model_dir), "--host", "127.0.0.1",
                                             "--port", "0", "--metrics-port", "0", *extra_args],
                                  "MINDMOTOR_WORKER_READY", log_path, program=program)
        self.proc = self.child.proc
        try:
            ready = self.child.wait_ready(START_TIMEOUT_S)
        except ChildProcessError:
            self.child.kill()
            raise
        self.port, self.metrics_port = int(ready["port"]), int(ready["metrics_port"])
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)

    def log_text(self) -> str:
        return self.log_path.read_text()

    def terminate(self) -> None:
        self.child.signal(signal.SIGTERM)

    def stop(self) -> None:
        """Kill if still running, always reap, close everything."""
        self.child.kill()
        self.channel.close()
