"""The Llama-architecture forward pass in numpy (float32): RMSNorm, RoPE, grouped-query attention,
SwiGLU MLP, tied or untied embeddings, and Qwen2's q/k/v bias.

Two entry points:
- `forward(...)`: the serving path — a flat batch of new tokens, paged KV cache, `AttentionMetadata`.
- `forward_dense(token_ids)`: a plain reference that recomputes the whole sequence with no cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .attention import AttentionMetadata, causal_attention, paged_attention, write_kv
from .config import LlamaConfig
from .kv_cache import PagedKVCache
from .weights import LlamaWeights


class RotaryEmbedding:
    """Hugging Face's rotate-half RoPE: the first and second halves of head_dim form the pairs."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
        angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)  # [max_pos, hd/2]
        self.cos = np.cos(angles).astype(np.float32)
        self.sin = np.sin(angles).astype(np.float32)

    def __call__(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: [num_tokens, n_heads, head_dim]; positions: [num_tokens]."""
        half = x.shape[-1] // 2
        cos = self.cos[positions][:, None, :]  # [num_tokens, 1, hd/2]
        sin = self.sin[positions][:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(variance + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class LlamaModel:
    def __init__(self, config: LlamaConfig, weights: LlamaWeights):
        self.config = config
        self.weights = weights
        self.rope = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)
        hd = config.head_dim
        self.q_size = config.num_attention_heads * hd
        self.kv_size = config.num_key_value_heads * hd

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "LlamaModel":
        config = LlamaConfig.from_dir(directory)
        return cls(config, LlamaWeights.from_dir(directory, config))

    # ---- the serving path -------------------------------------------------------------------
    def forward(self, input_ids: np.ndarray, positions: np.ndarray, meta: AttentionMetadata,
                cache: PagedKVCache, logits_indices: np.ndarray) -> np.ndarray:
        """input_ids, positions: [num_tokens] → logits [len(logits_indices), vocab]."""
        cfg = self.config
        x = self.weights.embed[input_ids]                            # [N, hidden]
        for i, layer in enumerate(self.weights.layers):
            q, k, v = self._qkv(rms_norm(x, layer.input_norm, cfg.rms_norm_eps), layer, positions)
            write_kv(cache, i, meta.slot_mapping, k, v)
            attn = paged_attention(q, cache, i, meta)                  # [N, n_heads, hd]
            x = x + attn.reshape(len(x), -1) @ layer.o
            x = x + self._mlp(rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer)
        x = rms_norm(x[logits_indices], self.weights.norm, cfg.rms_norm_eps)
        return x @ self.weights.lm_head                                # [S, vocab]

    # ---- the reference path -----------------------------------------------------------------
    def forward_dense(self, token_ids) -> np.ndarray:
        """Logits [T, vocab] for every position, recomputing everything (no cache)."""
        return self.forward_dense_hidden_states(token_ids, with_logits=True)[1]

    def forward_dense_hidden_states(self, token_ids, with_logits: bool = False):
        """Hidden states after the embedding and each layer: [num_layers + 1, T, hidden]
        (and the logits when asked)."""
        cfg = self.config
        ids = np.asarray(token_ids, dtype=np.int64)
        positions = np.arange(len(ids))
        x = self.weights.embed[ids]
        states = [x]
        for layer in self.weights.layers:
            q, k, v = self._qkv(rms_norm(x, layer.input_norm, cfg.rms_norm_eps), layer, positions)
            attn = causal_attention(q, k, v, cfg.num_key_value_heads)
            x = x + attn.reshape(len(x), -1) @ layer.o
            x = x + self._mlp(rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer)
            states.append(x)
        hidden = np.stack(states)
        if not with_logits:
            return hidden
        return hidden, rms_norm(x, self.weights.norm, cfg.rms_norm_eps) @ self.weights.lm_head

    # ---- blocks -----------------------------------------------------------------------------
    def _qkv(self, h: np.ndarray, layer, positions: np.ndarray):
        cfg = self.config
        qkv = h @ layer.qkv                                          # [N, q_size + 2·kv_size]
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias
        n = len(h)
        q = qkv[:, :self.q_size].reshape(n, cfg.num_attention_heads, cfg.head_dim)
        k = qkv[:, self.q_size:self.q_size + self.kv_size].reshape(n, cfg.num_key_value_heads, cfg.head_dim)
        v = qkv[:, self.q_size + self.kv_size:].reshape(n, cfg.num_key_value_heads, cfg.head_dim)
        return self.rope(q, positions), self.rope(k, positions), v

    def _mlp(self, h: np.ndarray, layer) -> np.ndarray:
        gate_up = h @ layer.gate_up                                  # [N, 2·intermediate]
        inter = self.config.intermediate_size
        return (silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ layer.down
