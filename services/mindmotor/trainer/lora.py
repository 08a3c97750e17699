"""LoRA fine-tuning: low-rank adapters on a frozen base, written as a PEFT adapter directory.

`add_lora` wraps each targeted `nn.Linear` of the training model (`model.py`) in a `LoraLinear`:
`y = W x + (alpha / r) · B A x`, W frozen, A [r, in] initialised as PEFT does (Kaiming-uniform,
a = sqrt(5)), B [out, r] zeros, so training starts from the base model's outputs exactly. Only A
and B train. `export_adapter` writes what `peft.PeftModel.from_pretrained` loads and what
`mindmotor worker --lora-modules` serves (model/lora.py): `adapter_config.json` and
`adapter_model.safetensors` under PEFT's names
(`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, ...), written into a
temporary directory and renamed into place as checkpoints are (`staging.py`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from mindmotor.model.config import CheckpointError

from .permissions import make_dirs, make_readable
from .staging import staging_dir, sweep_abandoned

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        with torch.no_grad():
            bound = 1.0 / math.sqrt(base.in_features)       # kaiming_uniform_(a=sqrt(5)) on [r, in]
            self.lora_A.weight.uniform_(-bound, bound, generator=generator)
            self.lora_B.weight.zero_()
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scale


def add_lora(model: nn.Module, rank: int, alpha: float, targets, seed: int) -> list[str]:
    """Freeze `model` and wrap its `targets` linears; returns the wrapped modules' names."""
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    wrapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in targets and isinstance(child, nn.Linear):
                setattr(module, child_name, LoraLinear(child, rank, alpha, generator))
                wrapped.append(f"{name}.{child_name}")
    if not wrapped:
        raise CheckpointError(f"no module named {sorted(targets)} to adapt")
    return wrapped


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's A and B under PEFT's names."""
    return {f"base_model.model.{name}": p.detach().float().contiguous().clone()
            for name, p in model.named_parameters() if ".lora_A." in name or ".lora_B." in name}


def adapter_config(rank: int, alpha: float, targets, base_model: str | None) -> dict:
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
            "target_modules": sorted(targets), "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
            "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None, "init_lora_weights": True,
            "inference_mode": True, "base_model_name_or_path": base_model, "rank_pattern": {},
            "alpha_pattern": {}, "layers_to_transform": None, "layers_pattern": None}


def export_adapter(root: str | Path, version: str, model: nn.Module, rank: int, alpha: float, targets,
                   base_model: str | None, info: dict) -> Path:
    """Write the adapter `version` into `root` (atomically); `info`: mindmotor_adapter.json."""
    root = Path(root)
    final = root / version
    if final.exists():
        raise CheckpointError(f"{final}: version already exists")
    make_dirs(root)
    sweep_abandoned(root)
    with staging_dir(root, version) as tmp:
        save_file(adapter_tensors(model), str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(adapter_config(rank, alpha, targets, base_model),
                                                            indent=2) + "\n")
        (tmp / "mindmotor_adapter.json").write_text(json.dumps(info, indent=2) + "\n")
        make_readable(tmp)
        for path in tmp.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        os.rename(tmp, final)
    return final
