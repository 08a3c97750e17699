"""Writing one checkpoint version: a Hugging Face directory plus the `mindmotor.json` manifest.

    config.json  model.safetensors  generation_config.json  tokenizer.json  tokenizer_config.json
    trainer_state.pt (optimizer, step, RNG: what resuming needs)  mindmotor.json

Everything is written into `<root>/.tmp-<version>-<random>`, flushed to disk, and only then renamed
to `<root>/<version>`: a crash leaves either the whole version or no version. The temporary
directory (`staging.py`) is removed on every way out but the rename — an error, SIGTERM, Ctrl-C —
and one left by a writer killed outright (SIGKILL) is removed by the next export into the store.
Files are 0644 and directories 0755 (`permissions.py`): the serving user is often another one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer

from mindmotor.common.tokenizer import (TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TokenizerFiles,
                                        save_tokenizer)
from mindmotor.model.config import CheckpointError, LlamaConfig

from mindmotor.model.manifest import build_manifest, write_manifest
from .model import LlamaForCausalLM
from .permissions import make_dirs, make_readable
from .staging import staging_dir, sweep_abandoned

TRAINER_STATE_NAME = "trainer_state.pt"


@dataclass(frozen=True)
class CheckpointInfo:
    """What the manifest says about where a checkpoint comes from."""

    version: str
    run: str
    parent: str | None
    step: int
    val_loss: float | None
    corpus_digest: str
    config_digest: str
    train_config: dict
    world_size: int = 1
    init_from: str | None = None        # the checkpoint whose weights the run started from
    tokenizer_from: str | None = None   # the checkpoint whose tokenizer files it kept


def export_checkpoint(root: str | Path, info: CheckpointInfo, model: LlamaForCausalLM,
                      tokenizer: HFTokenizer, trainer_state: dict | None = None,
                      tokenizer_files: TokenizerFiles | None = None) -> Path:
    """Write the checkpoint `info.version` into the store at `root`; return its directory. With
    `tokenizer_files`, those are the checkpoint's tokenizer files, byte for byte."""
    root = Path(root)
    final = root / info.version
    if final.exists():
        raise CheckpointError(f"{final}: version already exists")
    make_dirs(root)
    sweep_abandoned(root)
    with staging_dir(root, info.version) as tmp:
        write_hf_files(tmp, model, tokenizer, tokenizer_files)
        if trainer_state is not None:
            torch.save(trainer_state, tmp / TRAINER_STATE_NAME)
        write_manifest(tmp, build_manifest(tmp, **manifest_info(info, model.config)))
        make_readable(tmp)
        fsync_tree(tmp)
        os.rename(tmp, final)
        fsync_dir(root)
    return final


def write_hf_files(directory: Path, model: LlamaForCausalLM, tokenizer: HFTokenizer,
                   tokenizer_files: TokenizerFiles | None = None) -> None:
    config = model.config
    save_file(model.hf_state_dict(), str(directory / "model.safetensors"), metadata={"format": "pt"})
    write_json(directory / "config.json", config.to_hf_dict())
    write_json(directory / "generation_config.json", {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.eos_token_id,
    })
    if tokenizer_files is not None:
        (directory / TOKENIZER_FILE).write_bytes(tokenizer_files.tokenizer_json)
        if tokenizer_files.tokenizer_config_json:
            (directory / TOKENIZER_CONFIG_FILE).write_bytes(tokenizer_files.tokenizer_config_json)
    else:
        save_tokenizer(tokenizer, directory, model_max_length=config.max_position_embeddings)


def manifest_info(info: CheckpointInfo, config: LlamaConfig) -> dict:
    return {
        "version": info.version,
        "run": info.run,
        "parent": info.parent,
        "step": info.step,
        "val_loss": info.val_loss,
        "val_perplexity": None if info.val_loss is None else float(torch.tensor(info.val_loss).exp()),
        "created_at": time.time(),
        "corpus_digest": info.corpus_digest,
        "config_digest": info.config_digest,
        "train_config": info.train_config,
        "world_size": info.world_size,
        "num_parameters": config.num_parameters(),
        "torch_version": torch.__version__,
        **({"init_from": info.init_from} if info.init_from else {}),
        **({"tokenizer_from": info.tokenizer_from} if info.tokenizer_from else {}),
    }


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
