"""benchmarks/grammar_mask.py on a tiny batch: its figures are there and add up (seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import grammar_mask  # noqa: E402


def test_measure_reports_the_mask_share_of_each_way():
    runs = [grammar_mask.measure(batch=2, steps=3, way=way) for way in grammar_mask.WAYS]
    for run in runs:
        assert run["steps"] == 3 and 0 < run["mask_ms"] < run["step_host_ms"]
        assert run["compute_ms"] > 0 and run["step_emulated_ms"] > 0
    row = grammar_mask.summarize(runs)
    assert row["batch"] == 2 and row["rounds"] == 1
    for way in grammar_mask.WAYS:
        assert 0 < row[way]["mask_share_of_emulated_step"] < 1
    assert set(row["exposed_vs_baseline"]) == {"sync", "overlap"}
