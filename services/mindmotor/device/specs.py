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

    def __post_init__(self) -> None:
        missing = [d for d in DTYPES if d not in self.peak_flops]
        if missing:
            raise ValueError(f"{self.name}: peak_flops lacks {missing}")
        # Read-only view, so a shared spec cannot be edited by one caller.
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))


def _ascend(name: str, *, ai_cores: int, clock_ghz: float, bf16: float, fp16: float, int8: float,
            hbm_gib: int, hbm_tbps: float, hccs_gbps: float, tdp: float, idle: float,
            source: str) -> DeviceSpec:
    return DeviceSpec(
        name=name, vendor="Huawei", ai_cores=ai_cores, clock_ghz=clock_ghz,
        peak_flops={"bf16": bf16, "fp16": fp16, "int8": int8, "fp32": bf16 / 4},
        hbm_bytes=hbm_gib * GiB, hbm_bandwidth=hbm_tbps * 1e12,
        intra_node_bandwidth=hccs_gbps * GB, inter_node_bandwidth=25 * GB,
        tdp_watts=tdp, idle_watts=idle, source=source,
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
    ),
}

_BY_LOWER_NAME = {name.lower(): spec for name, spec in DEVICE_SPECS.items()}


def get_device_spec(name: str) -> DeviceSpec:
    """The spec called `name` (case-insensitive); ValueError naming the valid ones otherwise."""
    spec = _BY_LOWER_NAME.get(str(name).strip().lower())
    if spec is None:
        raise ValueError(f"unknown device {name!r}; valid devices: {', '.join(DEVICE_SPECS)}")
    return spec
