"""A serving-only copy of a checkpoint (e.g. the demo model shipped as package data): the Hugging
Face files and a fresh `mindmotor.json`, without `trainer_state.pt` (optimizer moments and RNG,
about twice the size of the weights). The source is verified first; the copy is written to a
temporary directory (`staging.py`: removed on every way out but the rename) and renamed into
place, its files 0644 and directories 0755. No PyTorch here.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mindmotor.model.config import CheckpointError

from mindmotor.model.manifest import build_manifest, verify_checkpoint, write_manifest
from .permissions import make_dirs, make_readable
from .staging import staging_dir

TRAINING_ONLY_FILES = ("trainer_state.pt",)


WEIGHT_DTYPES = ("float32", "float16", "bfloat16")


def bundle_checkpoint(source: str | Path, destination: str | Path, dtype: str | None = None) -> Path:
    """Copy `source` to `destination` for serving; returns `destination`. With `dtype`, the
    weights are stored in that precision (bfloat16 halves the package size; needs PyTorch)."""
    if dtype is not None and dtype not in WEIGHT_DTYPES:
        raise CheckpointError(f"dtype must be one of {WEIGHT_DTYPES}, got {dtype!r}")
    source, destination = Path(source), Path(destination)
    manifest = verify_checkpoint(source)
    if destination.exists():
        raise CheckpointError(f"{destination}: already exists")
    make_dirs(destination.parent)
    with staging_dir(destination.parent, destination.name) as tmp:
        for name in manifest["files"]:
            if name not in TRAINING_ONLY_FILES:
                shutil.copy2(source / name, tmp / name)
        if dtype is not None:
            convert_weights(tmp, dtype)
        info = {k: v for k, v in manifest.items() if k not in ("files", "format")}
        info.update(version=destination.name, parent=manifest.get("version"),
                    bundled_from=str(source.resolve()))
        write_manifest(tmp, build_manifest(tmp, **info))
        make_readable(tmp)                 # copy2 keeps a source's 0600, safetensors writes 0600
        os.rename(tmp, destination)
    return destination


def convert_weights(directory: Path, dtype: str) -> None:
    """Rewrite `model.safetensors` in `dtype` and record it in `config.json` (`torch_dtype`)."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    target = getattr(torch, dtype)
    tensors = {name: t.to(target).contiguous() for name, t in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = dtype
    config_path.write_text(json.dumps(config, indent=2) + "\n")
