"""The checkpoint store: a local directory of checkpoint versions.

    <root>/<version>/          one checkpoint (HF layout + mindmotor.json), written atomically
    <root>/PROMOTED            the name of the promoted version (the one to deploy)
    <root>/.tmp-*              a checkpoint being written, and its lock (never listed; staging.py)
    <root>/.jobs/              the trainer service's job directories (never listed)

A version is any sub-directory holding a `mindmotor.json`. No PyTorch here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mindmotor.model.config import CheckpointError

from mindmotor.model.manifest import MANIFEST_NAME, read_manifest, verify_checkpoint
from .permissions import FILE_MODE

PROMOTED_NAME = "PROMOTED"


@dataclass(frozen=True)
class CheckpointVersion:
    version: str
    path: Path
    step: int
    val_loss: float | None
    parent: str | None
    created_at: float
    run: str | None = None

    @classmethod
    def from_dir(cls, path: Path) -> "CheckpointVersion":
        m = read_manifest(path)
        return cls(version=path.name, path=path, step=int(m.get("step", 0)),
                   val_loss=m.get("val_loss"), parent=m.get("parent"),
                   created_at=float(m.get("created_at", 0.0)), run=m.get("run"))


class CheckpointStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def versions(self) -> list[CheckpointVersion]:
        """Every version, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            if path.is_dir() and not path.name.startswith(".") and (path / MANIFEST_NAME).is_file():
                try:
                    found.append(CheckpointVersion.from_dir(path))
                except CheckpointError:
                    continue   # a damaged manifest: not a usable version
        return sorted(found, key=lambda v: (v.created_at, v.step, v.version))

    def latest(self) -> CheckpointVersion | None:
        versions = self.versions()
        return versions[-1] if versions else None

    def get(self, version: str) -> CheckpointVersion:
        path = self.root / version
        if version.startswith(".") or "/" in version or not (path / MANIFEST_NAME).is_file():
            raise CheckpointError(f"{path}: no such checkpoint version in {self.root}")
        return CheckpointVersion.from_dir(path)

    def promoted(self) -> CheckpointVersion | None:
        marker = self.root / PROMOTED_NAME
        if not marker.is_file():
            return None
        return self.get(marker.read_text().strip())

    def promote(self, version: str) -> CheckpointVersion:
        """Mark `version` as the one to deploy (after checking its files)."""
        found = self.get(version)
        verify_checkpoint(found.path)
        tmp = self.root / f".{PROMOTED_NAME}.{os.getpid()}"
        tmp.write_text(version + "\n")
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, self.root / PROMOTED_NAME)
        return found

    def resolve(self, ref: str) -> Path:
        """A checkpoint directory from `latest`, `promoted`, a version name or a path."""
        if ref == "latest":
            found = self.latest()
            if found is None:
                raise CheckpointError(f"{self.root}: the store holds no checkpoint")
            return found.path
        if ref == "promoted":
            found = self.promoted()
            if found is None:
                raise CheckpointError(f"{self.root}: no version is promoted")
            return found.path
        if Path(ref).is_dir() and (Path(ref) / MANIFEST_NAME).is_file():
            return Path(ref)
        return self.get(ref).path
