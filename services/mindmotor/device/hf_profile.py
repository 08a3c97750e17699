"""A model profile from a Hugging Face `config.json`, so a user can emulate the model they plan to
deploy: `profile_from_hf_config("path/to/config.json", tp=4)` (a directory holding one works too).

Dense decoder-only models of the Llama family (Llama, Qwen2/3, Mistral, ...): the fields read are
num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, num_key_value_heads
(default: the attention heads), head_dim (default hidden / heads), vocab_size,
tie_word_embeddings and torch_dtype (the dtype on the card; default bf16). Mixture-of-experts
configs are refused with a message (their MLP is not a dense GEMM chain).
"""

from __future__ import annotations

import json
from pathlib import Path

from mindmotor.device.profiles import PROFILES, ModelProfile, get_profile

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2, "fp32": 4}
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def profile_from_hf_config(path: str | Path, tp: int = 1) -> ModelProfile:
    """ValueError (naming the file and the field) for anything that is not a usable config."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read model config {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    config = config.get("text_config", config) if "num_hidden_layers" not in config else config
    moe = [k for k in MOE_KEYS if config.get(k)]
    if moe:
        raise ValueError(f"{path}: mixture-of-experts models ({moe[0]}) are not supported; "
                         "the emulator prices dense models")

    def field(name: str, default=None) -> int:
        value = config.get(name, default)
        if value is None:
            raise ValueError(f"{path}: missing {name!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{path}: {name!r} must be a positive integer, got {value!r}")
        return value

    heads = field("num_attention_heads")
    hidden = field("hidden_size")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"{path}: unknown torch_dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    name = str(config.get("_name_or_path") or path.parent.name or "model").rstrip("/").split("/")[-1]
    return ModelProfile(
        name=name, num_layers=field("num_hidden_layers"), hidden_size=hidden,
        intermediate_size=field("intermediate_size"), num_heads=heads,
        num_kv_heads=field("num_key_value_heads", heads),
        head_dim=field("head_dim", hidden // heads), vocab_size=field("vocab_size"),
        dtype_bytes=DTYPE_BYTES[dtype], tp=tp,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)))


def resolve_profile(model: str, tp: int = 1) -> ModelProfile:
    """A named profile (`qwen2-7b`, ...) or a path to a config.json / a checkpoint directory."""
    if str(model).strip().lower() in PROFILES:
        return get_profile(model, tp)
    if Path(model).exists():
        return profile_from_hf_config(model, tp)
    raise ValueError(f"unknown model {model!r}: neither a profile ({', '.join(PROFILES)}) "
                     "nor a config.json path")
