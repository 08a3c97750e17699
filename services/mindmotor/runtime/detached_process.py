"""`DetachedProcess`: a process that outlives whoever started it, which that one may or may not be
the parent of — the Deployer's local replicas (deployer/backends/local.py).

    proc = DetachedProcess.spawn(args, log_path, out_path, anchor=up_pid, env=worker_environment(),
                                 cmdline_mark="--worker-id\\0demo-v1-0")
    proc.poll_ready("MINDMOTOR_WORKER_READY")   # the ready line's fields once printed (from out_path)
    proc.alive(); proc.signal(SIGTERM)
    proc.to_dict()                              # what identifies it: pid, start time, command line
    DetachedProcess.adopt(saved)                # None unless it is still that very process

Started through the exec wrapper in `--detach` mode (die_with_parent.py, `detached_command`): the
process's parent is the `anchor` — a child subreaper, `mindmotor up` or the deployer itself — and
it gets `death_signal` (SIGKILL) when the anchor dies. Its stdout (the ready line) goes to a file,
its stderr (JSON log) to the log file, so nothing of it is tied to its starter's life.

A process is recognised by its pid *and* its start time (field 22 of /proc/PID/stat, in clock ticks
since boot) *and* a piece of its command line, so a pid the kernel reused is never taken for it.
Liveness comes from /proc (a zombie is dead); when the starter is the parent (the anchor is
itself) it also collects the exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .child_command import detached_command

SPAWN_TIMEOUT_S = 30.0


class SpawnError(RuntimeError):
    """The wrapper did not start the process."""


def proc_start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot); None if there is no such live process
    (a zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@dataclass
class DetachedProcess:
    pid: int
    start_time: int
    out_path: str
    cmdline_mark: str               # a piece of its command line ("--worker-id\0<id>")
    exit_code: int | None = None    # known only when this process is its parent
    _gone: bool = False

    @classmethod
    def spawn(cls, program: list[str], log_path: Path, out_path: Path, anchor: int, env: dict[str, str],
              cmdline_mark: str, death_signal: int = signal.SIGKILL) -> "DetachedProcess":
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = detached_command(program, anchor, death_signal, out_path)
        with open(log_path, "ab") as log:
            # no preexec_fn: CPython uses vfork + exec (safe with gRPC threads running)
            wrapper = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env)
        try:
            out, _ = wrapper.communicate(timeout=SPAWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            wrapper.kill()
            wrapper.wait()
            raise SpawnError("the exec wrapper did not start the process in time") from None
        try:
            pid = int(out.split()[0])
        except (IndexError, ValueError):
            raise SpawnError(f"the exec wrapper exited with code {wrapper.returncode} without a pid") from None
        start = proc_start_time(pid)
        return cls(pid=pid, start_time=start if start is not None else -1, out_path=str(out_path),
                   cmdline_mark=cmdline_mark, _gone=start is None)

    @classmethod
    def adopt(cls, saved: dict) -> "DetachedProcess | None":
        """The process `saved` describes, if it still runs and is that very process; else None."""
        try:
            proc = cls(pid=int(saved["pid"]), start_time=int(saved["start_time"]), out_path=str(saved["out_path"]),
                       cmdline_mark=str(saved["cmdline_mark"]))
        except (KeyError, TypeError, ValueError):
            return None
        return proc if proc.is_same_process() else None

    def to_dict(self) -> dict:
        return {"pid": self.pid, "start_time": self.start_time, "out_path": self.out_path,
                "cmdline_mark": self.cmdline_mark}

    def is_same_process(self) -> bool:
        return proc_start_time(self.pid) == self.start_time and self.cmdline_mark in proc_cmdline(self.pid)

    def alive(self) -> bool:
        if self._gone:
            return False
        try:                                    # our own child: collect its exit (and code)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.exit_code, self._gone = os.waitstatus_to_exitcode(status), True
                return False
            # Not exited yet: alive. /proc is not asked: a child being killed has released its
            # memory (an empty cmdline) before it is a zombie, and looked like another process
            # ("exited with code None"); an unreaped child's pid cannot be anyone else's.
            return True
        except ChildProcessError:               # adopted by someone else (`up`): /proc tells
            pass
        if not self.is_same_process():
            self._gone = True
        return not self._gone

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                self._gone = True

    def poll_ready(self, prefix: str) -> dict[str, str] | None:
        """The fields of the ready line once the process has printed it; None before."""
        try:
            text = Path(self.out_path).read_text(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(prefix):
                return dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        return None
