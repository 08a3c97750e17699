"""benchmarks/fair_prefill.py's pieces that decide what is compared and measured (no timing)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.fair_prefill import BEFORE_FLAGS, Phase, engine_config  # noqa: E402


def test_before_is_the_unbounded_step_and_after_the_workers_defaults():
    before = engine_config(BEFORE_FLAGS, "/m", None, 0)
    after = engine_config([], "/m", "qwen2-7b", 0)
    assert before.max_num_batched_attention == 0 and before.max_num_batched_tokens == 8192
    assert after.max_num_batched_attention is None                     # auto: the served model's host cost
    assert (after.model, after.emulate, after.timing) == ("/m", "qwen2-7b", "virtual")
    tried = engine_config(["--max-num-batched-attention", "65536", "--long-prefill-token-threshold", "256"],
                          "/m", None, 0)
    assert (tried.max_num_batched_attention, tried.long_prefill_token_threshold) == (65536, 256)


def test_gaps_overlapping_the_window_count_and_the_stall_is_one_of_them():
    # one stream: chunks every 10 ms, then a 2 s stall that begins inside the window and ends after it
    chunks = [(t / 100, 1) for t in range(10)] + [(2.09, 3), (2.10, 1)]
    phase = Phase(arrivals=[chunks], start=0.045, end=1.0)
    gaps = phase.gaps_ms()
    assert len(gaps) == 6 and round(max(gaps)) == 2000                  # 0.04-0.05 ... 0.09-2.09
    assert phase.stream_tokens() == 5                                    # chunks at 0.05 .. 0.09
