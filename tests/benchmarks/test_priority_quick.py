"""benchmarks/priority.py on a short run: the named keys on the last JSON line, and on emulated
time (deterministic for a seed) priority scheduling beats FCFS for the interactive stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
KEYS = ("interactive_ttft_p99_vs_isolated", "fcfs_over_priority_interactive_ttft_p99", "goodput_vs_fcfs",
        "batch_max_wait_s", "batch_wait_bound_s", "preemptions")


def test_priority_benchmark_short_run():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "services")}
    out = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "priority.py"), "--quick", "--duration", "20"],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(k in result for k in KEYS)
    p99 = result["interactive_ttft_p99_s"]
    assert p99["isolated"] <= p99["priority"] < p99["fcfs"]
    assert result["fcfs_over_priority_interactive_ttft_p99"] > 1 and result["goodput_vs_fcfs"] > 0
