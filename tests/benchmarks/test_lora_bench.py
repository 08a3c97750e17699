"""benchmarks/lora.py on a small configuration: the last line's keys, mixed outputs equal to the
reference, and mixing adapters in a batch beating one adapter per batch (emulated, a few seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import lora  # noqa: E402


def test_lora_benchmark_small(capsys):
    lora.main(["--num-requests", "24", "--adapters", "6", "--check-requests", "6"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert tuple(last) == lora.KEYS
    assert last["adapters"] == 6 and last["max_loras"] == 4
    assert last["outputs_match_reference"] is True
    assert last["vs_one_adapter_per_batch"] > 1.0
    assert 0 < last["throughput_vs_base"] <= 1.01
