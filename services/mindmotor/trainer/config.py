"""`TrainConfig`: everything a training run needs to know, in one flat frozen dataclass, and the
presets (`tiny` for tests, `quick` for a first model in minutes, `demo` for the bundled model).

A config is checked completely before any work starts: unknown keys, wrong types, impossible
shapes and a missing or empty corpus are refused with a `ConfigError` that says why.
No PyTorch here: the gRPC service validates configs without importing it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from mindmotor.model.config import LlamaConfig

PRECISIONS = ("fp32", "bf16", "fp16")
# A byte-level BPE has 256 byte tokens plus our 3 special tokens before any merge.
MIN_VOCAB_SIZE = 256 + 3


class ConfigError(ValueError):
    """A training configuration that cannot run; the message says which key and why."""


@dataclass(frozen=True)
class TrainConfig:
    # ---- model shape (Llama architecture) ----
    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    init_std: float = 0.02
    # ---- data ----
    corpus: tuple[str, ...] = ()        # files or directories; empty: the Python stdlib sources
    max_corpus_bytes: int = 0           # 0: no limit (files are taken in path order until full)
    seq_len: int = 512
    val_fraction: float = 0.02
    tokenizer_min_frequency: int = 2
    # ---- optimisation ----
    steps: int = 2000
    batch_size: int = 16                # sequences per optimizer step, across all processes
    micro_batch_size: int = 8           # sequences per forward/backward on one process
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # ---- run ----
    seed: int = 1234
    precision: str = "fp32"             # fp32 | bf16 (autocast) | fp16 (autocast + loss scaling)
    activation_checkpointing: bool = False
    eval_interval: int = 100            # steps between validation passes (and at the end)
    eval_batches: int = 8               # micro-batches per validation pass (per process)
    checkpoint_interval: int = 500      # steps between checkpoints (and at the end)
    log_interval: int = 1               # steps between progress events
    # ---- LoRA (trainer/lora.py): rank 0 trains every weight; > 0 trains an adapter on --init-from ----
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    # ---------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict, base: "TrainConfig | None" = None) -> "TrainConfig":
        """`base` (default: the class defaults) with `data` applied; unknown keys are refused."""
        if not isinstance(data, dict):
            raise ConfigError(f"a training config is a JSON object, not {type(data).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"unknown config keys {unknown} (known keys: {', '.join(known)})")
        values = {name: _coerce(name, known[name].type, value) for name, value in data.items()}
        config = dataclasses.replace(base or cls(), **values)
        config.check_shapes()
        return config

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["corpus"] = list(self.corpus)
        return d

    def digest(self) -> str:
        """sha256 of the canonical JSON of this config."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def model_config(self, eos_token_id: int | None = None) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=self.attention_bias, head_dim=self.head_dim,
            architecture="LlamaForCausalLM", torch_dtype="float32",
            bos_token_id=None, eos_token_id=eos_token_id)

    # ---------------------------------------------------------------------------------------
    def check_shapes(self) -> None:
        """Everything that can be said about the numbers alone (no files, no processes)."""
        positive = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                    "seq_len", "steps", "batch_size", "micro_batch_size", "eval_interval",
                    "eval_batches", "checkpoint_interval", "log_interval",
                    "tokenizer_min_frequency"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ["lr", "rope_theta", "rms_norm_eps", "init_std"]:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        _require(self.vocab_size >= MIN_VOCAB_SIZE,
                 f"vocab_size {self.vocab_size} is below {MIN_VOCAB_SIZE} (256 byte tokens + 3 "
                 f"special tokens)")
        _require(self.hidden_size % self.num_attention_heads == 0,
                 f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                 f"{self.num_attention_heads}")
        _require(self.num_attention_heads % self.num_key_value_heads == 0,
                 f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                 f"num_key_value_heads {self.num_key_value_heads}")
        _require(self.head_dim % 2 == 0, f"head_dim {self.head_dim} must be even for RoPE")
        _require(self.lora_rank >= 0, f"lora_rank must be at least 0 (0: no adapter), got {self.lora_rank}")
        _require(self.lora_alpha > 0, f"lora_alpha must be positive, got {self.lora_alpha}")
        lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        bad = [t for t in self.lora_target_modules if t not in lora_targets]
        _require(bool(self.lora_target_modules) and not bad,
                 f"lora_target_modules {list(bad or self.lora_target_modules)}: each must be one of {list(lora_targets)}")
        _require(self.seq_len <= self.max_position_embeddings,
                 f"seq_len {self.seq_len} exceeds max_position_embeddings "
                 f"{self.max_position_embeddings}")
        _require(self.batch_size % self.micro_batch_size == 0,
                 f"batch_size {self.batch_size} is not a multiple of micro_batch_size "
                 f"{self.micro_batch_size}")
        _require(0 <= self.min_lr <= self.lr, f"min_lr {self.min_lr} must be in [0, lr={self.lr}]")
        _require(self.warmup_steps >= 0, f"warmup_steps {self.warmup_steps} must be >= 0")
        _require(0 < self.val_fraction < 1, f"val_fraction {self.val_fraction} must be in (0, 1)")
        _require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "beta1 and beta2 must be in [0, 1)")
        _require(self.weight_decay >= 0 and self.grad_clip >= 0,
                 "weight_decay and grad_clip must be >= 0 (grad_clip 0: no clipping)")
        _require(self.max_corpus_bytes >= 0, "max_corpus_bytes must be >= 0")
        _require(self.precision in PRECISIONS,
                 f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")

    def check_world_size(self, world_size: int) -> None:
        _require(world_size >= 1, f"the number of processes must be >= 1, got {world_size}")
        _require(self.batch_size % (self.micro_batch_size * world_size) == 0,
                 f"batch_size {self.batch_size} must be a multiple of micro_batch_size × processes "
                 f"= {self.micro_batch_size} × {world_size}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _coerce(name: str, annotation: str, value):
    """Check one JSON value against the field's type; ints are accepted where floats are."""
    if annotation == "bool":
        if isinstance(value, bool):
            return value
    elif annotation == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif annotation == "str":
        if isinstance(value, str):
            return value
    elif annotation.startswith("tuple[str"):
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
    raise ConfigError(f"{name} must be of type {annotation}, got {value!r}")


# ---- presets -------------------------------------------------------------------------------
PRESETS: dict[str, TrainConfig] = {
    # For tests and smoke runs: trains in seconds on one CPU core.
    "tiny": TrainConfig(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=False, seq_len=64, val_fraction=0.1, steps=20, batch_size=4,
        micro_batch_size=2, lr=3e-3, min_lr=3e-4, warmup_steps=4, eval_interval=10,
        eval_batches=2, checkpoint_interval=10),
    # The bundled demo model, trained on the Python standard library's sources (outside its test
    # suites). d_model 256, 4 layers, GQA 8 query / 2 kv heads of 32, SwiGLU 768, vocab 4096, tied
    # embeddings, context 4096, trained at 512. The shape is chosen for the serving host as much
    # as for quality: the numpy forward of a decode batch of 128 must stay under the emulated
    # Qwen2-7B step time (docs/benchmarks.md), and KV gathers scale with kv heads, the LM head
    # with the vocabulary. 16 × 512 = 8192 tokens per step; 1000 steps ≈ 8 M tokens.
    "demo": TrainConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, seq_len=512, val_fraction=0.02, steps=1000, batch_size=16,
        micro_batch_size=8, lr=2e-3, min_lr=2e-4, warmup_steps=60, weight_decay=0.1,
        precision="bf16",
        eval_interval=200, eval_batches=8, checkpoint_interval=200, log_interval=1),
    # A first servable model in minutes on 2 CPU cores (docs/operations.md has the measured time
    # and loss): the demo's width, heads and vocabulary (so `--tokenizer-from` the bundled model
    # fits it unchanged), half its depth, context 128, 400 steps of 16 × 128 tokens on the first
    # 4 MB of the corpus (tokenizing all of the stdlib would take longer than the training), fp32
    # (bf16 autocast is twice as slow on a CPU without bf16 units).
    "quick": TrainConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, max_corpus_bytes=4_000_000, seq_len=128, val_fraction=0.02,
        steps=400, batch_size=16, micro_batch_size=16, lr=3e-3, min_lr=3e-4, warmup_steps=30,
        weight_decay=0.1, precision="fp32",
        eval_interval=100, eval_batches=4, checkpoint_interval=100, log_interval=1),
}


def preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (presets: {', '.join(PRESETS)})")
    return PRESETS[name]


def load_config(preset_name: str = "tiny", overrides: dict | None = None) -> TrainConfig:
    """A preset with `overrides` applied and checked."""
    return TrainConfig.from_dict(overrides or {}, base=preset(preset_name))
