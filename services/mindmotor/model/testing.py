"""Small random-weight checkpoints in Hugging Face layout, for tests and benchmarks.

The tokenizer is a real byte-level BPE trained here on a few Python standard-library sources, so
text round-trips exactly and nothing is downloaded.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from mindmotor.common.tokenizer import EOS_TOKEN, save_tokenizer, train_bpe

from .config import LlamaConfig

TOKENIZER_CORPUS_MODULES = ("textwrap", "json.decoder", "string", "fractions")


@lru_cache(maxsize=4)
def _trained_tokenizer(vocab_size: int):
    import importlib
    import inspect

    texts = [inspect.getsource(importlib.import_module(m)) for m in TOKENIZER_CORPUS_MODULES]
    texts += ["The quick brown fox jumps over the lazy dog. Hello, world! 你好 😀"]
    return train_bpe(texts, vocab_size=vocab_size)


def tiny_tokenizer(vocab_size: int = 384):
    """The trained byte-level BPE tokenizer the tiny checkpoints use (cached per vocab size)."""
    return _trained_tokenizer(vocab_size)


def tiny_config(vocab_size: int, **overrides) -> LlamaConfig:
    fields = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  rope_theta=10000.0, tie_word_embeddings=False)
    fields.update(overrides)
    return LlamaConfig(**fields)


def random_tensors(config: LlamaConfig, seed: int = 0, scale: float = 0.08) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, hd = config.hidden_size, config.head_dim
    q_dim, kv_dim = config.num_attention_heads * hd, config.num_key_value_heads * hd

    def w(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(config.vocab_size, h), "model.norm.weight": norm()}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": norm(),
            p + "self_attn.q_proj.weight": w(q_dim, h),
            p + "self_attn.k_proj.weight": w(kv_dim, h),
            p + "self_attn.v_proj.weight": w(kv_dim, h),
            p + "self_attn.o_proj.weight": w(h, q_dim),
            p + "post_attention_layernorm.weight": norm(),
            p + "mlp.gate_proj.weight": w(config.intermediate_size, h),
            p + "mlp.up_proj.weight": w(config.intermediate_size, h),
            p + "mlp.down_proj.weight": w(h, config.intermediate_size),
        })
        if config.o_bias:
            tensors[p + "self_attn.o_proj.bias"] = w(h)
        if config.qk_norm:
            tensors[p + "self_attn.q_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
            tensors[p + "self_attn.k_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
        if config.attention_bias:
            tensors[p + "self_attn.q_proj.bias"] = w(q_dim)
            tensors[p + "self_attn.k_proj.bias"] = w(kv_dim)
            tensors[p + "self_attn.v_proj.bias"] = w(kv_dim)
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = w(config.vocab_size, h)
    return tensors


def write_tiny_checkpoint(directory: str | Path, *, vocab_size: int = 384, seed: int = 0,
                          dtype: str = "float32", **config_overrides) -> Path:
    """A complete HF checkpoint directory with random weights; returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = _trained_tokenizer(vocab_size)
    eos_id = tok.token_to_id(EOS_TOKEN)
    config = tiny_config(tok.get_vocab_size(), eos_token_id=eos_id, torch_dtype=dtype, **config_overrides)
    tensors = random_tensors(config, seed=seed)
    if dtype == "float16":
        tensors = {k: v.astype(np.float16) for k, v in tensors.items()}
    elif dtype != "float32":
        raise ValueError(f"write_tiny_checkpoint writes float32 or float16, not {dtype}")
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}) + "\n")
    save_tokenizer(tok, directory, model_max_length=config.max_position_embeddings)
    return directory


def write_random_adapter(directory: str | Path, config: LlamaConfig, *, rank: int = 8, alpha: float = 16.0,
                         targets=("q_proj", "k_proj", "v_proj", "o_proj"), seed: int = 0,
                         scale: float = 0.3) -> Path:
    """A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors, PEFT's names)
    with random A and B, for a Llama-layout `config` (no peft needed)."""
    from .lora import targets_of

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = targets_of(config)
    tensors = {}
    for i in range(config.num_hidden_layers):
        for name in targets:
            t = shapes[name]
            p = f"base_model.model.model.layers.{i}.{t.module}.{name}"
            tensors[p + ".lora_A.weight"] = (rng.standard_normal((rank, t.in_size)) * scale).astype(np.float32)
            tensors[p + ".lora_B.weight"] = (rng.standard_normal((t.out_size, rank)) * scale).astype(np.float32)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "target_modules": list(targets), "bias": "none", "use_dora": False, "use_rslora": False}, indent=2))
    return directory
