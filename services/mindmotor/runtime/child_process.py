"""`ChildProcess`: a MindMotor service started as a subprocess, ready when it prints its ready line.

Every service prints one line `MINDMOTOR_<NAME>_READY key=value ...` on stdout once it serves
(ports it bound, among others). Its stderr (JSON logs) goes to a log file. Every child gets SIGTERM
from the kernel when the thread that started it dies (the exec wrapper `die_with_parent.py`, through
`child_command`), so a supervisor killed by SIGKILL leaves nothing running; start children from a
thread that lives as long as they should (the main thread, or the event loop's).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .child_command import child_command, child_env


class ChildProcessError(RuntimeError):
    """A child exited or did not become ready; the message has the tail of its log."""


class ChildProcess:
    def __init__(self, name: str, args: list[str], ready_prefix: str, log_path: Path | None,
                 env: dict[str, str | None] | None = None, program: list[str] | None = None,
                 parent_death_signal: int = signal.SIGTERM, pass_fds: tuple[int, ...] = ()):
        """`args` after `program` (default: `python -m mindmotor.cli`, i.e. a `mindmotor` command);
        `env` on top of this process's environment; `parent_death_signal` what the child gets when
        the thread that started it dies; `pass_fds` open in the child under the same numbers
        (a listening socket the child serves)."""
        self.name = name
        self.args = args
        self.ready_prefix = ready_prefix
        self.log_path = Path(log_path) if log_path is not None else None    # None: this process's stderr
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab") if self.log_path is not None else None
        cmd = child_command([*(program or [sys.executable, "-m", "mindmotor.cli"]), *args], parent_death_signal)
        # No preexec_fn (and nothing else that needs code between fork and exec): CPython then
        # starts the child with vfork + exec, which is safe in a process with gRPC threads.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=child_env(env), pass_fds=pass_fds)
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
        return self.wait_stopped(timeout_s)

    def wait_stopped(self, timeout_s: float) -> int:
        """Wait for the exit (of a child already told to stop), SIGKILL after `timeout_s`."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None:
            return ""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
