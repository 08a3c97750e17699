"""benchmarks/pd_split.py in emulated mode on a few requests: the issue's keys, every request
served by every cluster, and the split's TTFT never below the bound the script reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import pd_split  # noqa: E402


def test_emulated_run_reports_the_issue_keys_within_the_bound(capsys):
    pd_split.main(["--requests", "24", "--rate", "12", "--no-plot"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("ttft_p90_reduction_vs_mixed", "tpot_p90_ratio_vs_mixed", "ttft_p90_reduction_vs_chunked"):
        assert isinstance(out[key], float)
    assert out["ttft_p90_reduction_vs_mixed"] <= out["ttft_p90_reduction_bound_vs_mixed"] < 1
    for kind in ("mixed", "mixed_chunked", "split"):
        run = out["runs"][kind]
        assert run["ttft_p90_s"] >= out["ttft_p90_floor_s"]
        assert run["completed"] == 24
    assert out["runs"]["split"]["kv_transfer_mean_s"] > 0
