"""`LlamaWeights`: the tensors of a checkpoint (the architectures of config.py), checked against the
config and laid out for fast inference (q/k/v and gate/up fused, matrices transposed so that `x @
w` is the projection).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import CheckpointError, LlamaConfig
from .safetensors_io import load_checkpoint_tensors

FUSED_ARCHITECTURES = ("Phi3ForCausalLM",)   # checkpoints that store qkv_proj and gate_up_proj


@dataclass
class LayerWeights:
    input_norm: np.ndarray      # [hidden]
    qkv: np.ndarray             # [hidden, (n_heads + 2·n_kv_heads)·head_dim]
    qkv_bias: np.ndarray | None  # [(n_heads + 2·n_kv_heads)·head_dim]
    o: np.ndarray               # [n_heads·head_dim, hidden]
    o_bias: np.ndarray | None   # [hidden] (Llama / Qwen3 with attention_bias)
    q_norm: np.ndarray | None   # [head_dim] (Qwen3)
    k_norm: np.ndarray | None   # [head_dim] (Qwen3)
    post_norm: np.ndarray       # [hidden]
    gate_up: np.ndarray         # [hidden, 2·intermediate]
    down: np.ndarray            # [intermediate, hidden]


@dataclass
class LlamaWeights:
    embed: np.ndarray           # [vocab, hidden]
    layers: list[LayerWeights]
    norm: np.ndarray            # [hidden]
    lm_head: np.ndarray         # [hidden, vocab]

    @property
    def nbytes(self) -> int:
        total = self.embed.nbytes + self.norm.nbytes
        total += 0 if self.lm_head.base is self.embed else self.lm_head.nbytes
        for layer in self.layers:
            total += sum(a.nbytes for a in vars(layer).values() if a is not None)
        return total

    @classmethod
    def from_dir(cls, directory: str | Path, config: LlamaConfig) -> "LlamaWeights":
        tensors = load_checkpoint_tensors(directory)
        return cls.from_tensors(tensors, config, source=str(Path(directory) / "model.safetensors"))

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray], config: LlamaConfig,
                     source: str = "model.safetensors") -> "LlamaWeights":
        take = _TensorTaker(tensors, source)
        h, hd = config.hidden_size, config.head_dim
        q_dim, kv_dim = config.num_attention_heads * hd, config.num_key_value_heads * hd
        inter, vocab = config.intermediate_size, config.vocab_size

        layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            if config.architecture in FUSED_ARCHITECTURES:    # Phi-3: q, k, v in one tensor
                q, k, v = np.split(take(p + "self_attn.qkv_proj.weight", (q_dim + 2 * kv_dim, h)),
                                   [q_dim, q_dim + kv_dim])
            else:
                q = take(p + "self_attn.q_proj.weight", (q_dim, h))
                k = take(p + "self_attn.k_proj.weight", (kv_dim, h))
                v = take(p + "self_attn.v_proj.weight", (kv_dim, h))
            bias = None
            if config.attention_bias:
                bias = np.concatenate([take(p + "self_attn.q_proj.bias", (q_dim,)),
                                       take(p + "self_attn.k_proj.bias", (kv_dim,)),
                                       take(p + "self_attn.v_proj.bias", (kv_dim,))])
            o_bias = take(p + "self_attn.o_proj.bias", (h,)) if config.o_bias else None
            q_norm = take(p + "self_attn.q_norm.weight", (hd,)) if config.qk_norm else None
            k_norm = take(p + "self_attn.k_norm.weight", (hd,)) if config.qk_norm else None
            if config.architecture in FUSED_ARCHITECTURES:    # gate first, then up
                gate, up = np.split(take(p + "mlp.gate_up_proj.weight", (2 * inter, h)), [inter])
            else:
                gate = take(p + "mlp.gate_proj.weight", (inter, h))
                up = take(p + "mlp.up_proj.weight", (inter, h))
            layers.append(LayerWeights(
                input_norm=take(p + "input_layernorm.weight", (h,)),
                qkv=np.ascontiguousarray(np.concatenate([q, k, v]).T),
                qkv_bias=bias,
                o=np.ascontiguousarray(take(p + "self_attn.o_proj.weight", (h, q_dim)).T),
                o_bias=o_bias, q_norm=q_norm, k_norm=k_norm,
                post_norm=take(p + "post_attention_layernorm.weight", (h,)),
                gate_up=np.ascontiguousarray(np.concatenate([gate, up]).T),
                down=np.ascontiguousarray(take(p + "mlp.down_proj.weight", (h, inter)).T),
            ))
        embed = take("model.embed_tokens.weight", (vocab, h))
        if config.tie_word_embeddings and "lm_head.weight" not in tensors:
            lm_head = embed.T
        else:
            lm_head = np.ascontiguousarray(take("lm_head.weight", (vocab, h)).T)
        weights = cls(embed=embed, layers=layers, norm=take("model.norm.weight", (h,)), lm_head=lm_head)
        if config.norm_offset:                     # Gemma: RMSNorm scales by (1 + weight)
            weights.norm = weights.norm + config.norm_offset
            for layer in layers:
                layer.input_norm = layer.input_norm + config.norm_offset
                layer.post_norm = layer.post_norm + config.norm_offset
        take.check_all_used()
        return weights


class _TensorTaker:
    """Looks tensors up by name and shape; every error names the file and the tensor."""

    # Buffers some exporters write that inference does not use.
    IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

    def __init__(self, tensors: dict[str, np.ndarray], source: str):
        self.tensors = tensors
        self.source = source
        self.used: set[str] = set()

    def __call__(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.tensors:
            raise CheckpointError(f"{self.source}: missing tensor {name!r}")
        array = self.tensors[name]
        if tuple(array.shape) != shape:
            raise CheckpointError(
                f"{self.source}: tensor {name!r} has shape {tuple(array.shape)}, expected {shape} "
                f"from config.json")
        self.used.add(name)
        return np.ascontiguousarray(array, dtype=np.float32)

    def check_all_used(self) -> None:
        unused = [n for n in self.tensors if n not in self.used and n != "lm_head.weight"
                  and not n.endswith(self.IGNORED_SUFFIXES)]
        if unused:
            raise CheckpointError(
                f"{self.source}: unexpected tensors {sorted(unused)[:5]} (is config.json for this "
                f"checkpoint? num_hidden_layers / architecture may not match)")
