"""The benchmarks' core functions on very small configurations: keys and basic sanity (seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import batching, host_overhead, prefix_cache  # noqa: E402
from benchmarks.common import (BenchRequest, VirtualClockDriver, benchmark_checkpoint,  # noqa: E402
                               finish, random_tokens)
from mindmotor.engine.config import EngineConfig  # noqa: E402
from mindmotor.engine.llm_engine import LLMEngine  # noqa: E402


@pytest.fixture(scope="module")
def model_dir():
    return benchmark_checkpoint(None, 0)


def test_step_without_model_prices_exactly_like_engine_step(model_dir):
    """The shape-only stepping used for the trace-scale emulated figures gives the very same
    emulated times as the real engine step (token values do not change what is scheduled)."""
    import numpy as np
    rng = np.random.default_rng(3)
    reqs = [BenchRequest(f"r{i}", random_tokens(rng, 2000, int(rng.integers(20, 300))),
                         int(rng.integers(2, 12)), arrival_s=float(i) * 0.004) for i in range(12)]
    got = {}
    for run_model in (True, False):
        eng = LLMEngine(EngineConfig(model=model_dir, emulate="llama2-7b", num_blocks=40,
                                     max_num_batched_tokens=256, max_model_len=512))
        res = VirtualClockDriver(eng, reqs, progress=False, run_model=run_model).run()
        eng.check_invariants()
        got[run_model] = (res.emulated_busy_s, res.steps, eng.scheduler.num_preemptions,
                          {r.request_id: (r.first_token_s, r.finished_s) for r in res.records})
    assert got[True] == got[False]


def test_batching_small(model_dir):
    out = batching.run(num_requests=40, wall_requests=16, wall_scale=1 / 32, variants=True,
                       progress=False, model=None)
    for key in ("num_requests", "continuous_tok_per_emulated_s", "static_tok_per_emulated_s",
                "static_unpadded_tok_per_emulated_s", "throughput_ratio_emulated",
                "throughput_ratio_emulated_unpadded", "throughput_ratio_wall",
                "continuous_share_of_bound", "continuous_share_of_bound_wall_run", "emulated_run",
                "wall_run"):
        assert key in out
    assert out["num_requests"] == 40
    emu = out["emulated_run"]
    assert emu["continuous"]["output_tokens"] == emu["static"]["output_tokens"] == \
        emu["static_unpadded"]["output_tokens"] == out["requests"]["output_tokens_total"]
    # the headline baseline is classic padded static batching: slower than the unpadded one
    assert emu["static"]["padding_prompt_tokens"] > 0 == emu["static_unpadded"]["padding_prompt_tokens"]
    assert out["throughput_ratio_emulated"] >= out["throughput_ratio_emulated_unpadded"] >= 1.0
    # padding rows only make static slower; oracle reservations only make it faster
    assert emu["static_unpadded"]["emulated_s"] >= emu["static_unpadded"]["emulated_s_unpadded"]
    assert emu["static_oracle"]["batch_size_mean"] >= emu["static_unpadded"]["batch_size_mean"] >= \
        emu["static_context"]["batch_size_mean"]
    assert emu["static_unpadded"]["batch_size_max"] <= emu["kv_pool_tokens"] // (16 + 1024)
    assert out["wall_run"]["continuous"]["output_tokens"] == out["wall_run"]["static"]["output_tokens"]
    # the bound is an upper limit on continuous batching: the engine cannot beat it (both runs)
    assert 0 < out["continuous_share_of_bound"] <= 1.0
    assert 0 < out["continuous_share_of_bound_wall_run"] <= 1.0
    assert out["throughput_ratio_bound"] >= out["throughput_ratio_emulated"]
    assert out["throughput_ratio_bound_unpadded"] >= out["throughput_ratio_emulated_unpadded"]


def test_static_policy_respects_kv_reservation():
    reqs = [BenchRequest(f"r{i}", [1] * 100, 10, declared_max_tokens=60) for i in range(10)]

    class Idle:
        @staticmethod
        def has_unfinished_requests():
            return False

    # 100 + 60 = 160 tokens = 10 blocks of 16 per sequence; 35 blocks fit 3
    assert batching.static_policy(35 * 16, 16, 256)(Idle, reqs) == 3
    assert batching.static_policy(35 * 16, 16, 2)(Idle, reqs) == 2
    assert batching.static_policy(35 * 16, 16, 256, reserve="oracle")(Idle, reqs) == 5


def test_prefix_cache_small(model_dir):
    out = prefix_cache.run(num_requests=10, rate=6.0, system_len=256, progress=False)
    for key in ("ttft_reduction", "ttft_mean_on_s", "ttft_mean_off_s", "ttft_p90_on_s",
                "ttft_p90_off_s", "prefix_hit_rate", "throughput_on_tok_per_emulated_s",
                "throughput_off_tok_per_emulated_s", "num_requests"):
        assert key in out
    assert out["prefix_hit_rate"] > 0
    assert out["caching_off"]["prefix_hit_rate"] == 0
    assert out["ttft_mean_on_s"] < out["ttft_mean_off_s"]
    assert 0 < out["ttft_reduction"] < 1


def test_host_overhead_small(model_dir):
    out = host_overhead.run(sched_steps=5, ratio_steps=2, max_batch=4, num_seqs=32)
    for key in ("sched_ms_256", "host_over_emulated_max_128", "host_over_emulated_max_256",
                "floor_over_emulated_max_256", "step_ratio_table", "prompt_len", "step_profile_256",
                "decode_kv_ab_256"):
        assert key in out
    assert [r["batch"] for r in out["step_ratio_table"]] == [1, 2, 4]
    assert out["scheduler"]["num_running_decodes"] == 32
    assert out["sched_ms_256"] > 0 and out["host_over_emulated_max_128"] > 0
    assert out["host_over_emulated_max_256"] >= out["host_over_emulated_max_128"]
    assert all(r["floor_ms_p50"] > 0 for r in out["step_ratio_table"])


def test_finish_prints_one_json_line_last(capsys, tmp_path):
    finish({"a": 1, "b": [1, 2]}, str(tmp_path / "out.json"))
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == {"a": 1, "b": [1, 2]}
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1, "b": [1, 2]}


def test_pd_realtime_helpers_and_plot(tmp_path):
    """The realtime P/D variant's pure parts: cluster layouts, host-lag accounting, the CDF plot."""
    from types import SimpleNamespace

    from benchmarks import pd_realtime
    from benchmarks.pd_plots import plot_cdfs

    assert [r for r, _ in pd_realtime.worker_roles("split", 2048)] == ["prefill", "prefill", "decode", "decode"]
    assert all("--no-chunked-prefill" in f for _, f in pd_realtime.worker_roles("mixed", 2048))
    assert all("--no-chunked-prefill" not in f for _, f in pd_realtime.worker_roles("mixed_chunked", 2048))

    def status(lag, busy):
        return SimpleNamespace(worker_id="w", role="mixed", load=SimpleNamespace(lag_time_s=lag, emulated_time_s=busy))

    lag = pd_realtime.host_lag([status(1.0, 10.0)] * 2, [status(1.5, 20.0), status(1.0, 30.0)], wall_s=10.0)
    assert lag["host_lag_s"] == 0.5 and lag["emulated_busy_s"] == 30.0 and not lag["host_bound"]
    assert pd_realtime.host_lag([status(0, 0)], [status(2.0, 10.0)], 10.0)["host_bound"]
    path = plot_cdfs({"mixed": {"ttft_s": [0.1, 0.2], "tpot_s": [0.02, 0.03]}, "split": {"ttft_s": [0.3]}},
                     tmp_path / "cdf.png", "test")
    assert path.stat().st_size > 1000


def test_kv_tiers_small():
    """The KV tiers benchmark on a few sessions: its keys, the tier hitting what the oracle hits,
    and the same greedy outputs with and without the tier."""
    from benchmarks import kv_tiers

    w = kv_tiers.Workload(sessions=6, turns=3, first_prompt=256, user_tokens=64, output_tokens=8)
    headline, details = kv_tiers.run(w, progress=False)
    assert list(headline) == ["hit_rate", "oracle_hit_rate", "ttft_turn2plus_vs_hbm_only",
                              "throughput_vs_hbm_only", "async_vs_sync_load", "no_reuse_vs_hbm_only",
                              "outputs_identical"]
    assert headline["outputs_identical"] is True
    assert details["runs"]["hbm_only"]["hbm_evictions"] > 0
    assert 0 < headline["hit_rate"] <= headline["oracle_hit_rate"] + 1e-9
    assert details["runs"]["tier"]["prompt_tokens_computed"] < details["runs"]["hbm_only"]["prompt_tokens_computed"]
    assert details["outputs_check"]["tier"]["loads_failed"] == 1
