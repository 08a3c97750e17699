"""LoRA adapters in PEFT's format, and their per-row application in a mixed batch.

An adapter directory is what `peft` writes (`PeftModel.save_pretrained`): `adapter_config.json`
(peft_type LORA, r, lora_alpha, target_modules, ...) and `adapter_model.safetensors` with, for each
adapted linear layer, `base_model.model.model.layers.{i}.{self_attn|mlp}.{name}.lora_A.weight`
[r, in] and `....lora_B.weight` [out, r]. The layer computes `x W + scale · (x Aᵀ) Bᵀ` with
`scale = lora_alpha / r` (`/ sqrt(r)` with use_rslora; `alpha_pattern` overrides alpha per module).

`load_adapter` reads and checks everything against the base model before anything is used; every
refusal is an `AdapterError` (a `CheckpointError`) naming the file and the reason: DoRA, biases,
modules_to_save, targets this model does not adapt (embeddings, lm_head), a rank over the
serving limit, shapes that are not the base model's, missing or non-finite tensors, a corrupt file.

Serving (`LoraStack`, `LoraBatch`): adapters sit in numbered device slots, stacked per layer and per
fused projection of `weights.py` (qkv, o, gate_up, down) — A as [slots, in, bands·R] and B as
[slots, bands·R, out], where each target of a fused projection owns one band of `R` = max rank
columns of A and the rows of B that write its own output columns (zeros elsewhere; smaller ranks
zero-padded). A step's rows each name a slot (-1: the base model); per projection the rows with an
adapter gather their slot's A and B and add `(x A_slot) B_slot` — Punica's BGMV: one batched
gather-matmul for the whole mixed batch, never a sub-batch per adapter.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import CheckpointError, LlamaConfig
from .safetensors_io import load_safetensors
from .weights import FUSED_ARCHITECTURES

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PROJECTIONS = ("qkv", "o", "gate_up", "down")       # the fused matrices of weights.LayerWeights
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# adapter_config.json keys whose non-default value changes the math in a way not implemented here
_REFUSED_OPTIONS = {
    "use_dora": "DoRA (use_dora) is not supported: only plain LoRA adapters serve",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layers) is not a Llama's layout",
    "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
    "layer_replication": "layer_replication is not supported",
    "lora_bias": "lora_bias is not supported",
    "target_parameters": "target_parameters is not supported",
    "use_qalora": "QA-LoRA is not supported",
    "trainable_token_indices": "trainable_token_indices (adapted embeddings) is not supported",
    "use_bdlora": "BD-LoRA is not supported",
}


class AdapterError(CheckpointError):
    """An adapter that cannot be served on this base model; the message says why."""


@dataclass(frozen=True)
class Target:
    """Where one adaptable linear layer writes in its fused projection."""
    name: str             # PEFT's module name: q_proj, ...
    module: str           # self_attn | mlp
    projection: str       # qkv | o | gate_up | down
    band: int             # its band of A's columns / B's rows in the stacked projection
    out_start: int        # its output columns within the fused projection
    out_size: int
    in_size: int


def targets_of(config: LlamaConfig) -> dict[str, Target]:
    """The linear layers an adapter may adapt on this architecture, by PEFT module name."""
    h, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    if config.architecture in FUSED_ARCHITECTURES:        # Phi-3: qkv_proj and gate_up_proj
        items = [Target("qkv_proj", "self_attn", "qkv", 0, 0, q + 2 * kv, h),
                 Target("gate_up_proj", "mlp", "gate_up", 0, 0, 2 * inter, h)]
    else:
        items = [Target("q_proj", "self_attn", "qkv", 0, 0, q, h),
                 Target("k_proj", "self_attn", "qkv", 1, q, kv, h),
                 Target("v_proj", "self_attn", "qkv", 2, q + kv, kv, h),
                 Target("gate_proj", "mlp", "gate_up", 0, 0, inter, h),
                 Target("up_proj", "mlp", "gate_up", 1, inter, inter, h)]
    items += [Target("o_proj", "self_attn", "o", 0, 0, h, q),
              Target("down_proj", "mlp", "down", 0, 0, h, inter)]
    return {t.name: t for t in items}


def projection_shapes(config: LlamaConfig) -> dict[str, tuple[int, int, int]]:
    """(in, out, bands) of each fused projection."""
    targets = targets_of(config)
    shapes = {}
    for p in PROJECTIONS:
        ts = [t for t in targets.values() if t.projection == p]
        out = max(t.out_start + t.out_size for t in ts)
        shapes[p] = (ts[0].in_size, out, len(ts))
    return shapes


@dataclass
class LoraAdapter:
    """One checked adapter, host side: per (layer, target) A [in, r] and B·scale [r, out]."""
    name: str
    path: str
    rank: int                                     # the largest rank of its modules
    alpha: float
    target_modules: tuple[str, ...]
    weights: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())

    def device_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes of its A and B on the device (bf16 by default): what a slot load copies."""
        return self.nbytes // 4 * dtype_bytes

    @property
    def num_parameters(self) -> int:
        return self.nbytes // 4


def load_adapter(path: str | Path, config: LlamaConfig, max_rank: int, name: str | None = None) -> LoraAdapter:
    """Read and check a PEFT LoRA adapter directory against the base model `config`."""
    path = Path(path)
    name = name or path.name
    if not path.is_dir():
        raise AdapterError(f"{path}: not a directory (a LoRA adapter is a directory with {CONFIG_FILE} "
                           f"and {WEIGHTS_FILE})")
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        raise AdapterError(f"{cfg_path}: missing (not a PEFT adapter directory)")
    try:
        raw = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{cfg_path}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise AdapterError(f"{cfg_path}: not a JSON object")
    alpha, alpha_pattern, rslora, declared = _check_config(raw, cfg_path, config)
    weights_path = path / WEIGHTS_FILE
    if not weights_path.is_file():
        other = " (adapter_model.bin, a pickle, is not read: save with safe_serialization)" \
            if (path / "adapter_model.bin").exists() else ""
        raise AdapterError(f"{weights_path}: missing{other}")
    try:
        tensors = load_safetensors(weights_path)
    except CheckpointError as exc:
        raise AdapterError(str(exc)) from None
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise AdapterError(f"{weights_path}: corrupt safetensors file: {exc}") from None
    weights = _check_tensors(tensors, weights_path, config, max_rank, alpha, alpha_pattern, rslora)
    used = sorted({t for _, t in weights}, key=list(targets_of(config)).index)
    undeclared = [t for t in used if declared is not None and t not in declared]
    if undeclared:
        raise AdapterError(f"{weights_path}: tensors for {undeclared}, which target_modules in "
                           f"{CONFIG_FILE} does not name")
    ranks = [a.shape[1] for a, _ in weights.values()]
    return LoraAdapter(name=name, path=str(path), rank=max(ranks), alpha=alpha, target_modules=tuple(used),
                       weights=weights)


def _check_config(raw: dict, source: Path, config: LlamaConfig):
    peft_type = str(raw.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise AdapterError(f"{source}: peft_type {raw.get('peft_type')!r} is not supported (only LORA)")
    for key, why in _REFUSED_OPTIONS.items():
        if raw.get(key):
            raise AdapterError(f"{source}: {why}")
    if raw.get("bias", "none") not in ("none", None):
        raise AdapterError(f"{source}: bias {raw['bias']!r} is not supported (trained biases): only 'none'")
    if raw.get("layers_pattern") not in (None, "layers", ["layers"]):
        raise AdapterError(f"{source}: layers_pattern {raw['layers_pattern']!r} is not this model's")
    for key in ("r", "lora_alpha"):
        value = raw.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise AdapterError(f"{source}: {key} must be a positive number, got {value!r}")
    alpha_pattern = raw.get("alpha_pattern") or {}
    if not isinstance(alpha_pattern, dict):
        raise AdapterError(f"{source}: alpha_pattern must be an object")
    targets = raw.get("target_modules")
    declared = None
    supported = targets_of(config)
    if isinstance(targets, list):       # names, or full module paths (peft writes those for "all-linear")
        names = {str(t).rsplit(".", 1)[-1]: t for t in targets}
        unknown = [t for name, t in names.items() if name not in supported]
        if unknown:
            raise AdapterError(f"{source}: target_modules {unknown} cannot be adapted on "
                               f"{config.architecture} (supported: {sorted(supported)})")
        declared = set(names)
    elif targets is not None and not isinstance(targets, str):
        raise AdapterError(f"{source}: target_modules must be a list or a string")
    return float(raw["lora_alpha"]), alpha_pattern, bool(raw.get("use_rslora")), declared


def _pattern_value(patterns: dict, key: str, default: float) -> float:
    """PEFT's rule: the first pattern p with re.match(rf'(.*\\.)?{p}$', key) wins."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?{pattern}$", key):
            return float(value)
    return default


def _check_tensors(tensors: dict[str, np.ndarray], source: Path, config: LlamaConfig, max_rank: int,
                   alpha: float, alpha_pattern: dict, rslora: bool):
    supported = targets_of(config)
    halves: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, array in tensors.items():
        if "lora_magnitude_vector" in key:
            raise AdapterError(f"{source}: {key!r} is a DoRA magnitude: DoRA adapters are not supported")
        match = _KEY.match(key)
        if not match:
            raise AdapterError(f"{source}: unexpected tensor {key!r} (only lora_A / lora_B of the decoder "
                               f"layers' linear projections are supported)")
        layer, module, target, half = int(match[1]), match[2], match[3], match[4]
        if target not in supported or supported[target].module != module:
            raise AdapterError(f"{source}: {key!r}: {module}.{target} cannot be adapted on {config.architecture} "
                               f"(supported: {sorted(supported)})")
        if layer >= config.num_hidden_layers:
            raise AdapterError(f"{source}: {key!r}: layer {layer}, but the base model has "
                               f"{config.num_hidden_layers} (an adapter for another model?)")
        if array.dtype.kind != "f":
            raise AdapterError(f"{source}: {key!r} has dtype {array.dtype}, expected floating point")
        if array.ndim != 2:
            raise AdapterError(f"{source}: {key!r} has shape {tuple(array.shape)}, expected a matrix")
        if not np.isfinite(array).all():
            raise AdapterError(f"{source}: {key!r} holds NaN or infinite values")
        halves.setdefault((layer, target), {})[half] = array
    if not halves:
        raise AdapterError(f"{source}: no LoRA tensors")
    weights = {}
    for (layer, target), pair in sorted(halves.items()):
        t = supported[target]
        prefix = f"base_model.model.model.layers.{layer}.{t.module}.{target}"
        if set(pair) != {"A", "B"}:
            missing = ({"A", "B"} - set(pair)).pop()
            raise AdapterError(f"{source}: {prefix}.lora_{missing}.weight missing")
        a, b = pair["A"], pair["B"]
        r = a.shape[0]
        if a.shape != (r, t.in_size) or b.shape != (t.out_size, r):
            raise AdapterError(
                f"{source}: {prefix}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit the base "
                f"model's {target} ({t.in_size} → {t.out_size}): expected ({r}, {t.in_size}) / "
                f"({t.out_size}, {r}) (an adapter for another base model?)")
        if r > max_rank:
            raise AdapterError(f"{source}: {prefix} has rank {r}, above --max-lora-rank {max_rank}")
        module_alpha = _pattern_value(alpha_pattern, f"model.layers.{layer}.{t.module}.{target}", alpha)
        scale = module_alpha / (math.sqrt(r) if rslora else r)
        weights[(layer, target)] = (np.ascontiguousarray(a.T, dtype=np.float32),
                                    np.ascontiguousarray(b.T * np.float32(scale), dtype=np.float32))
    return weights


class LoraStack:
    """`num_slots` device slots of adapters, stacked per layer and fused projection (see the module
    docstring). A slot holds zeros until an adapter is set into it."""

    def __init__(self, config: LlamaConfig, num_slots: int, max_rank: int):
        self.config, self.num_slots, self.max_rank = config, num_slots, max_rank
        self.targets = targets_of(config)
        self.shapes = projection_shapes(config)
        self.a: list[dict[str, np.ndarray]] = []
        self.b: list[dict[str, np.ndarray]] = []
        for _ in range(config.num_hidden_layers):
            self.a.append({p: np.zeros((num_slots, i, bands * max_rank), np.float32)
                           for p, (i, o, bands) in self.shapes.items()})
            self.b.append({p: np.zeros((num_slots, bands * max_rank, o), np.float32)
                           for p, (i, o, bands) in self.shapes.items()})
        self.used: list[set[str]] = [set() for _ in range(num_slots)]   # projections a slot adapts

    def set(self, slot: int, adapter: LoraAdapter) -> None:
        self.clear(slot)
        R = self.max_rank
        for (layer, target), (a, b) in adapter.weights.items():
            t = self.targets[target]
            r = a.shape[1]
            cols = slice(t.band * R, t.band * R + r)
            self.a[layer][t.projection][slot, :, cols] = a
            self.b[layer][t.projection][slot, cols, t.out_start:t.out_start + t.out_size] = b
            self.used[slot].add(t.projection)

    def clear(self, slot: int) -> None:
        for layer in range(self.config.num_hidden_layers):
            for p in PROJECTIONS:
                self.a[layer][p][slot] = 0.0
                self.b[layer][p][slot] = 0.0
        self.used[slot] = set()


@dataclass
class LoraBatch:
    """A step's view of the stack: the slot of every row (-1: base model)."""
    stack: LoraStack
    row_slots: np.ndarray        # [num_tokens] int64

    def __post_init__(self):
        self.rows = np.flatnonzero(self.row_slots >= 0)
        self.slots = self.row_slots[self.rows]
        projections = set().union(*(self.stack.used[s] for s in set(self.slots.tolist()))) if len(self.rows) else set()
        self.projections = projections

    @classmethod
    def single(cls, adapter: LoraAdapter, config: LlamaConfig, num_rows: int) -> "LoraBatch":
        """Every row on one adapter (the dense reference path)."""
        stack = LoraStack(config, 1, adapter.rank)
        stack.set(0, adapter)
        return cls(stack, np.zeros(num_rows, np.int64))

    def apply(self, layer: int, projection: str, x: np.ndarray, out: np.ndarray) -> None:
        """out[rows] += (x[rows] A[slot]) B[slot], each row with its own slot's A and B."""
        if projection not in self.projections:
            return
        a = self.stack.a[layer][projection][self.slots]          # [n, in, bands·R]  (the gather)
        b = self.stack.b[layer][projection][self.slots]          # [n, bands·R, out]
        shrunk = np.matmul(x[self.rows][:, None, :], a)          # [n, 1, bands·R]
        out[self.rows] += np.matmul(shrunk, b)[:, 0, :]
