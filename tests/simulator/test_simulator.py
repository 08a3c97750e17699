"""The simulator replays exactly what the real engine would do on one instance, hands P/D
requests off the way workers price them, routes with the coordinator's policies, and reports."""

from __future__ import annotations

from dataclasses import replace

import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from mindmotor.device.cost_model import CostModel, StepShape  # noqa: E402
from mindmotor.device.profiles import get_profile  # noqa: E402
from mindmotor.device.specs import get_device_spec  # noqa: E402
from mindmotor.simulator import ClusterSpec, TraceRequest, simulate  # noqa: E402
from mindmotor.simulator.report import SLO, summarize  # noqa: E402


def small_trace(n: int = 40, seed: int = 3, rate: float = 4.0) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    return [TraceRequest(float(a), int(rng.integers(20, 600)), int(rng.integers(1, 60))) for a in arrivals]


def test_one_instance_matches_the_real_engine_step_for_step():
    """Same requests through LLMEngine (no model forward: benchmarks.common.step_without_model)
    and through the simulator: identical first-token and finish times, to the float."""
    from benchmarks.common import BenchRequest, VirtualClockDriver, benchmark_checkpoint, random_tokens
    from mindmotor.engine.config import EngineConfig
    from mindmotor.engine.llm_engine import LLMEngine

    trace = small_trace(30, rate=40.0)
    engine = LLMEngine(EngineConfig(model=benchmark_checkpoint(None, 0), emulate="llama2-7b", num_blocks=60,
                                    max_num_batched_tokens=512, max_num_seqs=16, max_model_len=900,
                                    enable_prefix_caching=False))
    rng = np.random.default_rng(0)
    reqs = [BenchRequest(str(i), random_tokens(rng, 2000, t.prompt_tokens), t.output_tokens, t.arrival_s)
            for i, t in enumerate(trace)]
    real = VirtualClockDriver(engine, reqs, progress=False, run_model=False).run()
    assert engine.scheduler.num_preemptions > 0                  # the small pool is exercised

    spec = ClusterSpec(mixed=1, device="910B3", model="llama2-7b", max_num_batched_tokens=512,
                       max_num_seqs=16, max_model_len=900, memory_fraction=0.8,
                       frontend_overhead_s=0.0)          # the engine alone, as the driver runs it
    sim = simulate(spec, trace, num_blocks=60)
    by_id = {r.request_id: r for r in real.records}
    for r in sim.requests:
        want = by_id[str(r.index)]
        assert r.first_token_s == pytest.approx(want.first_token_s, abs=1e-9)
        assert r.finished_s == pytest.approx(want.finished_s, abs=1e-9)
    assert sim.instances[0].scheduler.num_preemptions == engine.scheduler.num_preemptions
    assert sim.instances[0].steps == real.steps


def test_pd_handoff_prices_the_kv_transfer_and_frees_every_block():
    trace = [TraceRequest(0.0, 1000, 5), TraceRequest(50.0, 300, 1)]
    spec = ClusterSpec(mixed=0, prefill=1, decode=1, device="910B3", model="qwen2-7b", cards_per_node=1)
    res = simulate(spec, trace)
    model = CostModel(get_device_spec("910B3"), get_profile("qwen2-7b"))
    first, second = res.requests
    # An idle cluster: TTFT is the serving path and the prefill step; the KV then crosses nodes
    # (one card per node).
    assert spec.frontend_overhead_s > 0
    assert first.first_token_s == pytest.approx(spec.frontend_overhead_s
                                                + model.step(StepShape(prefills=[(1000, 0)])).seconds)
    transfer = model.kv_transfer_seconds(1000, "inter_node")
    assert res.kv_transfer_s == pytest.approx(transfer)
    decode = sum(model.step(StepShape(decodes=[1000 + j])).seconds for j in range(1, 5))
    assert first.finished_s == pytest.approx(first.first_token_s + transfer + decode)
    assert res.handoffs == 1 and not second.handoff               # one output token: nothing to hand off
    for inst in res.instances:
        assert inst.block_manager.num_free_blocks == inst.block_manager.num_blocks and inst.scheduler.kv.num_pinned == 0


def test_routing_policies_spread_the_load():
    trace = [TraceRequest(i * 0.001, 100, 20) for i in range(12)]
    rr = simulate(ClusterSpec(mixed=3, routing="round_robin", model="llama2-7b"), trace)
    assert [x.steps > 0 for x in rr.instances] == [True] * 3
    counts = np.bincount([r.index % 3 for r in rr.requests])
    assert list(counts) == [4, 4, 4]
    ll = summarize(simulate(ClusterSpec(mixed=3, routing="least_load", model="llama2-7b"), trace))
    single = summarize(simulate(ClusterSpec(mixed=1, model="llama2-7b"), trace))
    assert ll["ttft_s"]["p90"] < single["ttft_s"]["p90"]


def test_report_percentiles_goodput_and_usage():
    trace = small_trace(60, rate=20.0)
    res = simulate(ClusterSpec(mixed=1, model="llama2-7b"), trace)
    s = summarize(res, SLO(ttft_s=0.5, tpot_s=0.05))
    ttft = np.array([r.first_token_s - r.arrival_s for r in res.requests])
    assert s["ttft_s"]["p90"] == pytest.approx(np.percentile(ttft, 90))
    outs = np.array([r.output_tokens for r in res.requests])
    tpot = np.array([(r.finished_s - r.first_token_s) / (r.output_tokens - 1) for r in res.requests
                     if r.output_tokens > 1])
    ok = (ttft <= 0.5) & np.array([(r.output_tokens == 1) or
                                   (r.finished_s - r.first_token_s) / (r.output_tokens - 1) <= 0.05
                                   for r in res.requests])
    assert s["tpot_s"]["p50"] == pytest.approx(np.median(tpot))
    assert s["goodput_fraction"] == pytest.approx(ok.mean())
    assert len(res.itl_s) == outs.sum() - len(outs)              # one gap per token after the first
    assert 0 < s["utilization_mean"] <= 1 and 0 < s["kv_usage_mean"] <= s["kv_usage_peak"] <= 1
    assert s["output_tokens"] == outs.sum()


def test_long_requests_are_clipped_to_the_context():
    res = simulate(ClusterSpec(mixed=1, model="llama2-7b", max_model_len=512), [TraceRequest(0, 600, 10)])
    assert res.clipped == 1 and res.requests[0].prompt_tokens + res.requests[0].output_tokens <= 512


def test_frontend_overhead_delays_the_first_token_not_the_decode():
    """On an idle instance the serving path's overhead adds to TTFT and E2E exactly and leaves
    TPOT alone; a busy one queues the later request behind the earlier (delayed) one."""
    trace = [TraceRequest(0.0, 300, 20), TraceRequest(30.0, 500, 10)]
    base = ClusterSpec(mixed=1, model="llama2-7b", frontend_overhead_s=0.0)
    bare = simulate(base, trace).requests
    path = simulate(replace(base, frontend_overhead_s=0.012), trace).requests
    for a, b in zip(bare, path):
        assert b.first_token_s - b.arrival_s == pytest.approx(a.first_token_s - a.arrival_s + 0.012, abs=1e-9)
        assert b.finished_s - b.first_token_s == pytest.approx(a.finished_s - a.first_token_s, abs=1e-9)
    with pytest.raises(ValueError, match="frontend_overhead_s"):
        ClusterSpec(frontend_overhead_s=-1.0)
