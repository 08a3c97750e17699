import pytest

from mindmotor.device.profiles import PROFILES, ModelProfile, get_profile


def test_llama2_7b_weights_about_13_5_gb():
    profile = get_profile("llama2-7b")
    assert profile.num_parameters == pytest.approx(6.74e9, rel=0.02)
    assert profile.weight_bytes == pytest.approx(13.5e9, rel=0.02)


def test_qwen2_7b_kv_bytes_per_token():
    assert get_profile("qwen2-7b").kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344


def test_tp_shards_heads_mlp_and_vocab():
    full, tp8 = get_profile("llama3-70b"), get_profile("llama3-70b", tp=8)
    assert tp8.heads_per_device == 8 and tp8.kv_heads_per_device == 1
    assert tp8.num_parameters == full.num_parameters            # the model does not change
    assert tp8.weight_bytes == pytest.approx(full.weight_bytes / 8, rel=0.01)
    assert tp8.kv_bytes_per_token == full.kv_bytes_per_token // 8


def test_kv_heads_replicated_beyond_their_count():
    profile = get_profile("qwen2-7b", tp=7)                     # 28 heads / 7, only 4 kv heads
    assert profile.kv_heads_per_device == 1
    assert profile.kv_bytes_per_token == 2 * 28 * 1 * 128 * 2


def test_tied_embeddings_count_once():
    shape = dict(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4,
                 num_kv_heads=2, head_dim=16, vocab_size=1000)
    tied = ModelProfile.from_model_shape("tiny", tied_embeddings=True, **shape)
    untied = ModelProfile.from_model_shape("tiny", tied_embeddings=False, **shape)
    assert untied.num_parameters - tied.num_parameters == 1000 * 64
    layer = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64 + 3 * 64 * 128 + 2 * 64
    assert tied.num_parameters == 2 * layer + 1000 * 64 + 64


def test_unknown_profile_and_bad_tp():
    with pytest.raises(ValueError, match="qwen2-7b"):
        get_profile("gpt-5")
    with pytest.raises(ValueError):
        get_profile("qwen2-7b", tp=3)                          # 28 heads do not split in 3
    assert set(PROFILES) >= {"qwen2-7b", "llama2-7b", "llama3-70b"}
