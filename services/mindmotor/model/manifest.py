"""`mindmotor.json`, the manifest of a checkpoint directory, and `verify_checkpoint`.

The manifest records where a checkpoint comes from (version, parent, step, validation loss, corpus
and config digests) and the sha256 of every other file in the directory. `verify_checkpoint`
refuses a directory whose files do not match it — a corrupt download, a half-copied directory, a
tampered weight file — with a `CheckpointIntegrityError` naming the file.

No PyTorch and no numpy here: the serving side imports this module.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mindmotor.model.config import CheckpointError

MANIFEST_NAME = "mindmotor.json"
MANIFEST_FORMAT = "mindmotor.checkpoint/1"


class CheckpointIntegrityError(CheckpointError):
    """A checkpoint whose files do not match its manifest; the message names the file."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_files(directory: Path) -> list[str]:
    """Names of the files a manifest covers: every regular file except the manifest itself."""
    return sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != MANIFEST_NAME)


def build_manifest(directory: str | Path, **info) -> dict:
    """The manifest for the files now in `directory`, with `info` (version, parent, step...)."""
    directory = Path(directory)
    files = {name: file_sha256(directory / name) for name in checkpoint_files(directory)}
    return {"format": MANIFEST_FORMAT, **info, "files": files}


def write_manifest(directory: str | Path, manifest: dict) -> None:
    (Path(directory) / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest(directory: str | Path) -> dict:
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise CheckpointIntegrityError(f"{path}: missing (not a MindMotor checkpoint)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointIntegrityError(f"{path}: corrupt manifest: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT \
            or not isinstance(manifest.get("files"), dict):
        raise CheckpointIntegrityError(f"{path}: not a {MANIFEST_FORMAT} manifest")
    return manifest


def verify_checkpoint(directory: str | Path) -> dict:
    """Check every file of a checkpoint against its manifest; return the manifest.

    Raises `CheckpointIntegrityError` (a `CheckpointError`) naming the first file that is
    missing, modified, or not listed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointIntegrityError(f"{directory}: not a checkpoint directory")
    manifest = read_manifest(directory)
    listed = manifest["files"]
    for name, expected in sorted(listed.items()):
        path = directory / name
        if not path.is_file():
            raise CheckpointIntegrityError(f"{path}: missing (listed in {MANIFEST_NAME})")
        actual = file_sha256(path)
        if actual != expected:
            raise CheckpointIntegrityError(
                f"{path}: sha256 {actual[:16]}… does not match {MANIFEST_NAME} ({expected[:16]}…); "
                f"the checkpoint is corrupt or was modified")
    for name in checkpoint_files(directory):
        if name not in listed:
            raise CheckpointIntegrityError(
                f"{directory / name}: not listed in {MANIFEST_NAME}; the checkpoint was modified")
    return manifest
