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
                     resume: str | None = None, init_from: str | None = None,
                     tokenizer_from: str | None = None) -> TrainConfig:
    """The preset with `overrides`, checked, with corpus paths made absolute; with `init_from`
    shaped like that checkpoint, with `tokenizer_from` (default: `init_from`) sized for its
    tokenizer (`init_from.py`)."""
    config = load_config(preset_name or "demo", overrides)
    if config.lora_rank and not init_from:
        raise ConfigError("--lora-rank trains an adapter on an existing model: name it with --init-from DIR")
    if config.lora_rank and (resume or nproc > 1):
        raise ConfigError("a LoRA run (--lora-rank) runs in one process from the start: no --resume, no --nproc")
    if init_from or tokenizer_from:
        from .init_from import init_source, shaped_like, tokenizer_source

        if resume:
            raise ConfigError("--resume continues a run where it stopped; --init-from and --tokenizer-from start "
                              "a new one: use one or the other")
        init = init_source(init_from) if init_from else None
        config = shaped_like(config, init, tokenizer_source(tokenizer_from or init_from), set(overrides))
    config.check_world_size(nproc)
    config = dataclasses.replace(
        config, corpus=tuple(str(Path(p).expanduser().resolve()) for p in config.corpus))
    check_corpus(config.corpus)
    if resume:
        try:
            resumed = CheckpointStore(store_root).resolve(resume)
        except CheckpointError as exc:
            raise ConfigError(f"cannot resume from {resume!r}: {exc}") from exc
        from .init_from import init_source, shaped_like

        # the model's shape is the checkpoint's (a run started with --init-from has its source's)
        config = shaped_like(config, init_source(resumed, "--resume"), None, set(overrides))
    return config
