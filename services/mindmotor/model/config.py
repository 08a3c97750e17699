"""`LlamaConfig`: the shape and math of a served model, read from a Hugging Face `config.json`.

One decoder family with options covers the supported architectures:

| architecture        | what differs from Llama                                                 |
|---------------------|-------------------------------------------------------------------------|
| LlamaForCausalLM    | (Llama 1-3.x; `attention_bias` adds q/k/v/o biases)                     |
| Qwen2ForCausalLM    | q/k/v biases always; optional sliding window on layers ≥ max_window_layers |
| Qwen3ForCausalLM    | RMSNorm of q and k per head (q_norm / k_norm); head_dim is its own field |
| MistralForCausalLM  | sliding-window attention on every layer (`sliding_window`)              |
| Phi3ForCausalLM     | fused qkv_proj / gate_up_proj tensors; partial rotary; optional window  |
| GemmaForCausalLM    | embeddings × √hidden; RMSNorm weight + 1; GELU (tanh) MLP; tied           |

Both config layouts are read: transformers 5's `rope_parameters` (rope_theta inside) and the older
top-level `rope_theta` / `rope_scaling`. Every key of the file must be understood: either it changes
the math and is implemented (`MATH_FIELDS`), or it is on the explicit list of keys that do not change
a forward pass (`HARMLESS_FIELDS`). Anything else — an unknown key, an unsupported value (a rope type,
`hidden_act`, `mlp_bias`, quantization, custom code) — is refused with a `CheckpointError` naming the
field; nothing is ever silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .rope import RopeError, RopeSpec

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "MistralForCausalLM", "Phi3ForCausalLM", "GemmaForCausalLM")
MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
               "Qwen3ForCausalLM": "qwen3", "MistralForCausalLM": "mistral", "Phi3ForCausalLM": "phi3",
               "GemmaForCausalLM": "gemma"}
# The MLP activations implemented (transformers' ACT2FN names); gelu_new is the tanh form too.
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new")
# Architectures whose attention projections all carry a bias when attention_bias is set.
BIAS_ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM")
# What transformers' config class of each architecture assumes for a key the file does not have
# (a key present with null is read as null).
_COMMON_DEFAULTS = {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "num_key_value_heads": None,
                    "head_dim": None, "sliding_window": None, "tie_word_embeddings": False,
                    "hidden_act": "silu"}
ARCH_DEFAULTS = {
    "LlamaForCausalLM": _COMMON_DEFAULTS,
    "Qwen2ForCausalLM": {**_COMMON_DEFAULTS, "max_position_embeddings": 32768, "num_key_value_heads": 32,
                         "sliding_window": 4096},
    "Qwen3ForCausalLM": {**_COMMON_DEFAULTS, "max_position_embeddings": 32768, "num_key_value_heads": 32,
                         "head_dim": 128, "sliding_window": 4096},
    "MistralForCausalLM": {**_COMMON_DEFAULTS, "max_position_embeddings": 131072, "num_key_value_heads": 8,
                           "sliding_window": 4096},
    "Phi3ForCausalLM": {**_COMMON_DEFAULTS, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096},
    "GemmaForCausalLM": {**_COMMON_DEFAULTS, "max_position_embeddings": 8192, "num_key_value_heads": 16,
                         "head_dim": 256, "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh"},
}
# Architectures whose attention rotates only the first partial_rotary_factor of each head.
PARTIAL_ROTARY = ("Phi3ForCausalLM",)
# Rope types an architecture accepts in transformers (None: every type of rope.py).
ROPE_TYPES = {"Phi3ForCausalLM": ("default",)}

# Keys that never change the forward pass of a served model (metadata, training-only settings,
# generation defaults and tokenizer ids, output switches). `pretraining_tp` only slices the same
# matmuls; `attention_dropout` is off at inference.
HARMLESS_FIELDS = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "initializer_range", "attention_dropout", "pretraining_tp", "output_attentions",
    "output_hidden_states", "return_dict", "use_return_dict", "torchscript", "tokenizer_class",
    "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder",
    "is_decoder", "add_cross_attention", "tie_encoder_decoder", "prefix", "task_specific_params",
    "finetuning_task", "cross_attention_hidden_size", "pruned_heads", "resid_pdrop", "embd_pdrop",
    # generation defaults older transformers wrote into config.json (the engine's sampling
    # parameters come from each request)
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "tf_legacy_loss", "use_bfloat16",
})
# Keys that change the math, all implemented (per architecture below).
SHAPE_FIELDS = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim",
                          "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                          "hidden_act", "rope_theta", "rope_scaling", "rope_parameters",
                          "partial_rotary_factor"})
ARCH_FIELDS = {
    "LlamaForCausalLM": frozenset({"attention_bias", "mlp_bias"}),
    "Qwen2ForCausalLM": frozenset({"use_sliding_window", "sliding_window", "max_window_layers",
                                   "layer_types"}),
    "Qwen3ForCausalLM": frozenset({"attention_bias", "use_sliding_window", "sliding_window",
                                   "max_window_layers", "layer_types"}),
    "MistralForCausalLM": frozenset({"sliding_window"}),
    # original_max_position_embeddings only feeds longrope, which is refused; transformers' Phi-3
    # has no attention biases whatever attention_bias says (the official configs say false)
    "Phi3ForCausalLM": frozenset({"sliding_window", "original_max_position_embeddings",
                                  "attention_bias"}),
    # hidden_activation: older Gemma configs' name; must agree with hidden_act (transformers 5
    # reads hidden_act only)
    "GemmaForCausalLM": frozenset({"attention_bias", "use_bidirectional_attention", "hidden_activation"}),
}
MATH_FIELDS = {arch: SHAPE_FIELDS | extra for arch, extra in ARCH_FIELDS.items()}
LAYER_TYPES = ("full_attention", "sliding_attention")


class CheckpointError(ValueError):
    """A checkpoint that cannot be served; the message names the file (and tensor or field)."""


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2 always)
    head_dim: int | None = None
    architecture: str = "LlamaForCausalLM"
    torch_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    rope: RopeSpec | None = None          # None: default RoPE with rope_theta
    o_bias: bool = False                  # the output projection carries a bias (Llama/Qwen3 attention_bias)
    qk_norm: bool = False                 # Qwen3: RMSNorm over head_dim of each q and k head
    sliding_window: int | None = None     # keys a query sees (itself included) on sliding layers
    layer_types: tuple[str, ...] | None = None  # per layer: full_attention | sliding_attention
    hidden_act: str = "silu"              # the MLP's activation (ACTIVATIONS)
    embed_scale: float | None = None      # Gemma: embeddings × √hidden_size
    norm_offset: float = 0.0              # Gemma: RMSNorm multiplies by (offset + weight)
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.rope is None:
            object.__setattr__(self, "rope", RopeSpec(theta=float(self.rope_theta)))
        else:
            object.__setattr__(self, "rope_theta", self.rope.theta)
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            if len(self.layer_types) != self.num_hidden_layers:
                raise CheckpointError(f"layer_types has {len(self.layer_types)} entries for "
                                      f"{self.num_hidden_layers} layers")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise CheckpointError(f"sliding_window must be >= 1, got {self.sliding_window}")

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, list) else [self.eos_token_id]

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of `layer` (None: full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def max_window(self) -> int | None:
        """The sliding window if every layer uses it (then older KV is never read again)."""
        windows = {self.layer_window(i) for i in range(self.num_hidden_layers)}
        return windows.pop() if len(windows) == 1 else None

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> "LlamaConfig":
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise CheckpointError(
                f"{source}: architecture {arch!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)})")
        _check_auto_map(d.get("auto_map"), MODEL_TYPES[arch], source)
        known = MATH_FIELDS[arch] | HARMLESS_FIELDS | {"auto_map"}
        unknown = sorted(k for k in d if k not in known)
        if unknown:
            raise CheckpointError(
                f"{source}: field {unknown[0]!r} is not supported for {arch} (not implemented, "
                f"and not known to leave the math unchanged; refusing rather than ignoring it)")
        required = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"]
        missing = [k for k in required if k not in d]
        if missing:
            raise CheckpointError(f"{source}: missing keys {missing}")
        act = d.get("hidden_act") or ARCH_DEFAULTS[arch]["hidden_act"]
        if act not in ACTIVATIONS:
            raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (supported: "
                                  f"{', '.join(ACTIVATIONS)})")
        if d.get("hidden_activation") not in (None, act):
            raise CheckpointError(f"{source}: hidden_activation {d['hidden_activation']!r} and "
                                  f"hidden_act {act!r} disagree")
        if d.get("use_bidirectional_attention"):
            raise CheckpointError(f"{source}: use_bidirectional_attention true is not supported")
        if d.get("mlp_bias"):
            raise CheckpointError(f"{source}: mlp_bias true is not supported")
        defaults = ARCH_DEFAULTS[arch]
        d = {**{k: v for k, v in defaults.items() if k not in d}, **d}     # absent keys only
        max_pos = int(d["max_position_embeddings"])
        try:
            rope = read_rope(d, max_pos)
        except RopeError as exc:
            raise CheckpointError(f"{source}: {exc}") from exc
        allowed_types = ROPE_TYPES.get(arch)
        if allowed_types and rope.rope_type not in allowed_types:
            raise CheckpointError(f"{source}: rope_type {rope.rope_type!r} is not supported for {arch} "
                                  f"(supported: {', '.join(allowed_types)})")
        if rope.partial_rotary_factor != 1.0 and arch not in PARTIAL_ROTARY:
            raise CheckpointError(
                f"{source}: partial_rotary_factor {rope.partial_rotary_factor} is not supported for "
                f"{arch} (its attention rotates the whole head)")
        num_layers = int(d["num_hidden_layers"])
        sliding_window, layer_types = _read_window(d, arch, num_layers, source)
        is_qwen2 = arch == "Qwen2ForCausalLM"
        bias = bool(d.get("attention_bias", False))
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=num_layers,
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            max_position_embeddings=max_pos,
            rms_norm_eps=float(d["rms_norm_eps"]),
            tie_word_embeddings=bool(d["tie_word_embeddings"]),
            attention_bias=True if is_qwen2 else bias and arch in BIAS_ARCHITECTURES,
            o_bias=bias and arch in BIAS_ARCHITECTURES,
            hidden_act=act,
            embed_scale=float(d["hidden_size"]) ** 0.5 if arch == "GemmaForCausalLM" else None,
            norm_offset=1.0 if arch == "GemmaForCausalLM" else 0.0,
            qk_norm=arch == "Qwen3ForCausalLM",
            head_dim=d.get("head_dim"),
            architecture=arch,
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            rope=rope,
            sliding_window=sliding_window,
            layer_types=layer_types,
        )

    @classmethod
    def from_dir(cls, directory: str | Path) -> "LlamaConfig":
        path = Path(directory) / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (not a Hugging Face checkpoint directory)")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: invalid JSON: {exc}") from exc
        return cls.from_dict(data, source=str(path))

    def to_hf_dict(self) -> dict:
        """The `config.json` that Hugging Face transformers reads (the older top-level
        `rope_theta` / `rope_scaling` layout, which transformers 4 and 5 both read)."""
        d = {
            "architectures": [self.architecture],
            "model_type": MODEL_TYPES[self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": self.hidden_act,
            "torch_dtype": self.torch_dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        scaling = self.rope.to_parameters()
        scaling.pop("rope_theta")
        if scaling != {"rope_type": "default"}:
            d["rope_scaling"] = scaling
        if self.architecture in BIAS_ARCHITECTURES:
            d["attention_bias"] = self.attention_bias
        if self.architecture == "LlamaForCausalLM":
            d["mlp_bias"] = False
        if self.architecture in ("MistralForCausalLM", "Phi3ForCausalLM"):
            d["sliding_window"] = self.sliding_window
        elif self.architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
            d["use_sliding_window"] = self.sliding_window is not None
            d["sliding_window"] = self.sliding_window
            if self.layer_types is not None:
                d["layer_types"] = list(self.layer_types)
        return d

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        return d

    def num_parameters(self) -> int:
        h, i, L, v = self.hidden_size, self.intermediate_size, self.num_hidden_layers, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.attention_bias:
            per_layer += q + 2 * kv
        if self.o_bias:
            per_layer += h
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        return L * per_layer + embed + h


def read_rope(d: dict, max_position_embeddings: int) -> RopeSpec:
    """RoPE from either layout: transformers 5's `rope_parameters` (theta inside) or the older
    top-level `rope_theta` + `rope_scaling`. A config with both must not disagree."""
    new = d.get("rope_parameters")
    old = d.get("rope_scaling")
    if new is not None and not isinstance(new, dict):
        raise RopeError(f"rope_parameters must be an object, got {new!r}")
    if old is not None and not isinstance(old, dict):
        raise RopeError(f"rope_scaling must be an object or null, got {old!r}")
    if new and any(isinstance(v, dict) for v in new.values()):
        raise RopeError("rope_parameters per layer type are not supported")
    params = dict(old or {})
    where = "rope_scaling"
    if new:
        if old and _rope_type(old) != _rope_type(new):
            raise RopeError(f"rope_parameters ({_rope_type(new)}) and rope_scaling "
                            f"({_rope_type(old)}) disagree")
        params.update(new)
        where = "rope_parameters"
    if params.get("rope_theta") is None:
        if d.get("rope_theta") is not None:
            params["rope_theta"] = d["rope_theta"]
    elif d.get("rope_theta") is not None and float(d["rope_theta"]) != float(params["rope_theta"]):
        raise RopeError(f"rope_theta {d['rope_theta']} and {where}.rope_theta "
                        f"{params['rope_theta']} disagree")
    if d.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", d["partial_rotary_factor"])
    return RopeSpec.from_parameters(params, max_position_embeddings=max_position_embeddings,
                                    where=where)


def _check_auto_map(auto_map, model_type: str, source: str) -> None:
    """`auto_map` points transformers at custom modeling code. Accepted only when every class it
    names is the checkpoint's own copy of the architecture transformers now ships (Phi-3's official
    configs: `configuration_phi3.Phi3Config`, `modeling_phi3.Phi3ForCausalLM`); anything else may
    compute something else, and is refused."""
    if auto_map is None:
        return
    if not isinstance(auto_map, dict):
        raise CheckpointError(f"{source}: field 'auto_map' must be an object")
    native = (f"configuration_{model_type}.", f"modeling_{model_type}.")
    for target in auto_map.values():
        for name in (target if isinstance(target, list) else [target]):
            if name is not None and not str(name).startswith(native):
                raise CheckpointError(
                    f"{source}: field 'auto_map' names custom code {name!r}, which is not run "
                    f"(only the {model_type} architecture transformers ships is implemented)")


def _rope_type(params: dict) -> str:
    return params.get("rope_type", params.get("type")) or "default"


def _read_window(d: dict, arch: str, num_layers: int, source: str):
    """(sliding_window, layer_types) as transformers builds them for `arch`."""
    window = d.get("sliding_window")
    if arch in ("MistralForCausalLM", "Phi3ForCausalLM"):
        return (None if window is None else int(window)), None
    if arch not in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        return None, None
    if not d.get("use_sliding_window", False) or window is None:
        layer_types = d.get("layer_types")
        if layer_types and "sliding_attention" in layer_types:
            raise CheckpointError(f"{source}: layer_types has sliding_attention layers but "
                                  f"use_sliding_window is off")
        return None, None
    layer_types = d.get("layer_types")
    if layer_types is None:
        first = int(d.get("max_window_layers", 28))
        layer_types = ["sliding_attention" if i >= first else "full_attention"
                       for i in range(num_layers)]
    bad = [t for t in layer_types if t not in LAYER_TYPES]
    if bad:
        raise CheckpointError(f"{source}: layer_types value {bad[0]!r} is not supported")
    return int(window), tuple(layer_types)
