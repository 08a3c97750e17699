"""Where a served model comes from: a checkpoint directory, or the bundled demo model."""

from __future__ import annotations

from pathlib import Path

from .config import CheckpointError

BUNDLED_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "mindmotor-demo"


def resolve_model_dir(model: str | Path | None) -> Path:
    """The checkpoint directory to load; None means the bundled demo model. A checkpoint with a
    `mindmotor.json` manifest is verified (every file's sha256) before it is used."""
    directory = Path(model) if model else BUNDLED_MODEL_DIR
    if not directory.is_dir():
        what = "the bundled demo model" if model is None else "model directory"
        raise CheckpointError(f"{directory}: {what} does not exist")
    if (directory / "mindmotor.json").is_file():
        from .manifest import verify_checkpoint
        verify_checkpoint(directory)
    return directory
