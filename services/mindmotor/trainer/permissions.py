"""Checkpoint files are for other users too: the serving image runs as an unprivileged user
(uid 10001) that reads what the trainer (often root, or another uid) wrote. Every file of a
trained, exported or bundled checkpoint is made 0644 and every directory 0755, explicitly —
whatever the umask, and whatever the writing library chose (safetensors creates its file 0600).
No PyTorch here."""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o644
DIR_MODE = 0o755


def make_readable(directory: str | Path) -> None:
    """`directory` 0755, and below it every directory 0755 and every regular file 0644."""
    directory = Path(directory)
    os.chmod(directory, DIR_MODE)
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            os.chmod(os.path.join(root, name), DIR_MODE)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, FILE_MODE)


def make_dirs(directory: str | Path) -> Path:
    """`mkdir -p` whose new directories are 0755 whatever the umask."""
    directory = Path(directory)
    missing = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    directory.mkdir(parents=True, exist_ok=True)
    for path in missing:
        os.chmod(path, DIR_MODE)
    return directory
