"""The cost-only runner: an `LLMEngine` with no weights and no tokenizer that schedules as the real
one does, ends requests at max_tokens, and prices every step on the emulated device — on a
virtual clock its driver advances."""

from __future__ import annotations

import pytest

from mindmotor.device.cost_model import CostModel, StepShape
from mindmotor.device.profiles import get_profile
from mindmotor.device.specs import get_device_spec
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.continuation import Continuation, KVSource
from mindmotor.engine.cost_only_runner import PLACEHOLDER_TOKEN
from mindmotor.engine.llm_engine import LLMEngine, RequestError
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.vocabulary import FinishReason


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cost_only(clock: VirtualClock, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(runner="cost_only", device="910B3", emulate="qwen2-7b", max_model_len=4096,
                                  **kw), clock=clock)


COST = CostModel(get_device_spec("910B3"), get_profile("qwen2-7b"))


def test_a_request_of_n_tokens_finishes_after_n_steps_each_priced_by_the_cost_model():
    clock = VirtualClock()
    engine = cost_only(clock)
    assert engine.model is None and engine.tokenizer is None and engine.stats().kv_host_bytes == 0
    engine.add_request("r", [7] * 300, SamplingParams(max_tokens=5))       # EOS not ignored: no EOS exists
    expected = [COST.step(StepShape(prefills=[(300, 0)])).seconds] + \
               [COST.step(StepShape(decodes=[300 + j])).seconds for j in range(1, 5)]
    outputs, at = [], []
    for seconds in expected:
        step = engine.step()
        assert engine.last_step_s == seconds
        clock.now += engine.last_step_s
        outputs += step
        at.append(clock.now)
    assert [o.new_token_ids for o in outputs] == [[PLACEHOLDER_TOKEN]] * 5
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    assert outputs[-1].finish_reason == FinishReason.LENGTH and outputs[-1].num_output_tokens == 5
    assert clock.now == pytest.approx(sum(expected)) and engine.stats().emulated_time_s == pytest.approx(sum(expected))
    assert engine.stats().host_time_s == 0.0 and engine.stats().lag_time_s == 0.0   # the clock stood still
    assert engine.step() == [] and engine.last_step_s == 0.0 and not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_the_engine_reads_time_from_its_clock():
    clock = VirtualClock()
    engine = cost_only(clock, kv_pin_ttl_s=5.0)
    clock.now = 12.5
    seq = engine.add_request("p", [3] * 64, SamplingParams(max_tokens=4), prefill_only=True)
    assert seq.arrival_time == 12.5
    [out] = engine.step()
    assert out.finish_reason == FinishReason.PREFILLED and seq.first_token_time == 12.5
    clock.now = 17.4
    assert engine.expire_pins() == 0                         # the pin's deadline is 12.5 + 5 on the clock
    clock.now = 17.5
    assert engine.expire_pins() == 1 and engine.scheduler.kv.num_pinned == 0


def test_a_handoff_goes_through_pins_and_kv_loads_with_no_kv_data():
    clock = VirtualClock()
    prefill, decode = cost_only(clock), cost_only(clock)
    params = SamplingParams(max_tokens=4)
    prefill.add_request("x", [9] * 100, params, prefill_only=True)
    [first] = prefill.step()
    assert first.finish_reason == FinishReason.PREFILLED and prefill.scheduler.kv.num_pinned == 1
    decode.add_request("x", [9] * 100, params, continuation=Continuation(
        first.new_token_ids, kv_source=KVSource(address="prefill", handle="x")))
    assert decode.step() == [] and decode.last_step_s == 0.0     # admitted: blocks reserved, waiting for KV
    [load] = decode.take_kv_loads()
    kv = prefill.read_pinned_kv(load.source.handle, load.skip_blocks)
    assert kv.num_blocks == 7 and kv.nbytes == 0                 # 100 tokens in 16-token blocks, no layers
    assert decode.finish_kv_load("x", kv) and prefill.release_kv("x")
    outs = [o for _ in range(3) for o in decode.step()]
    assert [o.num_output_tokens for o in outs] == [2, 3, 4] and outs[-1].finish_reason == FinishReason.LENGTH
    for engine in (prefill, decode):
        engine.check_invariants()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("prompt, params, param", [
    ("some text", SamplingParams(), "prompt"),
    ([5, 6], SamplingParams(stop=["\n"]), "stop"),
    ([5, 6], SamplingParams(stop_token_ids=[PLACEHOLDER_TOKEN]), "stop_token_ids"),
    ([5, 6], SamplingParams(logprobs=1), "logprobs"),
    ([5, 6], SamplingParams(bad_words=["x"]), "bad_words"),
])
def test_what_needs_a_model_or_could_stop_a_request_early_is_refused(prompt, params, param):
    engine = cost_only(VirtualClock())
    with pytest.raises(RequestError) as err:
        engine.add_request("r", prompt, params)
    assert err.value.param == param and not engine.requests


def test_the_cost_only_runner_needs_a_profile_and_realtime_needs_the_wall_clock():
    with pytest.raises(ValueError, match="emulate"):
        EngineConfig(runner="cost_only")
    with pytest.raises(ValueError, match="runner"):
        EngineConfig(runner="gpu")
    with pytest.raises(ValueError, match="wall clock"):
        LLMEngine(EngineConfig(runner="cost_only", emulate="qwen2-7b", timing="realtime"), clock=VirtualClock())
