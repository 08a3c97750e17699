"""A process as the "child subreaper" of everything it starts (Linux `prctl(PR_SET_CHILD_SUBREAPER)`:
`mindmotor up`, or a Deployer run on its own): a process whose parent dies is handed to it rather
than to init. A Deployer's local replicas are started that way (die_with_parent.py `--detach`,
detached_process.py): under `up` their parent is `up`, their death signal comes from `up`'s death,
and a Deployer that dies leaves them running for the restarted one to adopt.

    become_subreaper()              # before the first child starts (descendants inherit the mark)
    reap_orphans(keep={pids...})    # every supervisor pass: collect the exit of adopted processes

`reap_orphans` waits only for zombie children that are not in `keep` (the supervisor's own
children, whose exit `subprocess` collects), so the two never take each other's exit status.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

log = logging.getLogger("mindmotor.runtime")

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """True if this process is now a child subreaper (False off Linux/glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def child_pids(pid: int | None = None) -> list[int] | None:
    """This process's children, from `/proc/PID/task/TID/children` (a child is listed under the
    thread that started it, an adopted one under the thread it was handed to), or None where the
    kernel lacks the file (CONFIG_PROC_CHILDREN). The list may miss a child created or exiting
    while it is read; every supervisor pass reads it again."""
    me = pid or os.getpid()
    try:
        tasks = list(Path(f"/proc/{me}/task").iterdir())
    except OSError:
        return None
    found: set[int] = set()
    for task in tasks:
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:
            if not (task / "stat").exists():
                continue                                    # the thread ended meanwhile
            return None                                     # no `children` file on this kernel
        except OSError:
            continue
    return sorted(found)


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def zombie_children(pid: int | None = None) -> list[int]:
    """This process's children that have exited and not been waited for. From its own children
    list where the kernel gives one (a few files, not every process on the machine: a supervisor
    calls this 5 times a second, and the scan of all of /proc cost 0.16 of a core on a host running
    a few hundred processes), else from every process's parent in /proc."""
    me = pid or os.getpid()
    candidates = child_pids(me)
    if candidates is None:
        candidates = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]
    found = []
    for child in candidates:
        stat = _state_and_parent(child)
        if stat is not None and stat[0] == "Z" and stat[1] == me:
            found.append(child)
    return found


def reap_orphans(keep: set[int]) -> list[tuple[int, int]]:
    """Wait for every exited child not in `keep`; (pid, exit status) of each."""
    reaped = []
    for pid in zombie_children():
        if pid in keep:
            continue
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done:
            reaped.append((pid, os.waitstatus_to_exitcode(status)))
            log.info("adopted process exited", extra={"pid": pid, "exit_code": reaped[-1][1]})
    return reaped
