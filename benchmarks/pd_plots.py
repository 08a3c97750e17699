"""CDF plots of TTFT and TPOT for the three clusters of `pd_split.py` (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LABELS = {"mixed": "4 mixed, no chunking", "mixed_chunked": "4 mixed, chunked prefill", "split": "2P:2D split"}


def plot_cdfs(samples: dict[str, dict[str, list[float]]], path: str | Path, title: str) -> Path:
    """`samples`: {cluster: {"ttft_s": [...], "tpot_s": [...]}} → one PNG with two CDF panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, unit, scale in ((axes[0], "ttft_s", "TTFT (s)", 1.0), (axes[1], "tpot_s", "TPOT (ms)", 1000.0)):
        for kind, label in LABELS.items():
            values = np.sort(np.asarray(samples.get(kind, {}).get(key, []), dtype=float)) * scale
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=label)
        ax.axhline(0.9, color="grey", linewidth=0.6, linestyle=":")
        ax.set_xlabel(unit)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
