"""The Llama-architecture forward pass in numpy (float32): RMSNorm, RoPE (every variant in
`rope.py`), grouped-query attention, SwiGLU MLP, tied or untied embeddings, and the options of the
related architectures (`config.py`): q/k/v and o biases, Qwen3's per-head q/k RMSNorm, Gemma's
embedding scale and GELU, Phi-3's partial rotary, sliding-window attention (Mistral, Phi-3, Qwen2/3
sliding layers).

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
from .lora import LoraAdapter, LoraBatch
from .rope import RotaryEmbedding
from .weights import LlamaWeights


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(variance + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + exp(-x)), the same operations in one buffer (no temporaries)."""
    t = np.negative(x)
    np.exp(t, out=t)
    t += 1.0
    np.divide(x, t, out=t)
    return t


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (x + np.float32(0.044715) * x ** 3)))


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU; erf from Abramowitz & Stegun 7.1.26 in float64 (|error| < 1.5e-7)."""
    z = np.abs(x.astype(np.float64)) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return (0.5 * x * (1.0 + erf)).astype(x.dtype)


ACTIVATIONS = {"silu": silu, "gelu": gelu, "gelu_pytorch_tanh": gelu_tanh, "gelu_new": gelu_tanh}


class LlamaModel:
    def __init__(self, config: LlamaConfig, weights: LlamaWeights):
        self.config = config
        self.weights = weights
        self.rope = RotaryEmbedding(config.rope, config.head_dim, config.max_position_embeddings,
                                    config.max_position_embeddings)
        self.windows = [config.layer_window(i) for i in range(config.num_hidden_layers)]
        self.act = ACTIVATIONS[config.hidden_act]
        hd = config.head_dim
        self.q_size = config.num_attention_heads * hd
        self.kv_size = config.num_key_value_heads * hd

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "LlamaModel":
        config = LlamaConfig.from_dir(directory)
        return cls(config, LlamaWeights.from_dir(directory, config))

    # ---- the serving path -------------------------------------------------------------------
    def forward(self, input_ids: np.ndarray, positions: np.ndarray, meta: AttentionMetadata,
                cache: PagedKVCache, logits_indices: np.ndarray, lora: LoraBatch | None = None) -> np.ndarray:
        """input_ids, positions: [num_tokens] → logits [len(logits_indices), vocab]. `lora`: each
        token's adapter slot (model/lora.py), applied per row in the same batch."""
        cfg = self.config
        x = self._embed(input_ids)                                   # [N, hidden]
        for i, layer in enumerate(self.weights.layers):
            q, k, v = self._qkv(rms_norm(x, layer.input_norm, cfg.rms_norm_eps), layer, positions, lora, i)
            write_kv(cache, i, meta.slot_mapping, k, v)
            if meta.decode_kv is not None:                           # the decodes' rows kept across steps
                meta.decode_kv.write(i, k[:meta.num_decodes], v[:meta.num_decodes])
            attn = paged_attention(q, cache, i, meta, self.windows[i])  # [N, n_heads, hd]
            x = x + self._out(attn, layer, lora, i)
            x = x + self._mlp(rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer, lora, i)
        x = rms_norm(x[logits_indices], self.weights.norm, cfg.rms_norm_eps)
        return x @ self.weights.lm_head                                # [S, vocab]

    # ---- the reference path -----------------------------------------------------------------
    def forward_dense(self, token_ids, adapter: LoraAdapter | None = None) -> np.ndarray:
        """Logits [T, vocab] for every position, recomputing everything (no cache); with `adapter`
        applied when given."""
        return self.forward_dense_hidden_states(token_ids, with_logits=True, adapter=adapter)[1]

    def forward_dense_hidden_states(self, token_ids, with_logits: bool = False,
                                    adapter: LoraAdapter | None = None):
        """Hidden states after the embedding and each layer: [num_layers + 1, T, hidden]
        (and the logits when asked)."""
        cfg = self.config
        ids = np.asarray(token_ids, dtype=np.int64)
        positions = np.arange(len(ids))
        lora = LoraBatch.single(adapter, cfg, len(ids)) if adapter is not None else None
        x = self._embed(ids)
        states = [x]
        for i, layer in enumerate(self.weights.layers):
            q, k, v = self._qkv(rms_norm(x, layer.input_norm, cfg.rms_norm_eps), layer, positions, lora, i)
            attn = causal_attention(q, k, v, cfg.num_key_value_heads, self.windows[i])
            x = x + self._out(attn, layer, lora, i)
            x = x + self._mlp(rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer, lora, i)
            states.append(x)
        hidden = np.stack(states)
        if not with_logits:
            return hidden
        return hidden, rms_norm(x, self.weights.norm, cfg.rms_norm_eps) @ self.weights.lm_head

    # ---- blocks -----------------------------------------------------------------------------
    def _embed(self, ids: np.ndarray) -> np.ndarray:
        x = self.weights.embed[ids]
        if self.config.embed_scale is not None:                      # Gemma
            x = x * np.float32(self.config.embed_scale)
        return x

    def _qkv(self, h: np.ndarray, layer, positions: np.ndarray, lora: LoraBatch | None = None, i: int = 0):
        cfg = self.config
        qkv = h @ layer.qkv                                          # [N, q_size + 2·kv_size]
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias
        if lora is not None:
            lora.apply(i, "qkv", h, qkv)
        n = len(h)
        q = qkv[:, :self.q_size].reshape(n, cfg.num_attention_heads, cfg.head_dim)
        k = qkv[:, self.q_size:self.q_size + self.kv_size].reshape(n, cfg.num_key_value_heads, cfg.head_dim)
        v = qkv[:, self.q_size + self.kv_size:].reshape(n, cfg.num_key_value_heads, cfg.head_dim)
        if layer.q_norm is not None:                                 # Qwen3: per head, before RoPE
            q = rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        return self.rope(q, positions), self.rope(k, positions), v

    def _out(self, attn: np.ndarray, layer, lora: LoraBatch | None = None, i: int = 0) -> np.ndarray:
        flat = attn.reshape(len(attn), -1)
        out = flat @ layer.o
        if layer.o_bias is not None:
            out += layer.o_bias
        if lora is not None:
            lora.apply(i, "o", flat, out)
        return out

    def _mlp(self, h: np.ndarray, layer, lora: LoraBatch | None = None, i: int = 0) -> np.ndarray:
        gate_up = h @ layer.gate_up                                  # [N, 2·intermediate]
        if lora is not None:
            lora.apply(i, "gate_up", h, gate_up)
        inter = self.config.intermediate_size
        inner = self.act(gate_up[:, :inter])
        inner *= gate_up[:, inter:]
        out = inner @ layer.down
        if lora is not None:
            lora.apply(i, "down", inner, out)
        return out
