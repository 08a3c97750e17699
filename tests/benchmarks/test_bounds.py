"""The lower bounds of benchmarks/bounds.py: exact where the schedule is forced, never above what
the engine achieves, and raised by each constraint they name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.bounds import continuous_time_lower_bound, prefill_ttft_floor  # noqa: E402
from benchmarks.common import BenchRequest, VirtualClockDriver, benchmark_checkpoint, random_tokens  # noqa: E402
from mindmotor.device.cost_model import CostModel, StepShape  # noqa: E402
from mindmotor.device.profiles import get_profile  # noqa: E402
from mindmotor.device.specs import get_device_spec  # noqa: E402
from mindmotor.engine.config import EngineConfig  # noqa: E402
from mindmotor.engine.llm_engine import LLMEngine  # noqa: E402


@pytest.fixture(scope="module")
def cost_model():
    return CostModel(get_device_spec("910B3"), get_profile("llama2-7b"))


def test_one_request_of_one_token_is_exactly_its_prefill_step(cost_model):
    bound = continuous_time_lower_bound(cost_model, [(1000, 1)], kv_pool_tokens=10**6,
                                        max_num_seqs=256, max_num_batched_tokens=8192)
    assert bound.min_steps == 1
    assert bound.seconds == pytest.approx(cost_model.step(StepShape(prefills=[(1000, 0)])).seconds)
    assert bound.seconds == pytest.approx(prefill_ttft_floor(cost_model, 1000))


def test_each_constraint_raises_the_fewest_steps(cost_model):
    lengths = [(100, 50)] * 8                    # 8 x 49 decode tokens, contexts 101..149
    free = dict(kv_pool_tokens=10**6, max_num_seqs=256, max_num_batched_tokens=8192)
    assert continuous_time_lower_bound(cost_model, lengths, **free).min_steps == 50
    few_seqs = continuous_time_lower_bound(cost_model, lengths, **{**free, "max_num_seqs": 2})
    assert few_seqs.min_steps == 196             # 392 decode tokens, 2 per step
    small_pool = continuous_time_lower_bound(cost_model, lengths, **{**free, "kv_pool_tokens": 500})
    assert small_pool.min_steps == -(-8 * sum(range(101, 150)) // 500)
    assert small_pool.seconds > continuous_time_lower_bound(cost_model, lengths, **free).seconds


def test_operators_price_exactly_like_step(cost_model):
    shape = StepShape(prefills=[(700, 300), (50, 0)], decodes=[1200, 90, 5])
    ops = cost_model.operators(shape)
    assert sum(op.seconds(cost_model.kernel_overhead_s) for op in ops.values()) == \
        pytest.approx(cost_model.step(shape).seconds)
    assert cost_model.operators(StepShape()) == {}


def test_the_engine_never_beats_the_bound():
    """The real scheduler on a small pool (preemptions included) takes at least the bound."""
    import numpy as np
    rng = np.random.default_rng(5)
    lengths = [(int(rng.integers(20, 300)), int(rng.integers(2, 40))) for _ in range(24)]
    reqs = [BenchRequest(f"r{i}", random_tokens(rng, 2000, p), o, arrival_s=0.0) for i, (p, o) in enumerate(lengths)]
    engine = LLMEngine(EngineConfig(model=benchmark_checkpoint(None, 0), emulate="llama2-7b", num_blocks=60,
                                    max_num_batched_tokens=512, max_model_len=512))
    res = VirtualClockDriver(engine, reqs, progress=False, run_model=False).run()
    assert engine.scheduler.num_preemptions > 0
    bound = continuous_time_lower_bound(engine.device.cost_model, lengths, kv_pool_tokens=60 * 16,
                                        max_num_seqs=engine.config.max_num_seqs, max_num_batched_tokens=512)
    assert res.steps >= bound.min_steps
    assert res.emulated_busy_s >= bound.seconds
