"""`StateDir`: everything `mindmotor up` keeps between its runs, in one directory, locked by the
`up` that uses it.

    state = StateDir(path)            # created (mode 0700) if missing
    state.lock()                      # StateDirBusy if another `up` holds it
    ports = state.remembered_ports()  # the last run's ports: reused where the config says 0
    ...
    state.write_up_file({...})        # once serving: how `mindmotor deploy` finds this `up`
    state.close()                     # up.json and run/ removed, the lock released

Layout (docs/operations.md, "The state directory"):

    lock                  held (flock) by the running `up`; its pid inside (a log_dir elsewhere: its .up.lock too)
    up.json               while `up` serves: pid, URL, ports, the Deployer's address, admin cert paths
    ports.json            the ports of the last run
    applied.json          the config's deployment specs as last applied
    deployer-store.json   the Deployer's deployments (rollouts, promotions): without `redis_url`
    responses.db          the coordinators' stored responses (/v1/responses; SQLite, bounded, with a TTL)
    pki/                  cluster CA, worker CA, one certificate per service (kept while valid)
    logs/                 every service's log, workers/ (unless `log_dir` says elsewhere)
    run/                  this run's scratch files (the coordinators' metrics); removed at exit

The lock is an `fcntl.flock` on `lock`, taken without waiting: the kernel drops it when the
process ends however it ends (SIGKILL included), so a stale lock never blocks a restart. The
descriptor is not inherited by the services `up` starts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from mindmotor.common.up_state import UP_FILE, running_up

LOCK, PORTS, APPLIED, DEPLOYER_STORE = "lock", "ports.json", "applied.json", "deployer-store.json"
RESPONSES = "responses.db"
LOCK_IN_LOGS = ".up.lock"      # a log directory outside the state directory is locked too


class StateDirBusy(RuntimeError):
    """Another `mindmotor up` holds the state directory."""


class StateDir:
    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().resolve()
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_fd: int | None = None
        self._log_lock_fd: int | None = None

    # ---- the layout ---------------------------------------------------------------------
    @property
    def pki(self) -> Path:
        return self.path / "pki"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def run(self) -> Path:
        return self.path / "run"

    @property
    def deployer_store(self) -> Path:
        return self.path / DEPLOYER_STORE

    @property
    def responses(self) -> Path:
        return self.path / RESPONSES

    # ---- the lock -----------------------------------------------------------------------
    def lock(self, log_dir: Path | None = None) -> None:
        """Take the directory for this process — and `log_dir` too when it lies elsewhere (two
        `up`s writing one log directory would take each other's worker records) — StateDirBusy,
        naming the holder, if either is taken."""
        self._lock_fd = _flock(self.path / LOCK, "the state directory", self.path, "--state-dir",
                               lambda: running_up(self.path) or {})
        if log_dir is not None and self.path not in Path(log_dir).resolve().parents:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            try:
                self._log_lock_fd = _flock(Path(log_dir) / LOCK_IN_LOGS, "the log directory", Path(log_dir),
                                           "--log-dir", lambda: {})
            except StateDirBusy:
                self.close()
                raise
        shutil.rmtree(self.run, ignore_errors=True)       # scratch of a run that was SIGKILLed
        (self.path / UP_FILE).unlink(missing_ok=True)      # its up.json likewise

    def close(self) -> None:
        """Remove what only this run needed (up.json, run/) and release the locks."""
        if self._log_lock_fd is not None:
            os.close(self._log_lock_fd)
            self._log_lock_fd = None
        if self._lock_fd is None:
            return
        (self.path / UP_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.run, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = None

    # ---- what a run remembers -----------------------------------------------------------
    def remembered_ports(self) -> dict:
        return self._read(PORTS)

    def remember_ports(self, ports: dict) -> None:
        self._write(PORTS, ports)

    def applied_specs(self) -> dict:
        return self._read(APPLIED)

    def remember_applied(self, specs: dict) -> None:
        self._write(APPLIED, specs)

    def write_up_file(self, info: dict) -> None:
        self._write(UP_FILE, info)

    def _read(self, name: str) -> dict:
        try:
            value = json.loads((self.path / name).read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def _write(self, name: str, value: dict) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path / name)


def _flock(path: Path, what: str, directory: Path, flag: str, holder_info) -> int:
    """An exclusive flock on `path`, taken without waiting, with our pid written in it; the
    descriptor. StateDirBusy naming the holder (its pid, and its URL if `holder_info()` knows it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        url = holder_info().get("url")
        where = f", serving {url}" if url else ""
        raise StateDirBusy(f"another `mindmotor up` (pid {holder}{where}) is using {what} {directory}; "
                           f"stop it first, or give this one another {flag}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
