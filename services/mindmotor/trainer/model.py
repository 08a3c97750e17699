"""A Llama-architecture decoder in PyTorch whose parameters are named and shaped exactly like
Hugging Face's `LlamaForCausalLM`, so `state_dict()` is a loadable HF checkpoint.

RMSNorm (computed in float32), rotate-half RoPE, grouped-query attention, SwiGLU MLP, optional
tied embeddings and q/k/v bias. Names mirror the HF modules:

    model.embed_tokens / model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
    post_attention_layernorm, mlp.{gate,up,down}_proj} / model.norm / lm_head
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from mindmotor.model.config import LlamaConfig


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables [positions, head_dim], the two halves of head_dim sharing frequencies."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim/2]

    def forward(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(seq_len, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(positions, self.inv_freq)          # [T, head_dim/2]
        angles = torch.cat([freqs, freqs], dim=-1)             # [T, head_dim]
        return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, T, head_dim]; cos, sin: [T, head_dim]."""
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        h, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)     # [B, H, T, hd]
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, KV, T, hd]
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.n_heads // self.n_kv_heads    # query heads per kv head, kv head j serves j·group…
        k = k.repeat_interleave(group, dim=1)      # [B, H, T, hd]
        v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)                   # [B, H, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """HF's `LlamaModel`: embeddings, the decoder layers, the final norm."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig, activation_checkpointing: bool = False):
        super().__init__()
        self.config = config
        self.activation_checkpointing = activation_checkpointing
        self.model = LlamaBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, std: float, generator: torch.Generator) -> None:
        """Normal(0, std) matrices, the residual outputs scaled by 1/sqrt(2·layers); ones norms."""
        residual_std = std / (2 * self.config.num_hidden_layers) ** 0.5
        for name, param in self.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                elif name.endswith(".bias"):
                    param.zero_()
                elif name.endswith(("o_proj.weight", "down_proj.weight")):
                    param.normal_(0.0, residual_std, generator=generator)
                else:
                    param.normal_(0.0, std, generator=generator)

    def hidden_states(self, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """The embedding output and each layer's output (before the final norm): L+1 × [B, T, h]."""
        cos, sin = self.model.rotary_emb(input_ids.shape[1])
        x = self.model.embed_tokens(input_ids)                     # [B, T, hidden]
        states = [x]
        for layer in self.model.layers:
            if self.activation_checkpointing and self.training:
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
            states.append(x)
        return states

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, T] → logits [B, T, vocab]."""
        x = self.hidden_states(input_ids)[-1]
        return self.lm_head(self.model.norm(x))

    def loss(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross entropy (in float32) over every position."""
        logits = self(input_ids)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Float32, contiguous, unshared tensors under HF names (`lm_head.weight` absent if tied)."""
        tensors = {name: t.detach().float().contiguous().clone() for name, t in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            tensors.pop("lm_head.weight")
        return tensors

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        tensors = dict(tensors)
        if self.config.tie_word_embeddings:
            tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"])
        self.load_state_dict(tensors, strict=True)
