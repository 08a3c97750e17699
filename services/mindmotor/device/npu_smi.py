"""`npu-smi info`-style table of emulated NPUs.

Layout after Huawei's `npu-smi info`: a version banner, then two rows per NPU in three boxed
columns (identity | health and bus | power, temperature, AI-core load and HBM), `=` rules
under the header and after each device. MB are MiB, as the real tool prints (64 GiB = 65536).
"""

from __future__ import annotations

from importlib import metadata

COLUMN_WIDTHS = (27, 15, 52)      # interior widths of the three boxes
MiB = 2**20


def _version() -> str:
    try:
        return metadata.version("mindmotor")
    except metadata.PackageNotFoundError:
        return "unknown"


def _rule(fill: str) -> str:
    return "+" + "+".join(fill * (w + 2) for w in COLUMN_WIDTHS) + "+"


def _row(*cells: str) -> str:
    return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, COLUMN_WIDTHS)) + "|"


def _banner(text: str) -> str:
    inner = sum(w + 3 for w in COLUMN_WIDTHS) - 1
    return "|" + f" {text:<{inner - 1}}" + "|"


def _device_rows(index: int, snap: dict) -> list[str]:
    npu = snap.get("npu_id", index)
    used_mb = int(snap.get("hbm_used_bytes", 0)) // MiB
    total_mb = int(snap.get("hbm_total_bytes", 0)) // MiB
    freq = snap.get("aicore_freq_mhz")
    power, temperature = float(snap.get("power_w", 0.0)), float(snap.get("temperature_c", 0.0))
    return [
        _row(f"{npu:<5} {snap.get('device', '?')}", str(snap.get("health", "OK")),
             f"{power:<11.1f} {temperature:<17.0f} {'' if freq is None else freq}"),
        _row("0", "emulated",
             f"{float(snap.get('utilization', 0.0)):<11.0f} {used_mb:>6} / {total_mb:<6}"),
    ]


def format_npu_smi(snapshots: list[dict]) -> str:
    version = _version()
    lines = [
        _rule("-"),
        _banner(f"npu-smi (MindMotor emulated)   Version: {version}"),
        _rule("-"),
        _row("NPU   Name", "Health", "Power(W)    Temp(C)           AICore(MHz)"),
        _row("Chip", "Bus-Id", "AICore(%)   HBM-Usage(MB)"),
        _rule("="),
    ]
    if not snapshots:
        lines += [_banner("No NPU found"), _rule("=")]
    for index, snap in enumerate(snapshots):
        lines += _device_rows(index, snap)
        lines.append(_rule("="))
    return "\n".join(lines)
