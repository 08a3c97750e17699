"""A real `mindmotor worker` subprocess for tests: started with `--port 0`, ready when it prints
its ready line, always stopped (and reaped) at teardown."""

from __future__ import annotations

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
from mindmotor.protocol import worker_pb2_grpc

# A realtime worker sized and timed like Qwen2-7B on a 910B3: ~16 ms per decode step, so a
# stream of 100+ tokens lasts long enough to cancel, abort or drain in the middle of it.
REALTIME_ARGS = ("--timing", "realtime", "--emulate", "qwen2-7b")

READY = re.compile(r"^MINDMOTOR_WORKER_READY port=(\d+) metrics_port=(\d+)$")
START_TIMEOUT_S = 60.0


class WorkerProcess:
    def __init__(self, model_dir: Path, log_path: Path, *extra_args: str):
        self.log_path = log_path
        cmd = [sys.executable, "-m", "mindmotor.cli", "worker", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", *extra_args]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._stdout: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self.port, self.metrics_port = self._wait_ready()
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self._stdout.put(line.rstrip("\n"))
        self._stdout.put(None)

    def _wait_ready(self) -> tuple[int, int]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._stdout.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            if m := READY.match(line):
                return int(m.group(1)), int(m.group(2))
        self.stop()
        raise RuntimeError(f"the worker did not become ready; its log:\n{self.log_text()}")

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """Kill if still running, always reap, close everything."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if hasattr(self, "channel"):
            self.channel.close()
        self._log.close()
