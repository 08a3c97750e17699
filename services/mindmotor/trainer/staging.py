"""`staging_dir`: the temporary `.tmp-*` directory a checkpoint (or a bundle) is written into before
it is renamed into place — removed on every way out but the rename; `sweep_abandoned`: removing
those whose writer died without a chance to (SIGKILL, a power cut).

    with staging_dir(root, "run-step000004") as tmp:
        ...write files into tmp...
        os.rename(tmp, root / "run-step000004")      # inside the block: kept

Leaving the block by an exception — SystemExit from SIGTERM (`launch.exit_on_sigterm`),
KeyboardInterrupt from Ctrl-C included — removes the directory if it is still there, with SIGINT
and SIGTERM held back meanwhile (a second Ctrl-C cannot cut the removal short; it takes effect
once the removal is done). Beside the directory, `<it>.lock` is locked (`flock`) by the writer from the moment
it has that name until the block ends (then removed); the kernel drops the lock when the writer
dies however it dies, so a lock file that can be locked marks an abandoned directory, which
`sweep_abandoned` removes with its lock file. A `.tmp-*` directory without a lock file (left by an
older version) is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import threading
import uuid
from pathlib import Path
from typing import Iterator

log = logging.getLogger("mindmotor.trainer")

PREFIX = ".tmp-"
LOCK_SUFFIX = ".lock"
_HELD_BACK = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def staging_dir(parent: Path, name: str) -> Iterator[Path]:
    """A new `parent/.tmp-<name>-<random>` (and its lock); removed unless renamed away inside the block."""
    tmp = parent / f"{PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    lock = tmp.with_name(tmp.name + LOCK_SUFFIX)
    lock_fd = -1
    try:
        lock_fd = _create_locked(lock)
        tmp.mkdir()
        yield tmp
    except BaseException:
        with signals_held():
            shutil.rmtree(tmp, ignore_errors=True)
            _unlock(lock, lock_fd)
        raise
    _unlock(lock, lock_fd)


def _unlock(lock: Path, fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        os.close(fd)


def sweep_abandoned(parent: Path) -> list[str]:
    """Remove the `.tmp-*` directories under `parent` whose writer is gone; returns their names."""
    try:
        locks = [p for p in parent.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(LOCK_SUFFIX)]
    except FileNotFoundError:
        return []
    removed = []
    for lock in locks:
        if _abandoned(lock):
            tmp = lock.with_name(lock.name[:-len(LOCK_SUFFIX)])
            with signals_held():
                shutil.rmtree(tmp, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
            removed.append(tmp.name)
    if removed:
        log.warning("removed directories left half-written by a writer that died",
                    extra={"directory": str(parent), "removed": removed})
    return removed


def _create_locked(lock: Path) -> int:
    """`lock`, already locked when it gets that name (locked under another name first, then
    renamed: the lock belongs to the file, not its name), so no sweeper finds it unlocked."""
    provisional = lock.with_name(f"{lock.name}.{os.getpid()}")
    fd = os.open(provisional, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(provisional, lock)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            provisional.unlink()
        raise
    return fd


def _abandoned(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:                       # removed meanwhile: its writer finished
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True                       # nobody holds it: its writer is gone
    except BlockingIOError:
        return False                      # being written right now
    finally:
        os.close(fd)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive meanwhile take effect (their handlers run) at the end of the
    block, not inside it. Python runs signal handlers in the main thread only, so that is the one
    thread where this is needed and possible; elsewhere it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda sig, _frame: caught.append(sig)) for sig in _HELD_BACK}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)
