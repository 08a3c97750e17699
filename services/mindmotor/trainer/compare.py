"""`mindmotor debug compare`: the same tokens through the PyTorch training model and the serving
engine's numpy model, and the max / mean absolute difference after the embedding, after every
layer, and of the logits. In float32 the two should agree to ~1e-5.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from mindmotor.common.tokenizer import Tokenizer
from mindmotor.model.config import CheckpointError, LlamaConfig

from .init_from import beyond_training_model
from mindmotor.model.manifest import MANIFEST_NAME, verify_checkpoint
from .model import LlamaForCausalLM

DEFAULT_TEXT = ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
                '    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n')


@dataclass(frozen=True)
class LayerDiff:
    name: str
    max_abs: float
    mean_abs: float


def load_torch_model(directory: str | Path) -> LlamaForCausalLM:
    directory = Path(directory)
    config = LlamaConfig.from_dir(directory)
    unsupported = beyond_training_model(config)
    if unsupported:
        raise CheckpointError(f"{directory}: the PyTorch training model does not implement "
                              f"{unsupported} (it is Llama / Qwen2 with default RoPE); nothing to "
                              f"compare against")
    model = LlamaForCausalLM(config)
    model.load_hf_state_dict(load_file(str(directory / "model.safetensors")))
    return model.eval()


def compare_checkpoint(directory: str | Path, text: str = DEFAULT_TEXT,
                       max_tokens: int = 64) -> list[LayerDiff]:
    from mindmotor.model.llama import LlamaModel   # the serving side's numpy model

    directory = Path(directory)
    if (directory / MANIFEST_NAME).is_file():
        verify_checkpoint(directory)
    token_ids = np.array(Tokenizer.from_dir(directory).encode(text)[:max_tokens], dtype=np.int64)
    torch_model = load_torch_model(directory)
    with torch.no_grad():
        ids = torch.from_numpy(token_ids)[None]                                  # [1, T]
        torch_states = [s[0].numpy() for s in torch_model.hidden_states(ids)]     # L+1 × [T, h]
        torch_logits = torch_model(ids)[0].numpy()                               # [T, vocab]
    numpy_model = LlamaModel.from_pretrained(directory)
    numpy_states, numpy_logits = numpy_model.forward_dense_hidden_states(token_ids, with_logits=True)
    names = ["embed"] + [f"layer {i}" for i in range(len(torch_states) - 1)]
    diffs = [layer_diff(name, a, b) for name, a, b in zip(names, torch_states, numpy_states)]
    return diffs + [layer_diff("logits", torch_logits, numpy_logits)]


def layer_diff(name: str, a: np.ndarray, b: np.ndarray) -> LayerDiff:
    delta = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    return LayerDiff(name=name, max_abs=float(delta.max()), mean_abs=float(delta.mean()))


def format_table(diffs: list[LayerDiff]) -> str:
    lines = [f"{'':10} {'max |diff|':>12} {'mean |diff|':>12}"]
    lines += [f"{d.name:10} {d.max_abs:12.3e} {d.mean_abs:12.3e}" for d in diffs]
    return "\n".join(lines)
