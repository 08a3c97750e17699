"""How long one engine step takes on the emulated card: each operator priced by how its kernels
behave on that device (`specs.KernelParams`), summed, plus a per-step host overhead.

A step is one forward pass over N tokens: the prefill chunks' new tokens plus one token per
decode sequence, so a mixed batch shares its GEMMs (weights are read once for all N tokens) and
adds its prefill and decode attention operators side by side.

Per layer, on one device (hq, hkv = heads per device, e = head_dim, b = dtype bytes, I = MLP
columns per device):
  qkv_proj, o_proj, mlp_gate_up, mlp_down   GEMMs: F = 2 N W, B = b (W + N (d_in + d_out));
                     tau + (t_c^k + t_m^k)^(1/k), t_c = F' / (eta_c peak), t_m = B / (eta_m BW),
                     F' = 2 ceil(N / T) T W: whole tiles of T token rows (tile quantization)
  attention_prefill  per chunk (c new, p cached): F = 4 hq e c (p + c/2) at its own eta (FlashAttention
                     reaches a small fraction of peak at these lengths), B = b (2 hq e c + 2 hkv e (p + c));
                     plus a fixed cost per layer
  attention_decode   per sequence (context k): B = 2 b hkv e k at the KV-streaming eta, F = 4 hq e k;
                     plus a fixed cost per layer (dominant at batch 1)
  elementwise        unfused (vLLM): 5 kernels (RMSNorm, RoPE, RMSNorm, SiLU*mul, residual add),
                     B = b N (2h + 2 (hq + hkv) e + 2h + 3I + 3h); fused (MindIE/ATB): 3 kernels
                     (AddRmsNorm x2, SwiGLU), B = b N (4h + 4h + 3I)
  kv_cache_write     B = 2 * N * 2 hkv e b                       (read new K/V, scatter to pool)
On sliding-window layers (Mistral, Phi-3, Qwen2/3) a query reads at most `w` keys: the prefill
pairs are the integral of min(position, w) over the chunk, the K/V read min(p + c, w + c), a
decode min(k, w).
  all_reduce         2 per layer when tp > 1: latency + 2 (tp-1)/tp N hidden b over the link
Once per step: embedding lookup (B = 2 N hidden b), the LM head on the sampled rows (one per
sequence or chunk; a GEMM) and `host` (scheduling and launch on the host).

`OperatorTime.seconds()` is roofline(compute_s, memory_s) + fixed_s: the smooth roofline is a
k-norm, so for any split of the work over steps the sum of the parts' rooflines is at least the
roofline of the whole (Minkowski) — what benchmarks/bounds.py relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mindmotor.device.profiles import ModelProfile
from mindmotor.device.specs import DeviceSpec, KernelParams

# Assumed link defaults for KV transfer: setup latency (s) and achievable fraction of the link.
LINK_ALPHA_S = {"intra_node": 20e-6, "inter_node": 50e-6}
LINK_ETA = 0.7
# Host link (PCIe) copies of the KV host tier: latency per DMA (one chunk) and achievable fraction.
HOST_LINK_ALPHA_S = 10e-6
HOST_LINK_ETA = 0.8


@dataclass(frozen=True)
class LoraStepShape:
    """A step's LoRA work (Punica's BGMV): `rows` tokens with an adapter, `adapters` distinct ones,
    the largest `rank` (smaller ones are padded to it), the union of their target modules."""
    rows: int
    adapters: int
    rank: int
    targets: tuple[str, ...]


@dataclass
class StepShape:
    prefills: list[tuple[int, int]] = field(default_factory=list)  # (new tokens c, cached p)
    decodes: list[int] = field(default_factory=list)               # context k incl. the new token
    lora: LoraStepShape | None = None                              # rows with a LoRA adapter

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


def roofline(compute_s: float, memory_s: float, k: float | None) -> float:
    """max(compute, memory) rounded near the ridge point by a k-norm (None: the sharp max)."""
    if k is None or compute_s == 0.0 or memory_s == 0.0:
        return max(compute_s, memory_s)
    big = max(compute_s, memory_s)
    return big * ((compute_s / big) ** k + (memory_s / big) ** k) ** (1.0 / k)


@dataclass(slots=True)              # not frozen: construction is on every step's hot path
class OperatorTime:
    """One operator of one step: its time at the achievable compute rate and at the achievable
    memory (or link) rate, combined by `roofline` with smoothness `k`, plus `fixed_s` (kernel
    launches, per-layer fixed costs, collective latency, host overhead) for its `kernels`."""
    compute_s: float
    memory_s: float
    kernels: int
    flops: float = 0.0
    bytes: float = 0.0
    fixed_s: float = 0.0
    k: float | None = None
    # A compute time that no split of this operator's work over several steps goes below in sum
    # (None: compute_s itself). It differs when a GEMM runs on the fastest of several tile
    # kernels: a step of 257 rows can cost more than steps of 256 and 1 (benchmarks/bounds.py).
    compute_floor_s: float | None = None

    def roofline(self, compute_s: float, memory_s: float) -> float:
        return roofline(compute_s, memory_s, self.k)

    def seconds(self, kernel_overhead_s: float | None = None) -> float:
        """The operator's time. (`kernel_overhead_s` is accepted for older callers and ignored:
        every operator carries its own fixed cost.)"""
        return roofline(self.compute_s, self.memory_s, self.k) + self.fixed_s


def _windowed_pairs(c: int, p: int, w: int) -> float:
    """Query-key pairs of a c-token chunk after p cached ones under a window w: the integral of
    min(x, w) over [p, p + c] (c (p + c/2) when the window never binds)."""
    end = p + c
    if end <= w:
        return c * (p + c / 2)
    if p >= w:
        return c * w
    return (w * w - p * p) / 2 + (end - w) * w


@dataclass(frozen=True)
class _Gemm:
    name: str
    weights: int                    # elements per device per layer
    io_per_token: int               # input + output activation elements per token


OPERATOR_NAMES = ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down", "attention_decode",
                  "attention_prefill", "elementwise", "kv_cache_write", "embedding", "lm_head",
                  "all_reduce", "host")


class CostModel:
    """Prices steps of `profile` on `spec`. `kernels` (default: the spec's) holds the per-class
    parameters; the keyword overrides replace single ones (eta_compute / eta_memory / 
    kernel_overhead_s: the GEMMs'; fused_elementwise; host_overhead_s; eta_link)."""

    def __init__(self, spec: DeviceSpec, profile: ModelProfile, eta_compute: float | None = None,
                 eta_memory: float | None = None, kernel_overhead_s: float | None = None,
                 dtype: str = "bf16", eta_link: float | None = None,
                 kernels: KernelParams | None = None, fused_elementwise: bool | None = None,
                 host_overhead_s: float | None = None) -> None:
        if dtype not in spec.peak_flops:
            raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(spec.peak_flops)}")
        kp = kernels or spec.kernels
        overrides = {name: value for name, value in (
            ("gemm_eta_compute", eta_compute), ("gemm_eta_memory", eta_memory),
            ("gemm_tau_s", kernel_overhead_s), ("link_eta", eta_link),
            ("fused_elementwise", fused_elementwise), ("host_overhead_s", host_overhead_s))
            if value is not None}
        kp = replace(kp, **overrides)
        for name in ("gemm_eta_compute", "gemm_eta_memory", "attention_decode_eta_memory",
                     "attention_prefill_eta_compute", "elementwise_eta_memory", "link_eta"):
            if not 0.0 < getattr(kp, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(kp, name)}")
        self.spec, self.profile, self.kernels = spec, profile, kp
        self.eta_compute, self.eta_memory, self.eta_link = (kp.gemm_eta_compute, kp.gemm_eta_memory,
                                                            kp.link_eta)
        self.kernel_overhead_s = kp.gemm_tau_s
        self.dtype = dtype

        peak, bw = spec.peak_flops[dtype], spec.hbm_bandwidth
        self._s_per_flop = 1.0 / (kp.gemm_eta_compute * peak)
        # The GEMM library's kernels: (tile height, seconds per FLOP); a GEMM runs on the fastest.
        self._gemm_kernels = ((kp.gemm_tile_m, self._s_per_flop),) + tuple(
            (tile, 1.0 / (eta * peak)) for tile, eta in kp.gemm_extra_tiles)
        self._s_per_byte = 1.0 / (kp.gemm_eta_memory * bw)
        self._s_per_kv_byte = 1.0 / (kp.attention_decode_eta_memory * bw)
        self._s_per_attn_flop = 1.0 / (kp.attention_prefill_eta_compute * peak)
        self._s_per_ew_byte = 1.0 / (kp.elementwise_eta_memory * bw)

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
        if kp.fused_elementwise:
            self._ew_kernels, self._ew_elems_per_token = 3, 4 * h + 4 * h + 3 * inter
        else:
            self._ew_kernels = 5
            self._ew_elems_per_token = 2 * h + 2 * (hq + hkv) * e + 2 * h + 3 * inter + 3 * h
        self._attn_flops_per_qk = 4 * hq * e          # x c (p + c/2), or x k for decode
        self._q_o_bytes_per_token = 2 * hq * e * b
        self._kv_bytes_per_token_layer = 2 * hkv * e * b
        self._lm_head_weights = p.vocab_per_device * h
        self._vocab_per_device = p.vocab_per_device
        # Ring all-reduce moves 2 (tp-1)/tp of the buffer through each device's link.
        self._tp = p.tp
        self._allreduce_bytes_per_token = 2 * (p.tp - 1) / p.tp * h * b
        self._s_per_link_byte = 1.0 / (kp.link_eta * spec.intra_node_bandwidth)

    def step(self, shape: StepShape) -> StepCost:
        ops = self.operators(shape)
        compute_s = sum(op.compute_s for op in ops.values() if op.compute_s > op.memory_s)
        memory_s = sum(op.memory_s for op in ops.values() if op.compute_s <= op.memory_s)
        breakdown = {name: op.seconds() for name, op in ops.items()}
        return StepCost(seconds=sum(breakdown.values()),
                        flops=sum(op.flops for op in ops.values()),
                        bytes=sum(op.bytes for op in ops.values()),
                        num_kernels=sum(op.kernels for op in ops.values()),
                        breakdown=breakdown, compute_bound=compute_s > memory_s)

    def operators(self, shape: StepShape) -> dict[str, OperatorTime]:
        """Each operator's compute and memory time for one step (the step costs, per operator,
        `OperatorTime.seconds()`). Empty for an empty step."""
        chunks, contexts = shape.prefills, shape.decodes
        n_prefill = sum(c for c, _ in chunks)
        n = n_prefill + len(contexts)                      # tokens in the forward pass
        if n == 0:
            return {}
        kp = self.kernels
        sampled = len(chunks) + len(contexts)              # LM-head rows
        L, b = self._layers, self._b
        tau, k = kp.gemm_tau_s, kp.roofline_k
        ops: dict[str, OperatorTime] = {}

        def gemm(name: str, rows: int, weights: float, by: float, count: int) -> None:
            """`rows` tokens through `weights` elements; the compute is priced on whole tiles."""
            compute_s = min(2.0 * (-(-rows // tile)) * tile * weights * s_per_flop
                            for tile, s_per_flop in self._gemm_kernels)
            floor = None
            if len(self._gemm_kernels) > 1:                # no tile wasted, at the best kernel's rate
                floor = 2.0 * rows * weights * min(s for _, s in self._gemm_kernels)
            ops[name] = OperatorTime(compute_s=compute_s, compute_floor_s=floor,
                                     memory_s=by * self._s_per_byte, kernels=count,
                                     flops=2.0 * rows * weights, bytes=by, fixed_s=count * tau, k=k)

        def stream(name: str, f: float, by: float, count: int, s_per_byte: float,
                   s_per_flop: float, fixed_s: float) -> None:
            ops[name] = OperatorTime(compute_s=f * s_per_flop, memory_s=by * s_per_byte,
                                     kernels=count, flops=f, bytes=by, fixed_s=fixed_s)

        for g in self._gemms:
            gemm(g.name, n, g.weights * L, b * (g.weights + n * g.io_per_token) * L, L)
        w, L_sw = self.profile.sliding_window, self.profile.num_sliding_layers
        L_full = L - L_sw                                  # layers without a sliding window
        if contexts:
            k_total = L_full * sum(contexts) + (L_sw * sum(min(c, w) for c in contexts) if L_sw else 0)
            stream("attention_decode", self._attn_flops_per_qk * k_total,
                   self._kv_bytes_per_token_layer * k_total, L, self._s_per_kv_byte,
                   self._s_per_flop, L * kp.attention_fixed_s)
        if chunks:
            qk = L_full * sum(c * (p + c / 2) for c, p in chunks)
            kv_tokens = L_full * sum(c + p for c, p in chunks)
            if L_sw:
                qk += L_sw * sum(_windowed_pairs(c, p, w) for c, p in chunks)
                kv_tokens += L_sw * sum(min(c + p, w + c) for c, p in chunks)
            stream("attention_prefill", self._attn_flops_per_qk * qk,
                   self._q_o_bytes_per_token * n_prefill * L
                   + self._kv_bytes_per_token_layer * kv_tokens, L, self._s_per_kv_byte,
                   self._s_per_attn_flop, L * kp.attention_fixed_s)
        stream("elementwise", 0.0, b * n * self._ew_elems_per_token * L, self._ew_kernels * L,
               self._s_per_ew_byte, 0.0, self._ew_kernels * L * kp.elementwise_tau_s)
        stream("kv_cache_write", 0.0, 2.0 * self._kv_bytes_per_token_layer * n * L, L,
               self._s_per_byte, 0.0, L * tau)
        stream("embedding", 0.0, 2.0 * n * self._hidden * b, 1, self._s_per_byte, 0.0, tau)
        gemm("lm_head", sampled, self._lm_head_weights,
             b * (self._lm_head_weights + sampled * (self._hidden + self._vocab_per_device)), 1)
        if shape.lora is not None and shape.lora.rows:
            ops["lora"] = self._lora_operator(shape.lora)
        if self._tp > 1:       # timed on the link, not HBM traffic: counted as memory time, 0 bytes
            link_s = 2 * L * self._allreduce_bytes_per_token * n * self._s_per_link_byte
            ops["all_reduce"] = OperatorTime(compute_s=0.0, memory_s=link_s, kernels=2 * L,
                                             fixed_s=2 * L * kp.collective_latency_s)
        if kp.host_overhead_s > 0:
            ops["host"] = OperatorTime(compute_s=0.0, memory_s=0.0, kernels=0,
                                       fixed_s=kp.host_overhead_s)
        return ops

    def lora_dims(self) -> dict[str, tuple[int, int, str]]:
        """(in, out, fused projection) per device of each LoRA target module of the profile."""
        p = self.profile
        h, e = p.hidden_size, p.head_dim
        q, kv, inter = p.heads_per_device * e, p.kv_heads_per_device * e, p.intermediate_per_device
        return {"q_proj": (h, q, "qkv"), "k_proj": (h, kv, "qkv"), "v_proj": (h, kv, "qkv"),
                "qkv_proj": (h, q + 2 * kv, "qkv"), "o_proj": (q, h, "o"), "gate_proj": (h, inter, "gate_up"),
                "up_proj": (h, inter, "gate_up"), "gate_up_proj": (h, 2 * inter, "gate_up"),
                "down_proj": (inter, h, "down")}

    def lora_adapter_bytes(self, rank: int, targets) -> int:
        """Device bytes of one adapter of `rank` on `targets` (A and B of every layer)."""
        dims = self.lora_dims()
        return int(self._layers * self._b * rank * sum(dims[t][0] + dims[t][1] for t in targets))

    def _lora_operator(self, lora: LoraStepShape) -> OperatorTime:
        """Shrink (x·A) and expand (·B) per adapted fused projection and layer, each one kernel over
        the whole mixed batch (each row gathers its adapter's A and B): FLOPs of the rows at the
        padded rank, bytes of each distinct adapter's A and B read once plus the activations."""
        dims = self.lora_dims()
        kp, L, b, r = self.kernels, self._layers, self._b, lora.rank
        io = sum(dims[t][0] + dims[t][1] for t in lora.targets)
        flops = 2.0 * lora.rows * r * io * L
        nbytes = b * L * (lora.adapters * r * io + lora.rows * (io + 2 * r * len(lora.targets)))
        kernels = 2 * L * len({dims[t][2] for t in lora.targets})
        return OperatorTime(compute_s=flops * self._s_per_flop, memory_s=nbytes * self._s_per_byte,
                            kernels=kernels, flops=flops, bytes=nbytes, fixed_s=kernels * kp.gemm_tau_s,
                            k=kp.roofline_k)

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

    def host_copy_seconds(self, nbytes: float, num_dmas: int = 1) -> float:
        """Card <-> host memory over the host link (PCIe), one direction: `num_dmas` copies'
        latency + bytes / (eta * host link bandwidth). The KV host tier's copies and LoRA slot loads are
        priced with it."""
        return num_dmas * HOST_LINK_ALPHA_S + nbytes / (HOST_LINK_ETA * self.spec.host_link_bandwidth)
