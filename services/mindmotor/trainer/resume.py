"""Resuming: a checkpoint holds everything a run needs to continue exactly where it stopped —
the weights (`model.safetensors`), and in `trainer_state.pt` the optimizer state, the loss scaler,
the step, and every process's RNG state. The data order is a function of (seed, step), so it
needs no state of its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from mindmotor.model.config import CheckpointError

from .config import TrainConfig
from .distributed import DistContext
from .export import TRAINER_STATE_NAME
from mindmotor.model.manifest import verify_checkpoint
from .model import LlamaForCausalLM

# Fields that must not change between a checkpoint and the run that resumes it.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "tie_word_embeddings",
                "attention_bias", "seq_len")


@dataclass(frozen=True)
class ResumePoint:
    step: int
    version: str
    run: str | None


def capture_rng() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def trainer_state(step: int, optimizer: torch.optim.Optimizer, scaler, rng_per_rank: list[dict],
                  config: TrainConfig) -> dict:
    return {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_per_rank,
        "config": config.to_dict(),
    }


def check_compatible(manifest: dict, config: TrainConfig, corpus_digest: str, source: Path) -> None:
    saved = manifest.get("train_config", {})
    changed = [f for f in SHAPE_FIELDS if saved.get(f) != getattr(config, f)]
    if changed:
        raise CheckpointError(
            f"{source}: cannot resume, the config changed {changed} "
            f"(checkpoint: {[saved.get(f) for f in changed]}, "
            f"now: {[getattr(config, f) for f in changed]})")
    if manifest.get("corpus_digest") != corpus_digest:
        raise CheckpointError(f"{source}: cannot resume, the corpus differs from the one this "
                              f"checkpoint was trained on (corpus digest changed)")


def load_resume_point(directory: Path, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
                      scaler, config: TrainConfig, corpus_digest: str,
                      ctx: DistContext) -> ResumePoint:
    """Load weights, optimizer, scaler and RNG from `directory` into this process."""
    manifest = verify_checkpoint(directory)
    check_compatible(manifest, config, corpus_digest, directory)
    state_path = directory / TRAINER_STATE_NAME
    if not state_path.is_file():
        raise CheckpointError(f"{state_path}: missing, this checkpoint cannot be resumed")
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    model.load_hf_state_dict(load_file(str(directory / "model.safetensors")))
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    rng = state.get("rng") or []
    if len(rng) == ctx.world_size:   # same number of processes: continue each RNG stream
        restore_rng(rng[ctx.rank])
    else:
        torch.manual_seed(config.seed + ctx.rank + state["step"])
        random.seed(config.seed + ctx.rank + state["step"])
    return ResumePoint(step=int(state["step"]), version=directory.name, run=manifest.get("run"))
