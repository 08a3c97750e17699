"""Rotary position embeddings: the variants Hugging Face checkpoints use, as transformers defines them.

`RopeSpec` is the normalised `rope_parameters` of a config (both layouts read by `config.py`);
`RotaryEmbedding` turns it into cos/sin tables and applies them (rotate-half layout: the first and
second halves of the rotated dimensions form the pairs; with a partial rotary factor only the first
`rotary_dim` dimensions of a head turn, the rest pass through).

Variants:
- default: inv_freq_i = θ^(-2i/d).
- linear: inv_freq / factor (position interpolation).
- dynamic (NTK): θ' = θ·(factor·L/max_pos − (factor − 1))^(d/(d−2)) once the sequence length L passes
  max_position_embeddings; below it, the default. transformers recomputes θ' for the longest position
  of each forward pass; here each token is rotated with θ' of its own position + 1 (the same as
  transformers for every generated token; a prompt longer than max_position_embeddings would differ,
  and the engine never serves one: max_model_len ≤ max_position_embeddings).
- llama3: low frequencies (wavelength > original/low_freq_factor) divided by factor, high ones kept,
  the band between interpolated smoothly.
- yarn: a ramp between interpolated and extrapolated frequencies over the dimensions whose number of
  rotations over the original context falls between beta_slow and beta_fast; cos and sin are scaled by
  the attention factor (given, or 0.1·mscale·ln(factor) + 1, or the mscale/mscale_all_dim ratio).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class RopeError(ValueError):
    """rope parameters this implementation does not compute; the message names the field."""


# Fields each rope_type reads (besides rope_type / type, rope_theta, partial_rotary_factor).
ROPE_TYPE_FIELDS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor", "original_max_position_embeddings"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                       "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
}
COMMON_FIELDS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
REQUIRED_FIELDS = {"linear": ("factor",), "dynamic": ("factor",),
                   "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


@dataclass(frozen=True)
class RopeSpec:
    rope_type: str = "default"
    theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    @classmethod
    def from_parameters(cls, params: dict, *, max_position_embeddings: int,
                        where: str = "rope_parameters") -> "RopeSpec":
        """`params`: one flat dict (rope_theta and the scaling fields together). Refuses a rope type
        or a field it does not compute, naming it."""
        rope_type = params.get("rope_type", params.get("type")) or "default"
        if rope_type not in ROPE_TYPE_FIELDS:
            raise RopeError(f"{where}.rope_type {rope_type!r} is not supported (supported: "
                            f"{', '.join(ROPE_TYPE_FIELDS)})")
        allowed = COMMON_FIELDS | ROPE_TYPE_FIELDS[rope_type]
        unknown = sorted(k for k, v in params.items() if k not in allowed and v is not None)
        if unknown:
            raise RopeError(f"{where}: field {unknown[0]!r} is not supported for rope_type "
                            f"{rope_type!r} (it would change the math; fields understood: "
                            f"{', '.join(sorted(allowed))})")
        missing = [k for k in REQUIRED_FIELDS.get(rope_type, ()) if params.get(k) is None]
        if missing:
            raise RopeError(f"{where}: rope_type {rope_type!r} needs {missing[0]!r}")
        if rope_type == "yarn" and params.get("factor") is None and \
                params.get("original_max_position_embeddings") is None:
            raise RopeError(f"{where}: rope_type 'yarn' needs 'factor' or "
                            f"'original_max_position_embeddings'")
        theta = params.get("rope_theta")
        opt = lambda k: None if params.get(k) is None else float(params[k])  # noqa: E731
        original = params.get("original_max_position_embeddings")
        if original is None and rope_type in ("llama3", "yarn"):
            original = max_position_embeddings           # transformers' default for these types
        spec = cls(rope_type=rope_type, theta=10000.0 if theta is None else float(theta),
                   partial_rotary_factor=float(params.get("partial_rotary_factor") or 1.0),
                   factor=opt("factor"),
                   original_max_position_embeddings=None if original is None else int(original),
                   low_freq_factor=opt("low_freq_factor"), high_freq_factor=opt("high_freq_factor"),
                   attention_factor=opt("attention_factor"), beta_fast=opt("beta_fast"),
                   beta_slow=opt("beta_slow"), mscale=opt("mscale"), mscale_all_dim=opt("mscale_all_dim"),
                   truncate=bool(params.get("truncate", True)))
        if not 0.0 < spec.partial_rotary_factor <= 1.0:
            raise RopeError(f"{where}.partial_rotary_factor must be in (0, 1], got "
                            f"{spec.partial_rotary_factor}")
        if spec.factor is not None and spec.factor <= 0:
            raise RopeError(f"{where}.factor must be > 0, got {spec.factor}")
        if rope_type == "llama3" and spec.low_freq_factor >= spec.high_freq_factor:
            raise RopeError(f"{where}: llama3 needs low_freq_factor < high_freq_factor")
        return spec

    def to_parameters(self) -> dict:
        """The transformers 5 `rope_parameters` dict (fields that are set only)."""
        d = {"rope_type": self.rope_type, "rope_theta": self.theta}
        if self.partial_rotary_factor != 1.0:
            d["partial_rotary_factor"] = self.partial_rotary_factor
        for name in ROPE_TYPE_FIELDS[self.rope_type]:
            value = getattr(self, name)
            if value is not None and not (name == "truncate" and value is True):
                d[name] = value
        return d

    # ---- the math ---------------------------------------------------------------------------
    def rotary_dim(self, head_dim: int) -> int:
        return int(head_dim * self.partial_rotary_factor)

    def base_inv_freq(self, dim: int, theta: float | None = None) -> np.ndarray:
        theta = self.theta if theta is None else theta
        return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))

    def inv_freq(self, dim: int, max_position_embeddings: int) -> tuple[np.ndarray, float]:
        """The static frequencies [dim/2] and the cos/sin scaling (dynamic: the default ones)."""
        t = self.rope_type
        inv = self.base_inv_freq(dim)
        if t == "linear":
            return inv / self.factor, 1.0
        if t == "llama3":
            return self._llama3(inv), 1.0
        if t == "yarn":
            return self._yarn(dim, max_position_embeddings)
        return inv, 1.0

    def dynamic_inv_freq(self, dim: int, seq_len: int, max_position_embeddings: int) -> np.ndarray:
        seq_len = max(seq_len, max_position_embeddings)
        ratio = self.factor * seq_len / max_position_embeddings - (self.factor - 1)
        return self.base_inv_freq(dim, self.theta * ratio ** (dim / (dim - 2)))

    def _llama3(self, inv: np.ndarray) -> np.ndarray:
        old = self.original_max_position_embeddings
        low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, blended, scaled)

    def _yarn(self, dim: int, max_position_embeddings: int) -> tuple[np.ndarray, float]:
        original = self.original_max_position_embeddings
        factor = self.factor if self.factor is not None else max_position_embeddings / original

        def mscale_of(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = self.attention_factor
        if attention is None:
            if self.mscale and self.mscale_all_dim:
                attention = mscale_of(factor, self.mscale) / mscale_of(factor, self.mscale_all_dim)
            else:
                attention = mscale_of(factor)
        beta_fast, beta_slow = self.beta_fast or 32.0, self.beta_slow or 1.0

        def correction_dim(rotations: float) -> float:
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        extrapolate = 1.0 - ramp                                  # 1: keep the original frequency
        base = self.base_inv_freq(dim)
        return base / factor * (1 - extrapolate) + base * extrapolate, float(attention)


class RotaryEmbedding:
    """cos/sin tables for positions [0, max_positions) and their application to q or k."""

    def __init__(self, spec: RopeSpec, head_dim: int, max_positions: int, max_position_embeddings: int):
        self.spec = spec
        self.rotary_dim = spec.rotary_dim(head_dim)
        dim = self.rotary_dim
        positions = np.arange(max_positions, dtype=np.float64)
        if spec.rope_type == "dynamic":
            inv, scale = self._dynamic_table(dim, max_positions, max_position_embeddings), 1.0
            angles = positions[:, None] * inv                    # [max_pos, dim/2], per position
        else:
            inv, scale = spec.inv_freq(dim, max_position_embeddings)
            angles = np.outer(positions, inv)
        self.cos = (np.cos(angles) * scale).astype(np.float32)
        self.sin = (np.sin(angles) * scale).astype(np.float32)

    def _dynamic_table(self, dim: int, max_positions: int, max_position_embeddings: int) -> np.ndarray:
        base = self.spec.base_inv_freq(dim)
        table = np.broadcast_to(base, (max_positions, dim // 2)).copy()
        for p in range(max_position_embeddings, max_positions):
            table[p] = self.spec.dynamic_inv_freq(dim, p + 1, max_position_embeddings)
        return table

    def __call__(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: [num_tokens, n_heads, head_dim]; positions: [num_tokens]."""
        dim = self.rotary_dim
        half = dim // 2
        cos = self.cos[positions][:, None, :]  # [num_tokens, 1, dim/2]
        sin = self.sin[positions][:, None, :]
        x1, x2 = x[..., :half], x[..., half:dim]
        parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
        if dim < x.shape[-1]:
            parts.append(x[..., dim:])
        return np.concatenate(parts, axis=-1)
