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


def zombie_children(pid: int | None = None) -> list[int]:
    """This process's children that have exited and not been waited for."""
    me = pid or os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == me:
            found.append(int(entry.name))
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
