"""Accelerator data sheets: the numbers an emulated device is built from.

Units: FLOP/s, bytes, bytes/s (per direction for links), watts. `GB` is 1e9 bytes (vendors'
bandwidth unit), `GiB` is 2**30 bytes (HBM capacity as the card reports it).

Sources:
- Ascend 910B2/B3/B4: Huawei `Ascend/msmodeling` hardware table (`HWConf`: cube FP16 TFLOPS,
  HBM size and bandwidth, HCCS bandwidth) and the MindIE Motor machine configs (25 GB/s between
  nodes). 910B3's FP16 313 TFLOPS and INT8 626 TOPS are the Atlas 800I A2 product-sheet figures.
- Ascend AI-core counts and clocks: the cube unit does 16x16x16 MACs = 8192 FLOP per cycle, so
  peak = cores x clock x 8192 (910B3: 20 x 1.8 GHz x 8192 = 294.9 TFLOPS, which matches the table).
- Ascend FP32 is not published per SKU; we use 1/4 of the BF16 cube rate (HF32 path) as an estimate.
- Ascend TDP/idle power: typical `npu-smi info` readings and Atlas module sheets; approximate.
- NVIDIA A100 SXM 80GB and H100 SXM: NVIDIA data sheets (dense, i.e. without sparsity).
- 910B2: msmodeling's `HWConf` row (24 cube cores x 1.8 GHz x 8192 = 353.9 TFLOPS FP16, 64 GB at
  1.6 TB/s, 196 GB/s HCCS). 910B1 is in no msmodeling version: its figures stay an estimate.
- Atlas 800I A2 64 GB ("910B4-64G"): the 910B4 die of the Atlas 800I A2 inference server in its
  64 GB HBM variant (the card MindIE's published Qwen2-7B TP4 sample ran on). Huawei publishes the
  capacity, not a separate bandwidth: we keep 910B4's compute and 0.8 TB/s (an estimate).

Kernel behaviour (`KernelParams`, one set per device, what the cost model prices with):
- A100-80G / H100-SXM: fitted on Vidur's measured Llama-2-7B profiles (microsoft/vidur, MIT;
  `services/mindmotor/assets/data/vidur/`): GEMM and elementwise parameters on every mlp.csv row (TP 1-8), decode
  and prefill attention on the three A100 attention medians named in calibration.json
  (`benchmarks/fidelity.py --fit` re-derives them, the GEMM kernels included: the library's
  kernels of 64, 128 and 256 token rows per tile — CUTLASS's and cuBLAS's fp16 CTA tile heights —
  each with its fitted efficiency, a GEMM running on the fastest; the measured GEMM times step at
  multiples of the tiles and fall where a bigger tile fits whole, e.g. H100 at 512 tokens; a
  kernel the fit never picks is left out). H100 attention is not measured in that data:
  it takes the A100 fractions (an assumption, marked in the table).
- Ascend: no measured kernel profile is public. GEMMs keep msmodeling's efficiency figures
  (0.7 of cube peak, 0.6 of HBM bandwidth); attention takes the A100-measured fractions;
  elementwise kernels are fused as MindIE's ATB operators do (AddRmsNorm twice and SwiGLU per
  layer, RoPE inside the attention operator); no tile quantization (gemm_tile_m 1). These are
  assumptions until an Ascend profile exists.
- Host overhead per step (scheduling, input preparation, launch of the step graph): 1 ms, an
  estimate for vLLM with CUDA graphs and for MindIE; Vidur's step composition excludes it, so the
  fidelity table does too. Collective latency: 10 us per call on NVLink, 20 us on HCCS (the KV
  transfer alpha already used here), estimates.
- Host link (`host_link_bandwidth`, card <-> host memory, what the KV host tier's copies cross):
  the nominal per-direction PCIe rate of the card's slot — PCIe 5.0 x16 (64 GB/s) for the
  Atlas 800I A2's 910B parts and H100 SXM, PCIe 4.0 x16 (32 GB/s) for A100 SXM4. The copy
  pricing (`CostModel.host_copy_seconds`) takes 80 % of it and 10 us per DMA (estimates).
- MindIE's KV-pool rule (`hbm_runtime_reserved_bytes`): MindIE sizes the KV pool as
  NPU_MEMORY_FRACTION x HBM minus the HBM already in use when the server starts (the runtime's own
  reservation, then weights and workspace); an idle Ascend card reports ~3 GB in use under
  `npu-smi info` (estimate), an idle NVIDIA card ~0.5 GB (CUDA context).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

GB = 1e9
GiB = 2**30
TFLOPS = 1e12

DTYPES = ("bf16", "fp16", "int8", "fp32")


@dataclass(frozen=True)
class KernelParams:
    """How kernels behave on one device, per operator class; every field is a physical quantity.

    GEMM time = tau + (t_c^k + t_m^k)^(1/k) with t_c = F / (eta_c peak), t_m = B / (eta_m HBM BW):
    a roofline rounded near the ridge point (k -> infinity is the sharp max). F counts whole tiles
    of `gemm_tile_m` token rows (tile quantization: a tensor-core kernel computes its last tile in
    full, so N tokens cost as ceil(N / T) T); with `gemm_extra_tiles` the library has more kernels,
    (tile rows, eta_c) each, and a GEMM's t_c is the smallest over all of them."""
    gemm_tau_s: float                      # launch and tail of one GEMM
    gemm_eta_compute: float                # achievable fraction of peak FLOP/s in a large GEMM
    gemm_eta_memory: float                 # achievable fraction of HBM bandwidth streaming weights
    roofline_k: float                      # smoothness of the roofline near the ridge point
    attention_fixed_s: float               # per layer per step, decode or prefill attention kernel
    attention_decode_eta_memory: float     # KV streaming in decode attention
    attention_prefill_eta_compute: float   # FlashAttention-style prefill, fraction of peak (causal FLOPs)
    elementwise_tau_s: float               # one elementwise kernel's launch
    elementwise_eta_memory: float          # its achievable fraction of HBM bandwidth
    fused_elementwise: bool                # MindIE/ATB fused operators vs vLLM's five per layer
    collective_latency_s: float            # per all-reduce call
    link_eta: float                        # achievable fraction of the intra-node link
    host_overhead_s: float                 # per step: scheduling, input prep, graph launch
    gemm_tile_m: int = 1                   # token rows per GEMM tile (1: no tile quantization)
    gemm_extra_tiles: tuple[tuple[int, float], ...] = ()   # other kernels: (tile rows, eta_compute)
    source: str = field(default="", compare=False)


# Fitted on Vidur's A100 Llama-2-7B profile (mlp.csv rows; calibration.json attention points).
A100_KERNELS = KernelParams(
    gemm_tau_s=7e-6, gemm_eta_compute=0.62, gemm_eta_memory=0.92, roofline_k=2.5,
    gemm_extra_tiles=((128, 0.74),),
    attention_fixed_s=10.5e-6, attention_decode_eta_memory=0.89, attention_prefill_eta_compute=0.143,
    elementwise_tau_s=2.2e-6, elementwise_eta_memory=0.53, fused_elementwise=False,
    collective_latency_s=10e-6, link_eta=0.7, host_overhead_s=1e-3, gemm_tile_m=64,
    source="fit: Vidur A100 Llama-2-7B mlp.csv + calibration.json attention medians")
# Fitted on Vidur's H100 Llama-2-7B mlp.csv; attention as the A100 fit (not in the data).
H100_KERNELS = KernelParams(
    gemm_tau_s=6e-6, gemm_eta_compute=0.68, gemm_eta_memory=1.0, roofline_k=1.5,
    gemm_extra_tiles=((128, 0.74), (256, 0.78)),
    attention_fixed_s=10.5e-6, attention_decode_eta_memory=0.89, attention_prefill_eta_compute=0.143,
    elementwise_tau_s=2.0e-6, elementwise_eta_memory=0.58, fused_elementwise=False,
    collective_latency_s=10e-6, link_eta=0.7, host_overhead_s=1e-3, gemm_tile_m=64,
    source="fit: Vidur H100 Llama-2-7B mlp.csv; attention assumed as A100's fit")
# Ascend: msmodeling's GEMM efficiencies; attention fractions as measured on A100; ATB fusion.
ASCEND_KERNELS = KernelParams(
    gemm_tau_s=5e-6, gemm_eta_compute=0.7, gemm_eta_memory=0.6, roofline_k=1.5,
    attention_fixed_s=10.5e-6, attention_decode_eta_memory=0.6, attention_prefill_eta_compute=0.143,
    elementwise_tau_s=5e-6, elementwise_eta_memory=0.6, fused_elementwise=True,
    collective_latency_s=20e-6, link_eta=0.7, host_overhead_s=1e-3,
    source="msmodeling efficiency defaults (GEMM); A100-measured attention fractions; MindIE ATB fusion")


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    vendor: str
    ai_cores: int                          # Ascend AI cores (NVIDIA: SMs)
    clock_ghz: float
    peak_flops: Mapping[str, float]        # dtype -> FLOP/s (INT8: OP/s)
    hbm_bytes: int
    hbm_bandwidth: float                   # bytes/s
    intra_node_bandwidth: float            # bytes/s per direction (HCCS / NVLink)
    inter_node_bandwidth: float            # bytes/s per direction (RoCE / InfiniBand)
    tdp_watts: float
    idle_watts: float
    source: str = field(default="", compare=False)
    kernels: KernelParams = field(default=ASCEND_KERNELS, compare=False)
    hbm_runtime_reserved_bytes: int = 0    # in use before the server loads anything (MindIE rule)
    host_link_bandwidth: float = 32 * GB   # bytes/s per direction between card and host memory (PCIe): KV tier copies, LoRA slot loads

    def __post_init__(self) -> None:
        missing = [d for d in DTYPES if d not in self.peak_flops]
        if missing:
            raise ValueError(f"{self.name}: peak_flops lacks {missing}")
        # Read-only view, so a shared spec cannot be edited by one caller.
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))


def _ascend(name: str, *, ai_cores: int, clock_ghz: float, bf16: float, fp16: float, int8: float,
            hbm_gib: int, hbm_tbps: float, hccs_gbps: float, tdp: float, idle: float,
            source: str) -> DeviceSpec:
    # MindIE rule: ~3 GB of an idle Ascend card is in use before a server starts (estimate).
    return DeviceSpec(
        name=name, vendor="Huawei", ai_cores=ai_cores, clock_ghz=clock_ghz,
        peak_flops={"bf16": bf16, "fp16": fp16, "int8": int8, "fp32": bf16 / 4},
        hbm_bytes=hbm_gib * GiB, hbm_bandwidth=hbm_tbps * 1e12,
        intra_node_bandwidth=hccs_gbps * GB, inter_node_bandwidth=25 * GB,
        tdp_watts=tdp, idle_watts=idle, source=source, kernels=ASCEND_KERNELS,
        hbm_runtime_reserved_bytes=3 * GB,
        host_link_bandwidth=64 * GB,       # PCIe 5.0 x16 (Atlas 800I A2), nominal per direction
    )


DEVICE_SPECS: dict[str, DeviceSpec] = {
    "910B3": _ascend(
        "910B3", ai_cores=20, clock_ghz=1.8,
        bf16=294.9 * TFLOPS, fp16=313 * TFLOPS, int8=626 * TFLOPS,
        hbm_gib=64, hbm_tbps=1.6, hccs_gbps=196, tdp=350, idle=90,
        source="Ascend/msmodeling HWConf (910B3); Atlas 800I A2 sheet (FP16/INT8); MindIE Motor",
    ),
    "910B4": _ascend(
        # 245.7 TFLOPS = 20 cores x 1.5 GHz x 8192; msmodeling lists 32 GB/s card-to-card.
        "910B4", ai_cores=20, clock_ghz=1.5,
        bf16=245.7 * TFLOPS, fp16=245.7 * TFLOPS, int8=491.5 * TFLOPS,
        hbm_gib=32, hbm_tbps=0.8, hccs_gbps=32, tdp=310, idle=80,
        source="Ascend/msmodeling HWConf (910B4)",
    ),
    "910B2": _ascend(
        "910B2", ai_cores=24, clock_ghz=1.8,
        bf16=353.9 * TFLOPS, fp16=353.9 * TFLOPS, int8=707.8 * TFLOPS,
        hbm_gib=64, hbm_tbps=1.6, hccs_gbps=196, tdp=400, idle=95,
        source="Ascend/msmodeling HWConf (910B2: 24 cube cores x 1.8 GHz)",
    ),
    "910B4-64G": _ascend(
        # Atlas 800I A2, 64 GB variant: 910B4 compute and links, 64 GB HBM (bandwidth estimated).
        "910B4-64G", ai_cores=20, clock_ghz=1.5,
        bf16=245.7 * TFLOPS, fp16=245.7 * TFLOPS, int8=491.5 * TFLOPS,
        hbm_gib=64, hbm_tbps=0.8, hccs_gbps=32, tdp=310, idle=80,
        source="Atlas 800I A2 64 GB (MindIE Qwen2-7B sample card); die as msmodeling 910B4",
    ),
    "910B1": _ascend(
        # Not in msmodeling's table: third-party figures, 25 cores x 1.85 GHz x 8192 = 378.9
        # TFLOPS; memory system as the other 64 GB 910B parts. Treat as an estimate.
        "910B1", ai_cores=25, clock_ghz=1.85,
        bf16=378.9 * TFLOPS, fp16=378.9 * TFLOPS, int8=757.8 * TFLOPS,
        hbm_gib=64, hbm_tbps=1.6, hccs_gbps=196, tdp=400, idle=95,
        source="estimate from public third-party 910B1 figures; memory as msmodeling 910B2/B3",
    ),
    "A100-80G": DeviceSpec(
        name="A100-80G", vendor="NVIDIA", ai_cores=108, clock_ghz=1.41,
        peak_flops={"bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS, "int8": 624 * TFLOPS,
                    "fp32": 19.5 * TFLOPS},
        hbm_bytes=80 * GiB, hbm_bandwidth=2.039e12,
        intra_node_bandwidth=300 * GB,     # NVLink 3: 600 GB/s bidirectional
        inter_node_bandwidth=25 * GB,      # HDR InfiniBand 200 Gb/s
        tdp_watts=400, idle_watts=60,
        source="NVIDIA A100 Tensor Core GPU data sheet (SXM4 80GB, dense)",
        kernels=A100_KERNELS, hbm_runtime_reserved_bytes=GB // 2,
        host_link_bandwidth=32 * GB,       # PCIe 4.0 x16, nominal per direction
    ),
    "H100-SXM": DeviceSpec(
        name="H100-SXM", vendor="NVIDIA", ai_cores=132, clock_ghz=1.98,
        peak_flops={"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS, "int8": 1979 * TFLOPS,
                    "fp32": 67 * TFLOPS},
        hbm_bytes=80 * GiB, hbm_bandwidth=3.35e12,
        intra_node_bandwidth=450 * GB,     # NVLink 4: 900 GB/s bidirectional
        inter_node_bandwidth=50 * GB,      # NDR InfiniBand 400 Gb/s
        tdp_watts=700, idle_watts=70,
        source="NVIDIA H100 Tensor Core GPU data sheet (SXM5, dense)",
        kernels=H100_KERNELS, hbm_runtime_reserved_bytes=GB // 2,
        host_link_bandwidth=64 * GB,       # PCIe 5.0 x16, nominal per direction
    ),
}

_BY_LOWER_NAME = {name.lower(): spec for name, spec in DEVICE_SPECS.items()}
_BY_LOWER_NAME["atlas-800i-a2-64g"] = DEVICE_SPECS["910B4-64G"]


def get_device_spec(name: str) -> DeviceSpec:
    """The spec called `name` (case-insensitive); ValueError naming the valid ones otherwise."""
    spec = _BY_LOWER_NAME.get(str(name).strip().lower())
    if spec is None:
        raise ValueError(f"unknown device {name!r}; valid devices: {', '.join(DEVICE_SPECS)}")
    return spec
