"""Where `mindmotor up` keeps its state, and how a client command finds a running `up` there.

    state = default_state_dir()          # $MINDMOTOR_STATE_DIR, else $XDG_DATA_HOME/mindmotor,
                                         # else ~/.local/share/mindmotor
    info = running_up(state)             # the running up's `up.json`, or None

`up.json` is written by `up` once it serves and removed when it stops: its pid, API URL, every
port, the Deployer's address and the admin certificate's files (paths only; never a secret). A file
left by an `up` that was SIGKILLed names a pid that is gone (or another process) and is ignored.
The layout of the whole directory: launcher/state_dir.py and docs/operations.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mindmotor.runtime.detached_process import proc_start_time

STATE_DIR_ENV = "MINDMOTOR_STATE_DIR"
UP_FILE = "up.json"


def default_state_dir(environ=None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(STATE_DIR_ENV):
        return Path(env[STATE_DIR_ENV]).expanduser()
    data = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return Path(data).expanduser() / "mindmotor"


def running_up(state_dir: str | Path | None = None) -> dict | None:
    """The `up.json` of the `up` running on `state_dir` (default: `default_state_dir()`), or None
    when there is none (no file, an unreadable one, or its process is gone)."""
    path = Path(state_dir or default_state_dir()) / UP_FILE
    try:
        info = json.loads(path.read_text())
        pid = int(info["pid"])
        start = info.get("pid_start")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = proc_start_time(pid)
    if now is None or (start is not None and now != start):
        return None
    return info
