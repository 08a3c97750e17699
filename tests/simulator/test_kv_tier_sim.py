"""`mindmotor simulate` models the KV host tier: on a multi-turn trace (a session column) whose
context outgrows the KV pool, the tier's loads replace recomputation in the capacity figures."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from mindmotor.simulator.cluster import ClusterSpec
from mindmotor.simulator.report import summarize, SLO
from mindmotor.simulator.simulator import simulate
from mindmotor.simulator.trace import TraceRequest, load_trace


def chat_trace(sessions: int = 12, turns: int = 4, gap_s: float = 3.0) -> list[TraceRequest]:
    """Each session's turn t: its previous prompt and 32-token answer plus 200 new tokens."""
    rng = np.random.default_rng(0)
    rows = []
    for s in range(sessions):
        start = float(rng.uniform(0, 1))
        for t in range(turns):
            rows.append(TraceRequest(start + t * gap_s, 600 + t * (32 + 200), 32, session=f"c{s}"))
    return sorted(rows, key=lambda r: r.arrival_s)


def test_the_host_tier_turns_recomputation_into_loads():
    trace = chat_trace()
    base = ClusterSpec(enable_prefix_caching=True)
    # 400 blocks of 16 tokens: a third of the sessions' final contexts
    without = summarize(simulate(base, trace, num_blocks=400), SLO(None, None))
    tiered = summarize(simulate(ClusterSpec(enable_prefix_caching=True, kv_host_bytes=8 * 2**30), trace,
                                num_blocks=400), SLO(None, None))
    assert without["requests"] == tiered["requests"] == len(trace)
    assert without["kv_tier_hit_rate"] == 0 and tiered["kv_tier_hit_rate"] > 0.3
    assert tiered["prefix_hit_rate"] + tiered["kv_tier_hit_rate"] > 2 * without["prefix_hit_rate"]
    assert tiered["ttft_s"]["mean"] < 0.7 * without["ttft_s"]["mean"]


def test_the_cli_takes_the_tier_flags_and_a_session_column(tmp_path):
    path = tmp_path / "chat.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,session\n"
                    + "".join(f"{r.arrival_s},{r.prompt_tokens},{r.output_tokens},{r.session}\n"
                              for r in chat_trace(4, 3)))
    assert {r.session for r in load_trace(path)} == {"c0", "c1", "c2", "c3"}
    out = subprocess.run([sys.executable, "-m", "mindmotor.cli", "simulate", "--trace", str(path), "--json",
                          "--prefix-caching", "--kv-host-bytes", "4GiB", "--prefetch-depth", "4"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["requests"] == 12 and result["prefix_hit_rate"] > 0.5
