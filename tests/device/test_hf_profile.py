import json

import pytest

from mindmotor.device.hf_profile import profile_from_hf_config, resolve_profile
from mindmotor.device.profiles import get_profile

QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
            "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_qwen2_config_gives_the_named_profile(tmp_path):
    got = profile_from_hf_config(write(tmp_path, QWEN2_7B), tp=4)
    want = get_profile("qwen2-7b", tp=4)
    for field in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads",
                  "head_dim", "vocab_size", "dtype_bytes", "tp", "tied_embeddings"):
        assert getattr(got, field) == getattr(want, field), field
    assert got.weight_bytes == want.weight_bytes and got.kv_bytes_per_token == want.kv_bytes_per_token


def test_directory_explicit_head_dim_and_defaults(tmp_path):
    # Qwen3-style: head_dim given and not hidden / heads; no kv heads -> MHA; fp32 -> 4 bytes.
    cfg = {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
           "num_hidden_layers": 4, "vocab_size": 1000, "head_dim": 128, "torch_dtype": "float32",
           "tie_word_embeddings": True}
    write(tmp_path, cfg)
    p = profile_from_hf_config(tmp_path)
    assert (p.head_dim, p.num_kv_heads, p.dtype_bytes, p.tied_embeddings) == (128, 16, 4, True)
    assert p.name == tmp_path.name


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"hidden_size": "big"}, "positive integer"),
    ({"num_local_experts": 8}, "mixture-of-experts"),
    ({"torch_dtype": "int3"}, "torch_dtype"),
])
def test_bad_configs_say_what_is_wrong(tmp_path, change, message):
    cfg = {k: v for k, v in {**QWEN2_7B, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        profile_from_hf_config(write(tmp_path, cfg))


def test_unreadable_and_unknown(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        profile_from_hf_config(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="not JSON"):
        bad = tmp_path / "x.json"
        bad.write_text("{")
        profile_from_hf_config(bad)
    with pytest.raises(ValueError, match="neither a profile"):
        resolve_profile("no-such-model")
    assert resolve_profile("LLAMA2-7B", tp=2).tp == 2


def test_an_engine_emulates_the_model_of_a_config_json(tmp_path):
    """`--emulate path/to/config.json` (EngineConfig.emulate): the card is sized and priced for it."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.common import benchmark_checkpoint
    from mindmotor.engine.config import EngineConfig
    from mindmotor.engine.llm_engine import LLMEngine

    config = write(tmp_path, QWEN2_7B)
    engine = LLMEngine(EngineConfig(model=benchmark_checkpoint(None, 0), emulate=str(config), tensor_parallel=2))
    named = LLMEngine(EngineConfig(model=benchmark_checkpoint(None, 0), emulate="qwen2-7b", tensor_parallel=2))
    assert engine.device.profile.kv_bytes_per_token == named.device.profile.kv_bytes_per_token
    assert engine.device.kv_plan.num_blocks == named.device.kv_plan.num_blocks
    with pytest.raises(ValueError, match="neither a profile"):
        LLMEngine(EngineConfig(model=benchmark_checkpoint(None, 0), emulate="qwen9-1t"))
