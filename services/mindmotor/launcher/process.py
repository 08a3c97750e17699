"""`ChildProcess`: a MindMotor service started as a subprocess, ready when it prints its ready line.

Every service prints one line `MINDMOTOR_<NAME>_READY key=value ...` on stdout once it serves
(ports it bound, among others). Its stderr (JSON logs) goes to a log file.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def _load_libc():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:   # not Linux/glibc: the supervisor's own stop() is all there is
        return None


_LIBC = _load_libc()   # loaded here, in the parent: the child between fork and exec only calls it


def _terminate_with_parent() -> None:
    """In the child, before exec: get SIGTERM (drain and exit) if the parent dies, even by SIGKILL,
    so a supervisor that is killed never leaves services running (Linux prctl PR_SET_PDEATHSIG)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG


class ChildProcessError(RuntimeError):
    """A child exited or did not become ready; the message has the tail of its log."""


class ChildProcess:
    def __init__(self, name: str, args: list[str], ready_prefix: str, log_path: Path,
                 env: dict[str, str] | None = None, program: list[str] | None = None):
        """`args` after `program` (default: `python -m mindmotor.cli`, i.e. a `mindmotor` command)."""
        self.name = name
        self.args = args
        self.ready_prefix = ready_prefix
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        cmd = [*(program or [sys.executable, "-m", "mindmotor.cli"]), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                     preexec_fn=_terminate_with_parent)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump_stdout, name=f"{name}-stdout", daemon=True).start()
        self.ready: dict[str, str] = {}

    def _pump_stdout(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_ready(self, timeout_s: float) -> dict[str, str]:
        """Block until the ready line; returns its key=value fields."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChildProcessError(f"{self.name} was not ready after {timeout_s:.0f} s\n{self.log_tail()}")
            try:
                line = self._lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait()
                raise ChildProcessError(
                    f"{self.name} exited with code {self.proc.returncode} before it was ready\n{self.log_tail()}")
            if self._take_ready(line):
                return self.ready

    def poll_ready(self) -> dict[str, str] | None:
        """The ready line's fields if the child has printed it, without waiting; None before
        (and for a child that exited first — `alive()` tells)."""
        while not self.ready:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return None
            if line is None:
                self._lines.put(None)          # keep the end mark for `wait_ready`
                return None
            self._take_ready(line)
        return self.ready

    def _take_ready(self, line: str) -> bool:
        if line.startswith(self.ready_prefix):
            self.ready = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        return bool(self.ready)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the service drains), then SIGKILL if it takes longer than `timeout_s`."""
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
