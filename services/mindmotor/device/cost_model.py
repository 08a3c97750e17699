"""How long one engine step takes on the emulated card: a roofline per operator, summed.

Every operator gets max(F / (eta_c * peak), B / (eta_m * HBM_BW)); every launched kernel adds
tau. A step is one forward pass over N tokens: the prefill chunks' new tokens plus one token
per decode sequence, so a mixed batch shares its GEMMs (weights are read once for all N
tokens) and adds its prefill and decode attention operators side by side.

Per layer, on one device (hq, hkv = heads per device, e = head_dim, b = dtype bytes):
  qkv_proj, o_proj, mlp_gate_up, mlp_down   GEMMs: F = 2 N W, B = b (W + N (d_in + d_out))
  attention_prefill  per chunk (c new, p cached): F = 4 hq e c (p + c/2),
                     B = b (2 hq e c + 2 hkv e (p + c))          (Q in, O out, K/V read)
  attention_decode   per sequence (context k):   F = 4 hq e k,  B = 2 b hkv e k
  kv_cache_write     B = 2 * N * 2 hkv e b                       (read new K/V, scatter to pool)
  all_reduce         2 per layer when tp > 1: 2 (tp-1)/tp N hidden b over the intra-node link
Once per step: embedding lookup (B = 2 N hidden b) and the LM head on the sampled rows (one
per sequence or chunk). RMSNorm, RoPE, SiLU*mul and residual adds are taken as fused into
the neighbouring kernels.

Defaults are msmodeling's 910B values: eta_c = 0.7, eta_m = 0.6, tau = 5 us per kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mindmotor.device.profiles import ModelProfile
from mindmotor.device.specs import DeviceSpec

# Assumed link defaults for KV transfer: setup latency (s) and achievable fraction of the link.
LINK_ALPHA_S = {"intra_node": 20e-6, "inter_node": 50e-6}
LINK_ETA = 0.7


@dataclass
class StepShape:
    prefills: list[tuple[int, int]] = field(default_factory=list)  # (new tokens c, cached p)
    decodes: list[int] = field(default_factory=list)               # context k incl. the new token

    @property
    def num_tokens(self) -> int:
        return sum(c for c, _ in self.prefills) + len(self.decodes)


@dataclass
class StepCost:
    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0              # HBM traffic (collectives are timed, not counted here)
    num_kernels: int = 0
    breakdown: dict[str, float] = field(default_factory=dict)     # operator -> seconds
    compute_bound: bool = False


@dataclass(frozen=True)
class OperatorTime:
    """One operator of one step: its time at the achievable compute rate and at the achievable
    memory (or link) rate; it takes the larger, plus `kernels` launches."""
    compute_s: float
    memory_s: float
    kernels: int
    flops: float = 0.0
    bytes: float = 0.0

    def seconds(self, kernel_overhead_s: float) -> float:
        return max(self.compute_s, self.memory_s) + self.kernels * kernel_overhead_s


@dataclass(frozen=True)
class _Gemm:
    name: str
    weights: int                    # elements per device per layer
    io_per_token: int               # input + output activation elements per token


class CostModel:
    def __init__(self, spec: DeviceSpec, profile: ModelProfile, eta_compute: float = 0.7,
                 eta_memory: float = 0.6, kernel_overhead_s: float = 5e-6, dtype: str = "bf16",
                 eta_link: float = LINK_ETA) -> None:
        if dtype not in spec.peak_flops:
            raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(spec.peak_flops)}")
        self.spec, self.profile = spec, profile
        self.eta_compute, self.eta_memory, self.eta_link = eta_compute, eta_memory, eta_link
        self.kernel_overhead_s = kernel_overhead_s
        self.dtype = dtype

        # Seconds per FLOP and per HBM byte at the achievable fraction of peak.
        self._s_per_flop = 1.0 / (eta_compute * spec.peak_flops[dtype])
        self._s_per_byte = 1.0 / (eta_memory * spec.hbm_bandwidth)

        p = profile
        h, e, b = p.hidden_size, p.head_dim, p.dtype_bytes
        hq, hkv, inter = p.heads_per_device, p.kv_heads_per_device, p.intermediate_per_device
        self._layers = p.num_layers
        self._hidden, self._b = h, b
        self._gemms = (
            _Gemm("qkv_proj", h * (hq + 2 * hkv) * e, h + (hq + 2 * hkv) * e),
            _Gemm("o_proj", hq * e * h, hq * e + h),
            _Gemm("mlp_gate_up", h * 2 * inter, h + 2 * inter),
            _Gemm("mlp_down", inter * h, inter + h),
        )
        self._attn_flops_per_qk = 4 * hq * e          # x c (p + c/2), or x k for decode
        self._q_o_bytes_per_token = 2 * hq * e * b
        self._kv_bytes_per_token_layer = 2 * hkv * e * b
        self._lm_head_weights = p.vocab_per_device * h
        self._vocab_per_device = p.vocab_per_device
        # Ring all-reduce moves 2 (tp-1)/tp of the buffer through each device's link.
        self._tp = p.tp
        self._allreduce_bytes_per_token = 2 * (p.tp - 1) / p.tp * h * b
        self._s_per_link_byte = 1.0 / (eta_link * spec.intra_node_bandwidth)

    def step(self, shape: StepShape) -> StepCost:
        ops = self.operators(shape)
        compute_s = sum(op.compute_s for op in ops.values() if op.compute_s > op.memory_s)
        memory_s = sum(op.memory_s for op in ops.values() if op.compute_s <= op.memory_s)
        kernels = sum(op.kernels for op in ops.values())
        return StepCost(seconds=compute_s + memory_s + kernels * self.kernel_overhead_s,
                        flops=sum(op.flops for op in ops.values()),
                        bytes=sum(op.bytes for op in ops.values()), num_kernels=kernels,
                        breakdown={name: op.seconds(self.kernel_overhead_s) for name, op in ops.items()},
                        compute_bound=compute_s > memory_s)

    def operators(self, shape: StepShape) -> dict[str, OperatorTime]:
        """Each operator's compute and memory time for one step (the step costs, per operator,
        the larger of the two plus its kernels). Empty for an empty step."""
        chunks, contexts = shape.prefills, shape.decodes
        n_prefill = sum(c for c, _ in chunks)
        n = n_prefill + len(contexts)                      # tokens in the forward pass
        if n == 0:
            return {}
        sampled = len(chunks) + len(contexts)              # LM-head rows
        L, b, s_flop, s_byte = self._layers, self._b, self._s_per_flop, self._s_per_byte
        ops: dict[str, OperatorTime] = {}

        def add(name: str, f: float, by: float, count: int) -> None:
            ops[name] = OperatorTime(compute_s=f * s_flop, memory_s=by * s_byte, kernels=count,
                                     flops=f, bytes=by)

        add("embedding", 0.0, 2.0 * n * self._hidden * b, 1)
        for g in self._gemms:
            add(g.name, 2.0 * n * g.weights * L, b * (g.weights + n * g.io_per_token) * L, L)
        if chunks:
            qk = sum(c * (p + c / 2) for c, p in chunks)
            kv_tokens = sum(c + p for c, p in chunks)
            add("attention_prefill", self._attn_flops_per_qk * qk * L,
                (self._q_o_bytes_per_token * n_prefill
                 + self._kv_bytes_per_token_layer * kv_tokens) * L, L)
        if contexts:
            k_total = sum(contexts)
            add("attention_decode", self._attn_flops_per_qk * k_total * L,
                self._kv_bytes_per_token_layer * k_total * L, L)
        add("kv_cache_write", 0.0, 2.0 * self._kv_bytes_per_token_layer * n * L, L)
        add("lm_head", 2.0 * sampled * self._lm_head_weights,
            b * (self._lm_head_weights + sampled * (self._hidden + self._vocab_per_device)), 1)
        if self._tp > 1:       # timed on the link, not HBM traffic: counted as memory time, 0 bytes
            link_s = 2 * L * self._allreduce_bytes_per_token * n * self._s_per_link_byte
            ops["all_reduce"] = OperatorTime(compute_s=0.0, memory_s=link_s, kernels=2 * L)
        return ops

    def kv_transfer_seconds(self, num_tokens: int, link: str = "intra_node",
                            alpha_s: float | None = None, eta: float = LINK_ETA) -> float:
        """alpha + bytes / (eta * link bandwidth), bytes = num_tokens * 2 L hkv e b."""
        if link == "intra_node":
            bandwidth = self.spec.intra_node_bandwidth
        elif link == "inter_node":
            bandwidth = self.spec.inter_node_bandwidth
        else:
            raise ValueError(f"unknown link {link!r}; valid: intra_node, inter_node")
        alpha = LINK_ALPHA_S[link] if alpha_s is None else alpha_s
        nbytes = num_tokens * self.profile.kv_bytes_per_token
        return alpha + nbytes / (eta * bandwidth)
