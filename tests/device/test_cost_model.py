import time

import pytest

from mindmotor.device.cost_model import CostModel, StepShape
from mindmotor.device.profiles import get_profile
from mindmotor.device.specs import get_device_spec

SPEC = get_device_spec("910B3")
TAU = 5e-6

# Llama-2-7B by hand: L=32, hidden 4096, MLP 11008, 32 heads = 32 kv heads of 128, vocab 32000.
L, H, I, V = 32, 4096, 11008, 32000
LAYER_WEIGHTS = 4 * H * H + 3 * H * I                     # q, k, v, o + gate, up, down
PARAMS = L * (LAYER_WEIGHTS + 2 * H) + 2 * V * H + H      # + norms, embedding, LM head, final norm


@pytest.fixture(scope="module")
def llama():
    return CostModel(SPEC, get_profile("llama2-7b"))


def test_decode_batch1_is_memory_bound_weight_read(llama):
    cost = llama.step(StepShape(decodes=[1]))
    kernels = L * 6 + 2           # per layer 4 GEMMs, attention, KV write; embedding, LM head
    expected = 2 * PARAMS / (0.6 * 1.6e12) + kernels * TAU
    assert not cost.compute_bound
    assert cost.num_kernels == kernels
    assert cost.seconds == pytest.approx(expected, rel=0.03)
    assert cost.seconds > 2 * PARAMS / 1.6e12              # above the 8.4 ms roofline floor


def test_large_prefill_is_compute_bound(llama):
    tokens = 2048
    cost = llama.step(StepShape(prefills=[(tokens, 0)]))
    expected = 2 * PARAMS * tokens / (0.7 * 294.9e12)
    assert cost.compute_bound
    assert cost.seconds == pytest.approx(expected, rel=0.15)


def test_decode_batching_is_nearly_free_at_small_batch(llama):
    one = llama.step(StepShape(decodes=[128])).seconds
    sixty_four = llama.step(StepShape(decodes=[128] * 64)).seconds
    assert one < sixty_four < 2 * one


def test_longer_context_costs_more_attention(llama):
    short = llama.step(StepShape(decodes=[100] * 8)).breakdown["attention_decode"]
    long = llama.step(StepShape(decodes=[4000] * 8)).breakdown["attention_decode"]
    assert long > 10 * short


def test_decode_attention_by_hand(llama):
    contexts = [1000, 3000]
    cost = llama.step(StepShape(decodes=contexts))
    nbytes = 2 * 2 * 32 * 128 * sum(contexts) * L        # 2 b hkv e k per layer
    flops = 4 * 32 * 128 * sum(contexts) * L
    expected = max(nbytes / (0.6 * 1.6e12), flops / (0.7 * 294.9e12)) + L * TAU
    assert cost.breakdown["attention_decode"] == pytest.approx(expected)


def test_mixed_batch_adds_attention_and_shares_weights(llama):
    prefill = StepShape(prefills=[(512, 256)])
    decode = StepShape(decodes=[300] * 32)
    mixed = StepShape(prefills=prefill.prefills, decodes=decode.decodes)
    p, d, m = llama.step(prefill), llama.step(decode), llama.step(mixed)

    # Work adds up exactly: FLOPs are linear in tokens; the weights are read once, not twice.
    assert m.flops == pytest.approx(p.flops + d.flops)
    shared_weight_bytes = 2 * (L * LAYER_WEIGHTS + V * H)
    assert m.bytes == pytest.approx(p.bytes + d.bytes - shared_weight_bytes)
    assert m.breakdown["attention_prefill"] == pytest.approx(p.breakdown["attention_prefill"])
    assert m.breakdown["attention_decode"] == pytest.approx(d.breakdown["attention_decode"])
    shared_kernels = L * 5 + 2                  # GEMMs and KV write per layer, embedding, LM head
    assert m.num_kernels == p.num_kernels + d.num_kernels - shared_kernels
    # Time: never less than either part alone, never more than running them separately.
    assert max(p.seconds, d.seconds) < m.seconds <= p.seconds + d.seconds


def test_empty_step_costs_nothing(llama):
    cost = llama.step(StepShape())
    assert cost.seconds == 0 and cost.num_kernels == 0 and cost.breakdown == {}


def test_all_reduce_only_with_tensor_parallelism():
    shape = StepShape(decodes=[100] * 16)
    single = CostModel(SPEC, get_profile("llama3-70b", tp=1)).step(shape)
    assert "all_reduce" not in single.breakdown
    cost = CostModel(SPEC, get_profile("llama3-70b", tp=8)).step(shape)
    n, layers, hidden = 16, 80, 8192
    link = 2 * layers * (2 * 7 / 8 * n * hidden * 2) / (0.7 * 196e9)
    assert cost.breakdown["all_reduce"] == pytest.approx(link + 2 * layers * TAU)


def test_kv_transfer_time():
    model = CostModel(SPEC, get_profile("qwen2-7b"))
    tokens = 1000
    nbytes = tokens * 2 * 28 * 4 * 128 * 2
    got = model.kv_transfer_seconds(tokens, link="inter_node", alpha_s=1e-4, eta=0.5)
    assert got == pytest.approx(1e-4 + nbytes / (0.5 * 25e9))
    assert model.kv_transfer_seconds(tokens) < model.kv_transfer_seconds(tokens, link="inter_node")
    with pytest.raises(ValueError):
        model.kv_transfer_seconds(tokens, link="pcie")


def test_unknown_dtype():
    with pytest.raises(ValueError):
        CostModel(SPEC, get_profile("qwen2-7b"), dtype="fp8")


def test_step_is_fast(llama):
    shape = StepShape(prefills=[(256, 512)], decodes=list(range(200, 328)))   # 128 decodes
    calls = 2000
    started = time.perf_counter()
    for _ in range(calls):
        llama.step(shape)
    per_call = (time.perf_counter() - started) / calls
    assert per_call < 50e-6
