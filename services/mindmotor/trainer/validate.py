"""Everything checked before a training run starts, shared by the CLI and the trainer service:
the config itself (keys, types, shapes), the number of processes, the corpus (exists, not empty)
and the checkpoint to resume from. Cheap — no PyTorch, no tokenizing — and every failure is a
`ConfigError` whose message says what is wrong.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mindmotor.model.config import CheckpointError

from .config import ConfigError, TrainConfig, load_config
from .corpus import check_corpus
from .store import CheckpointStore


def validated_config(preset_name: str, overrides: dict, nproc: int, store_root: str | Path,
                     resume: str | None = None) -> TrainConfig:
    """The preset with `overrides`, checked, with corpus paths made absolute."""
    config = load_config(preset_name or "demo", overrides)
    config.check_world_size(nproc)
    config = dataclasses.replace(
        config, corpus=tuple(str(Path(p).expanduser().resolve()) for p in config.corpus))
    check_corpus(config.corpus)
    if resume:
        try:
            CheckpointStore(store_root).resolve(resume)
        except CheckpointError as exc:
            raise ConfigError(f"cannot resume from {resume!r}: {exc}") from exc
    return config
