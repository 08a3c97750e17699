"""The command lines that start a program behind the exec wrapper (`die_with_parent.py`, run as
`python -I -S` by path), and the environment a child gets.

    child_command(program)                        # it gets SIGTERM when this process dies
    detached_command(program, anchor, SIGKILL, out_path)   # it belongs to `anchor`, not to us
    child_env({"NAME": "value", "UNWANTED": None})

Why a wrapper and not a `preexec_fn`: see die_with_parent.py.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

WRAPPER = Path(__file__).with_name("die_with_parent.py")


def child_command(program: list[str], parent_death_signal: int = signal.SIGTERM) -> list[str]:
    """`program` behind the exec wrapper that makes it get `parent_death_signal` when this process
    dies, even by SIGKILL (see die_with_parent.py: why this is not a `preexec_fn`)."""
    return [sys.executable, "-I", "-S", str(WRAPPER), str(os.getpid()), str(int(parent_death_signal)), *program]


def detached_command(program: list[str], anchor: int, death_signal: int, stdout_path: str | Path) -> list[str]:
    """`program` started by the wrapper's `--detach` mode: adopted by `anchor` (a child subreaper
    among this process's ancestors, or this process), which it dies with; its stdout to `stdout_path`.
    The wrapper prints the program's pid on its stdout and exits."""
    return [sys.executable, "-I", "-S", str(WRAPPER), "--detach", str(anchor), str(int(death_signal)),
            str(stdout_path), *program]


def child_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """This process's environment for a child, plus `extra` (a None value removes the variable).
    gRPC's fork support is off in the children (they start their own children with vfork + exec,
    never fork())."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GRPC_ENABLE_FORK_SUPPORT": "false", **(extra or {})}
    return {name: value for name, value in env.items() if value is not None}
