"""benchmarks/grammar_mask.py on a tiny batch: its figures are there and add up (seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import grammar_mask  # noqa: E402


def test_measure_reports_the_mask_share():
    row = grammar_mask.measure(batch=2, steps=3)
    assert row["batch"] == 2 and row["steps"] == 3
    assert 0 < row["mask_ms_median"] < row["step_host_ms_median"]
    assert row["step_emulated_ms_median"] > 0
    assert 0 < row["mask_share_of_host_step"] < 1
