"""A process's children and descendants, read from /proc (Linux): for tests, benchmarks and
operators that look at what `mindmotor up` runs."""

from __future__ import annotations

from pathlib import Path


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's); [] for a process that has gone."""
    pids: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return pids
    for task in tasks:
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def descendants(pid: int) -> list[int]:
    """Children, grandchildren, ... of `pid`, each before its own descendants."""
    return [p for child in child_pids(pid) for p in (child, *descendants(child))]


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (it exited and awaits its parent's wait)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False
