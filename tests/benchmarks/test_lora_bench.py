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
    result = lora.main(["--num-requests", "24", "--adapters", "6", "--check-requests", "6"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert tuple(last) == lora.KEYS
    assert last["adapters"] == 6 and last["max_loras"] == 4
    assert last["outputs_match_reference"] is True
    assert last["vs_one_adapter_per_batch"] > 1.0
    assert 0 < last["throughput_vs_base"] <= 1.01
    bound = result["online"]["bound"]             # no schedule beats it: the measured one does not
    assert result["throughput_vs_base"] <= bound["throughput_vs_base_upper_bound"]


def test_the_makespan_bound_counts_each_adapters_longest_output_after_each_arrival():
    from benchmarks.common import BenchRequest

    def req(t, lora_name, n):
        return BenchRequest(f"r{t}{lora_name}", [1, 2], n, arrival_s=t, lora=lora_name)

    # after t=0: a needs 3 steps, b 2 -> 5 steps of 1 s through one slot; after t=4: a needs 2 more
    bound = lora.makespan_bound([req(0, "a", 3), req(0, "b", 2), req(4, "a", 2)], max_loras=1, floor_s=1.0)
    assert bound["makespan_lower_bound_s"] == 6.0 and bound["from_s"] == 4
    assert lora.makespan_bound([req(0, "a", 3), req(0, "b", 2)], max_loras=2, floor_s=1.0)["makespan_lower_bound_s"] == 2.5
