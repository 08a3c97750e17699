
import pytest

from mindmotor.device.cost_model import OPERATOR_NAMES, CostModel, StepShape, roofline
from mindmotor.device.profiles import get_profile
from mindmotor.device.specs import get_device_spec

SPEC = get_device_spec("910B3")
TAU = 5e-6                 # GEMM / KV-write / embedding launch (Ascend defaults, specs.ASCEND_KERNELS)
ATTN_FIXED = 10.5e-6       # per layer, decode or prefill attention
EW_TAU = 5e-6              # one fused elementwise kernel (3 per layer on Ascend: AddRmsNorm x2, SwiGLU)
HOST = 1e-3                # per step

# Llama-2-7B by hand: L=32, hidden 4096, MLP 11008, 32 heads = 32 kv heads of 128, vocab 32000.
L, H, I, V = 32, 4096, 11008, 32000
LAYER_WEIGHTS = 4 * H * H + 3 * H * I                     # q, k, v, o + gate, up, down
PARAMS = L * (LAYER_WEIGHTS + 2 * H) + 2 * V * H + H      # + norms, embedding, LM head, final norm


@pytest.fixture(scope="module")
def llama():
    return CostModel(SPEC, get_profile("llama2-7b"))


def test_decode_batch1_is_memory_bound_weight_read(llama):
    cost = llama.step(StepShape(decodes=[1]))
    kernels = L * 9 + 2           # per layer 4 GEMMs, attention, KV write, 3 elementwise; embedding, LM head
    fixed = (L * 5 + 2) * TAU + L * ATTN_FIXED + 3 * L * EW_TAU + HOST
    expected = 2 * PARAMS / (0.6 * 1.6e12) + fixed
    assert not cost.compute_bound
    assert cost.num_kernels == kernels
    assert cost.seconds == pytest.approx(expected, rel=0.03)
    assert cost.seconds > 2 * PARAMS / 1.6e12              # above the 8.4 ms roofline floor


def test_large_prefill_is_compute_bound(llama):
    tokens = 2048
    cost = llama.step(StepShape(prefills=[(tokens, 0)]))
    gemms = 2 * PARAMS * tokens / (0.7 * 294.9e12)
    attention = L * 4 * 32 * 128 * tokens * tokens / 2 / (0.143 * 294.9e12)   # causal FLOPs
    elementwise = L * 2 * tokens * (8 * H + 3 * I) / (0.6 * 1.6e12)
    assert cost.compute_bound
    assert cost.seconds == pytest.approx(gemms + attention + elementwise, rel=0.05)
    assert cost.breakdown["attention_prefill"] == pytest.approx(attention + L * ATTN_FIXED, rel=0.01)


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
    expected = max(nbytes / (0.6 * 1.6e12), flops / (0.7 * 294.9e12)) + L * ATTN_FIXED
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
    shared_kernels = L * 8 + 2        # GEMMs, KV write, elementwise per layer; embedding, LM head
    assert m.num_kernels == p.num_kernels + d.num_kernels - shared_kernels
    # Time: never less than either part alone, never more than running them separately.
    assert max(p.seconds, d.seconds) < m.seconds <= p.seconds + d.seconds - HOST


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
    assert cost.breakdown["all_reduce"] == pytest.approx(link + 2 * layers * 20e-6)   # HCCS latency per call


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


def test_roofline_is_smooth_near_the_ridge_and_sharp_away_from_it():
    assert roofline(1.0, 1.0, 1.5) == pytest.approx(2 ** (1 / 1.5))      # at the ridge: 1.59x max
    assert roofline(1.0, 0.01, 1.5) == pytest.approx(1.0, rel=1e-3)       # far from it: the max
    assert roofline(1.0, 2.0, None) == 2.0
    # A k-norm: splitting work over two steps never costs less than doing it at once.
    assert roofline(0.3, 0.5, 1.5) + roofline(0.7, 0.1, 1.5) >= roofline(1.0, 0.6, 1.5)


def test_elementwise_switch_unfused_vllm_vs_fused_mindie():
    shape = StepShape(decodes=[500] * 64)
    fused = CostModel(SPEC, get_profile("llama2-7b")).operators(shape)["elementwise"]
    unfused = CostModel(SPEC, get_profile("llama2-7b"), fused_elementwise=False).operators(shape)["elementwise"]
    assert (fused.kernels, unfused.kernels) == (3 * L, 5 * L)
    # vLLM's five: RMSNorm (2h), RoPE on q and k (2 (hq + hkv) e), RMSNorm (2h), SiLU*mul (3I), add (3h)
    assert unfused.bytes == 2 * 64 * L * (2 * H + 2 * 64 * 128 + 2 * H + 3 * I + 3 * H)
    assert fused.bytes == 2 * 64 * L * (8 * H + 3 * I)
    assert unfused.seconds() > fused.seconds()


def test_breakdown_names_and_host_overhead(llama):
    cost = llama.step(StepShape(prefills=[(100, 0)], decodes=[50]))
    assert set(cost.breakdown) <= set(OPERATOR_NAMES)
    assert cost.breakdown["host"] == HOST
    assert CostModel(SPEC, get_profile("llama2-7b"), host_overhead_s=0).step(StepShape(decodes=[1])).seconds \
        == pytest.approx(llama.step(StepShape(decodes=[1])).seconds - HOST)


def test_nvidia_defaults_are_the_vidur_fit():
    a100 = get_device_spec("A100-80G").kernels
    assert (a100.gemm_eta_memory, a100.attention_decode_eta_memory, a100.gemm_tile_m) == (0.92, 0.89, 64)
    assert not a100.fused_elementwise and SPEC.kernels.fused_elementwise


def test_bad_efficiency_is_rejected():
    with pytest.raises(ValueError, match="gemm_eta_memory"):
        CostModel(SPEC, get_profile("llama2-7b"), eta_memory=1.5)


def test_a_gemm_runs_on_the_fastest_of_the_librarys_kernels():
    """H100 has kernels of 64, 128 and 256 token rows per tile (fitted efficiencies): each GEMM's
    compute time is the smallest of the tile-quantized times, and its floor (every row at the best
    kernel's rate, no tile wasted) never exceeds it — what benchmarks/bounds.py relies on."""
    spec = get_device_spec("H100-SXM")
    model = CostModel(spec, get_profile("llama2-7b"), dtype="fp16")
    kp, peak = spec.kernels, spec.peak_flops["fp16"]
    kernels = [(kp.gemm_tile_m, kp.gemm_eta_compute), *kp.gemm_extra_tiles]
    assert [tile for tile, _ in kernels] == [64, 128, 256]
    for rows in (1, 100, 448, 512, 544, 2048):
        op = model.operators(StepShape(prefills=[(rows, 0)]))["mlp_down"]
        weights = op.flops / (2 * rows)
        by_hand = min(2 * -(-rows // tile) * tile * weights / (eta * peak) for tile, eta in kernels)
        assert op.compute_s == pytest.approx(by_hand, rel=1e-9), rows
        assert op.compute_floor_s <= op.compute_s
    at = lambda rows: model.operators(StepShape(prefills=[(rows, 0)]))["mlp_down"].compute_s  # noqa: E731
    assert at(512) / 512 < at(448) / 448 and at(544) > at(512)    # whole 256-row tiles, then one more
    assert CostModel(SPEC, get_profile("llama2-7b")).operators(StepShape(decodes=[1]))["mlp_down"].compute_floor_s \
        is None                                                   # one kernel (Ascend): no floor needed
