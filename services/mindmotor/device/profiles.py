"""Model profiles: the shape of the model the emulated device pretends to serve.

The numpy model produces the tokens; the profile decides how big the weights and the KV cache
are on the card, and how many FLOPs and bytes a step costs. Sizes are per device under tensor
parallelism (Megatron sharding): attention heads, MLP columns and the vocabulary are split
across `tp` devices; KV heads are split too but never below one per device (replicated when
tp > num_kv_heads); norms are replicated.

Shapes from the models' Hugging Face `config.json` files (Qwen/Qwen2-7B, meta-llama/Llama-2-7b-hf,
meta-llama/Meta-Llama-3-70B).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ModelProfile:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int = 2                   # 2 = bf16
    tp: int = 1                            # tensor-parallel degree
    tied_embeddings: bool = False
    architecture: str = "LlamaForCausalLM"
    qkv_bias: bool = False                 # Qwen2; Llama/Qwen3 with attention_bias
    o_bias: bool = False                   # Llama/Qwen3 with attention_bias
    qk_norm: bool = False                  # Qwen3: RMSNorm weights of q and k heads
    sliding_window: int | None = None      # Mistral, Qwen2/3 sliding layers: keys a query reads
    num_sliding_layers: int = 0            # of num_layers, those with the window

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if self.num_heads % self.tp:
            raise ValueError(f"{self.name}: {self.num_heads} heads do not split over tp={self.tp}")
        if not 0 <= self.num_sliding_layers <= self.num_layers:
            raise ValueError(f"{self.name}: num_sliding_layers must be in [0, {self.num_layers}]")
        if self.num_sliding_layers and not (self.sliding_window and self.sliding_window > 0):
            raise ValueError(f"{self.name}: sliding layers need a positive sliding_window")

    @classmethod
    def from_model_shape(cls, name: str, *, num_layers: int, hidden_size: int,
                         intermediate_size: int, num_heads: int, num_kv_heads: int,
                         head_dim: int, vocab_size: int, tied_embeddings: bool,
                         dtype_bytes: int = 2, tp: int = 1, **architecture) -> "ModelProfile":
        """A profile for the served model itself (shape read from its config); `architecture`:
        the options above (architecture, qkv_bias, o_bias, qk_norm, sliding_window,
        num_sliding_layers)."""
        return cls(name=name, num_layers=num_layers, hidden_size=hidden_size,
                   intermediate_size=intermediate_size, num_heads=num_heads,
                   num_kv_heads=num_kv_heads, head_dim=head_dim, vocab_size=vocab_size,
                   dtype_bytes=dtype_bytes, tp=tp, tied_embeddings=tied_embeddings, **architecture)

    def with_tp(self, tp: int) -> "ModelProfile":
        return replace(self, tp=tp)

    # ---- per-device shard sizes -------------------------------------------------------------

    @property
    def heads_per_device(self) -> int:
        return self.num_heads // self.tp

    @property
    def kv_heads_per_device(self) -> int:
        return max(1, self.num_kv_heads // self.tp)

    @property
    def intermediate_per_device(self) -> int:
        return _ceil_div(self.intermediate_size, self.tp)

    @property
    def vocab_per_device(self) -> int:
        return _ceil_div(self.vocab_size, self.tp)

    # ---- parameter counts (elements) --------------------------------------------------------

    @property
    def attention_weights_per_layer(self) -> int:
        """Per device: Wq, Wk, Wv [hidden, (hq + 2 hkv) e] and Wo [hq e, hidden], plus the biases
        and q/k norms an architecture has (the o bias is replicated like the norms)."""
        hq, hkv = self.heads_per_device, self.kv_heads_per_device
        e, h = self.head_dim, self.hidden_size
        total = h * (hq + 2 * hkv) * e + hq * e * h
        total += (hq + 2 * hkv) * e if self.qkv_bias else 0
        total += h if self.o_bias else 0
        total += 2 * e if self.qk_norm else 0
        return total

    @property
    def mlp_weights_per_layer(self) -> int:
        """Per device: gate and up [hidden, I/tp], down [I/tp, hidden]."""
        return 3 * self.hidden_size * self.intermediate_per_device

    @property
    def embedding_weights(self) -> int:
        """Per device: embedding [V/tp, hidden], plus the LM head when untied."""
        matrices = 1 if self.tied_embeddings else 2
        return matrices * self.vocab_per_device * self.hidden_size

    @property
    def parameters_per_device(self) -> int:
        norms_per_layer = 2 * self.hidden_size
        per_layer = self.attention_weights_per_layer + self.mlp_weights_per_layer + norms_per_layer
        return self.num_layers * per_layer + self.embedding_weights + self.hidden_size

    @property
    def num_parameters(self) -> int:
        """The whole model's parameter count (all shards; independent of tp)."""
        return replace(self, tp=1).parameters_per_device

    # ---- bytes ------------------------------------------------------------------------------

    @property
    def weight_bytes(self) -> int:
        """Weights resident on one device."""
        return self.parameters_per_device * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, on one device: 2 * L * hkv * e * b."""
        return 2 * self.num_layers * self.kv_heads_per_device * self.head_dim * self.dtype_bytes


PROFILES: dict[str, ModelProfile] = {
    "qwen2-7b": ModelProfile("qwen2-7b", num_layers=28, hidden_size=3584, intermediate_size=18944,
                             num_heads=28, num_kv_heads=4, head_dim=128, vocab_size=152064),
    "llama2-7b": ModelProfile("llama2-7b", num_layers=32, hidden_size=4096, intermediate_size=11008,
                              num_heads=32, num_kv_heads=32, head_dim=128, vocab_size=32000),
    "llama3-70b": ModelProfile("llama3-70b", num_layers=80, hidden_size=8192,
                               intermediate_size=28672, num_heads=64, num_kv_heads=8, head_dim=128,
                               vocab_size=128256),
}


def get_profile(name: str, tp: int = 1) -> ModelProfile:
    """The named profile sharded over `tp` devices; ValueError naming the valid ones otherwise."""
    profile = PROFILES.get(str(name).strip().lower())
    if profile is None:
        raise ValueError(f"unknown model profile {name!r}; valid profiles: {', '.join(PROFILES)}")
    return profile.with_tp(tp)
