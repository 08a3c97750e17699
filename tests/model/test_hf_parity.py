"""Parity with Hugging Face transformers on checkpoints transformers writes itself.

Every supported architecture and RoPE variant: a tiny random model built by transformers, saved with
its own `save_pretrained` (the layout a user gets today), then
- greedy outputs equal token for token: transformers' `generate` on each prompt alone against our
  engine serving all prompts together — paged, batched, chunked (a small token budget) and preempting
  (a KV pool too small for every sequence at once);
- logits within tolerance against transformers' forward.
Plus the old config layout (top-level rope_theta / rope_scaling) and refusals of what is not
implemented.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from mindmotor import LLM, SamplingParams
from mindmotor.common.tokenizer import save_tokenizer
from mindmotor.engine.block_manager import NO_BLOCK
from mindmotor.model.config import CheckpointError, LlamaConfig
from mindmotor.model.llama import LlamaModel
from mindmotor.model.rope import RopeSpec
from mindmotor.model.testing import tiny_tokenizer

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.25,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 64}
CASES = {
    "llama-theta1e6": ("LlamaForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "llama-linear": ("LlamaForCausalLM", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4,
                                                              "factor": 4.0}}),
    "llama-dynamic": ("LlamaForCausalLM", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4,
                                                               "factor": 2.0}}),
    "llama3": ("LlamaForCausalLM", {"rope_parameters": LLAMA3}),
    "llama-yarn": ("LlamaForCausalLM", {"rope_parameters": YARN}),
    "llama-bias": ("LlamaForCausalLM", {"attention_bias": True}),
    "qwen2-tied": ("Qwen2ForCausalLM", {"tie_word_embeddings": True,
                                        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "qwen2-sliding": ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 6,
                                           "max_window_layers": 1}),
    "qwen3": ("Qwen3ForCausalLM", {"head_dim": 32, "tie_word_embeddings": True,
                                   "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "qwen3-yarn": ("Qwen3ForCausalLM", {"head_dim": 24, "rope_parameters": dict(YARN, rope_theta=1e6)}),
    "mistral": ("MistralForCausalLM", {"sliding_window": 7, "head_dim": 32}),
    "phi3-partial-rotary": ("Phi3ForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                    "partial_rotary_factor": 0.5}}),
    "phi3-sliding": ("Phi3ForCausalLM", {"sliding_window": 9}),
    "gemma": ("GemmaForCausalLM", {"head_dim": 32, "num_key_value_heads": 1}),
    "llama-gelu": ("LlamaForCausalLM", {"hidden_act": "gelu"}),
}
NEW_TOKENS = 14


def write_hf_checkpoint(directory, arch: str, options: dict, seed: int = 0):
    """transformers' own random model of `arch`, saved by `save_pretrained`, with our tokenizer."""
    tok = tiny_tokenizer(384)
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    config = config_cls(vocab_size=tok.get_vocab_size(), **{**SHAPE, **options})
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).float().eval()
    with torch.no_grad():                 # norms away from 1 so that they are really checked
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(directory)
    save_tokenizer(tok, directory, model_max_length=SHAPE["max_position_embeddings"])
    return model


def prompts(vocab: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(3, vocab, n))) for n in (5, 23, 11, 37)]


def hf_greedy(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt),
                                                                                          dtype=torch.long))
    return out[0, len(prompt):].tolist()


def engine_greedy(directory, all_prompts: list[list[int]], num_blocks: int = 22):
    """All prompts at once through a small pool: chunked prefill and preemption both happen.
    Every step checks the block manager's invariants and records the blocks each sequence holds."""
    llm = LLM(str(directory), block_size=4, num_blocks=num_blocks, max_num_batched_tokens=16,
              max_num_seqs=4)
    engine = llm.engine
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    for i, p in enumerate(all_prompts):
        engine.add_request(f"r{i}", p, params)
    tokens = {f"r{i}": [] for i in range(len(all_prompts))}
    most_held = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
        engine.check_invariants()
        most_held = max([most_held] + [sum(b != NO_BLOCK for b in s.block_table)
                                       for s in engine.scheduler.running])
    return [tokens[f"r{i}"] for i in range(len(all_prompts))], engine, most_held


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    arch, options = CASES[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    model = write_hf_checkpoint(directory, arch, options)
    return request.param, directory, model


def test_config_is_read_as_transformers_reads_it(case):
    name, directory, model = case
    saved = json.loads((directory / "config.json").read_text())
    assert "rope_parameters" in saved and "rope_theta" not in saved   # transformers 5's layout
    config = LlamaConfig.from_dir(directory)
    hf = model.config
    assert config.architecture == hf.architectures[0]
    assert config.rope.theta == hf.rope_parameters["rope_theta"]
    assert config.rope.rope_type == hf.rope_parameters["rope_type"]
    assert config.head_dim == getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    for i in range(config.num_hidden_layers):
        hf_window = getattr(hf, "sliding_window", None)
        if hasattr(hf, "layer_types") and hf.layer_types[i] != "sliding_attention":
            hf_window = None
        assert config.layer_window(i) == hf_window


def test_logits_match_transformers_forward(case):
    name, directory, model = case
    ours = LlamaModel.from_pretrained(directory)
    ids = prompts(ours.config.vocab_size)[3]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    got = ours.forward_dense(ids)
    assert np.abs(expected).max() > 1.0                 # logits with a real spread, not noise
    np.testing.assert_allclose(got, expected, atol=2e-4 * np.abs(expected).max(), rtol=1e-4)


def test_greedy_tokens_equal_through_the_preempting_engine(case):
    name, directory, model = case
    all_prompts = prompts(model.config.vocab_size)
    expected = [hf_greedy(model, p) for p in all_prompts]
    window = LlamaConfig.from_dir(directory).max_window
    # With a window on every layer the blocks that leave it are released, so a smaller pool
    # is needed to force preemptions.
    got, engine, most_held = engine_greedy(directory, all_prompts, num_blocks=22 if window is None else 13)
    assert engine.block_manager.num_blocks * 4 < sum(len(p) + NEW_TOKENS for p in all_prompts)
    assert engine.scheduler.num_preemptions > 0
    assert got == expected
    longest = max(len(p) for p in all_prompts) + NEW_TOKENS
    if window is None:
        assert most_held == -(-longest // 4)
    else:     # the window (+ a partial block at each end) and the step's chunk, not the sequence
        assert most_held <= -(-(window + 16) // 4) + 1 < -(-longest // 4)


def test_phi3_official_config_keys_are_understood(tmp_path):
    """The keys of microsoft/Phi-3-mini-4k-instruct's config.json (auto_map naming its own copy of
    the code transformers ships, dropouts, attention_bias false, original_max_position_embeddings)."""
    model = write_hf_checkpoint(tmp_path, "Phi3ForCausalLM", {"sliding_window": 9})
    config = json.loads((tmp_path / "config.json").read_text())
    config.update({"auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                                "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
                   "attention_bias": False, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
                   "original_max_position_embeddings": 4096, "_name_or_path": "Phi-3-mini-4k-instruct"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    ids = prompts(model.config.vocab_size)[2]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(LlamaModel.from_pretrained(tmp_path).forward_dense(ids), expected,
                               atol=2e-4 * np.abs(expected).max(), rtol=1e-4)


def test_old_layout_top_level_rope_theta_and_scaling(case, tmp_path):
    """The same checkpoint with rope_theta / rope_scaling at the top (transformers 4's layout)."""
    name, directory, model = case
    config = json.loads((directory / "config.json").read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = None if params == {"rope_type": "default"} else params
    old = tmp_path / "old"
    old.mkdir()
    for f in directory.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    (old / "config.json").write_text(json.dumps(config))
    ids = prompts(model.config.vocab_size)[1]
    np.testing.assert_array_equal(LlamaModel.from_pretrained(old).forward_dense(ids),
                                  LlamaModel.from_pretrained(directory).forward_dense(ids))
    with torch.no_grad():   # and transformers reads it the same way
        reloaded = type(model).from_pretrained(old).float().eval()
        np.testing.assert_allclose(reloaded(torch.tensor([ids])).logits[0].numpy(),
                                   model(torch.tensor([ids])).logits[0].numpy(), atol=1e-5)


ROPE_CASES = [
    {"rope_type": "default", "rope_theta": 1e6},
    {"rope_type": "linear", "rope_theta": 1e4, "factor": 3.0},
    LLAMA3,
    YARN,
    dict(YARN, beta_fast=16, beta_slow=2, truncate=False),
    dict(YARN, mscale=1.2, mscale_all_dim=0.8),
    dict(YARN, attention_factor=1.3),
    {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
    {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    dict(LLAMA3, partial_rotary_factor=0.75),
]


@pytest.mark.parametrize("params", ROPE_CASES, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()
                                                                       if k != "rope_theta"))
@pytest.mark.parametrize("seq_len", [None, 700])
def test_rope_frequencies_equal_transformers(params, seq_len):
    """inv_freq and the attention scaling of every variant, as transformers computes them (dynamic
    also past max_position_embeddings)."""
    config_cls = transformers.Phi3Config if params["rope_type"] == "default" else transformers.LlamaConfig
    hf = config_cls(hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=256,
                    rope_parameters=dict(params))
    init = ROPE_INIT_FUNCTIONS.get(params["rope_type"])
    if params["rope_type"] == "default":   # (Phi-3's default honours partial_rotary_factor)
        from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
        init = Phi3RotaryEmbedding.compute_default_rope_parameters
    hf_inv, hf_scale = init(config=hf, device="cpu", seq_len=seq_len)
    spec = RopeSpec.from_parameters(dict(params), max_position_embeddings=256)
    dim = spec.rotary_dim(32)
    if params["rope_type"] == "dynamic" and seq_len:
        inv, scale = spec.dynamic_inv_freq(dim, seq_len, 256), 1.0
    else:
        inv, scale = spec.inv_freq(dim, 256)
    np.testing.assert_allclose(inv, hf_inv.numpy(), rtol=1e-5)
    assert scale == pytest.approx(float(hf_scale), rel=1e-6)


# ---- refusals -------------------------------------------------------------------------------
def _refused(tmp_path, tiny_ckpt, **changes):
    d = tmp_path / "m"
    d.mkdir()
    for f in tiny_ckpt.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    config = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            config.pop(k, None)
        else:
            config[k] = v
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as info:
        LlamaModel.from_pretrained(d)
    return str(info.value)


@pytest.mark.parametrize("changes, named", [
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0],
                          "long_factor": [1.0], "original_max_position_embeddings": 64}}, "longrope"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 8}}, "beta_fast"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"auto_map": {"AutoModelForCausalLM": "modeling.MyModel"}}, "auto_map"),
    ({"auto_map": {"AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"}}, "auto_map"),  # not a Llama's
    ({"some_new_field": 1}, "some_new_field"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "mlp_bias": None, "hidden_act": "gelu",
      "hidden_activation": "gelu_pytorch_tanh"}, "disagree"),
    ({"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "mlp_bias": None,
      "use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}, "rope_theta": 5e5},
     "disagree"),
    ({"sliding_window": 16}, "sliding_window"),        # a Llama has none: not silently dropped
    ({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "mlp_bias": None, "attention_bias": None,
      "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8,
                       "original_max_position_embeddings": 64}}, "longrope"),
])
def test_unsupported_field_is_refused_by_name(tmp_path, tiny_ckpt, changes, named):
    assert named in _refused(tmp_path, tiny_ckpt, **changes)


# ---- the emulated profile follows the architecture -------------------------------------------
def test_served_profile_counts_the_parameters_transformers_has(case):
    from mindmotor.engine.llm_engine import served_model_profile

    name, directory, model = case
    config = LlamaConfig.from_dir(directory)
    profile = served_model_profile(config, name)
    assert profile.architecture == model.config.architectures[0]
    assert profile.num_parameters == sum(p.numel() for p in model.parameters())
    assert profile.num_sliding_layers == sum(config.layer_window(i) is not None
                                             for i in range(config.num_hidden_layers))


def test_sliding_window_caps_the_emulated_attention_cost():
    from mindmotor.device.cost_model import CostModel, StepShape
    from mindmotor.device.profiles import ModelProfile
    from mindmotor.device.specs import get_device_spec

    shape = dict(num_layers=32, hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8,
                 head_dim=128, vocab_size=32000, tied_embeddings=False)
    full = ModelProfile.from_model_shape("full", **shape)
    windowed = ModelProfile.from_model_shape("mistral", **shape, sliding_window=4096,
                                             num_sliding_layers=32)
    spec = get_device_spec("910B3")
    long = StepShape(prefills=[(512, 16000)], decodes=[30000] * 8)
    at_window = StepShape(prefills=[(512, 4096)], decodes=[4096] * 8)
    full_ops, win_ops = CostModel(spec, full).operators(long), CostModel(spec, windowed).operators(long)
    assert win_ops["attention_decode"].flops == CostModel(spec, full).operators(
        StepShape(decodes=[4096] * 8))["attention_decode"].flops
    assert win_ops["attention_decode"].bytes < full_ops["attention_decode"].bytes / 7
    assert win_ops["attention_prefill"].flops < full_ops["attention_prefill"].flops / 3
    # while the window does not bind, the cost is unchanged
    assert CostModel(spec, windowed).step(StepShape(prefills=[(512, 1000)], decodes=[3000])).seconds == \
        CostModel(spec, full).step(StepShape(prefills=[(512, 1000)], decodes=[3000])).seconds
    assert CostModel(spec, windowed).step(at_window).seconds <= CostModel(spec, full).step(at_window).seconds


def test_debug_compare_refuses_what_the_training_model_does_not_implement(case):
    """`mindmotor debug compare` runs the PyTorch training model (Llama/Qwen2, default RoPE): on
    anything else it says so instead of reporting a difference that is not the serving model's."""
    from mindmotor.trainer.compare import load_torch_model

    name, directory, model = case
    config = LlamaConfig.from_dir(directory)
    plain = (config.architecture in ("LlamaForCausalLM", "Qwen2ForCausalLM")
             and config.rope.rope_type == "default" and config.sliding_window is None
             and not config.o_bias and config.hidden_act == "silu")
    if plain:
        load_torch_model(directory)
    else:
        with pytest.raises(CheckpointError, match="training model does not implement"):
            load_torch_model(directory)


def test_prefix_cache_hits_on_a_sliding_window_model_stay_exact(tmp_path):
    """Mistral with a window much shorter than a cached prefix: requests that reuse the cached
    blocks (the prefix is longer than the window) still produce transformers' tokens."""
    model = write_hf_checkpoint(tmp_path, "MistralForCausalLM", {"sliding_window": 5}, seed=3)
    rng = np.random.default_rng(7)
    prefix = list(map(int, rng.integers(3, model.config.vocab_size, 26)))
    requests = [prefix + list(map(int, rng.integers(3, model.config.vocab_size, n))) for n in (3, 9, 1)]
    llm = LLM(str(tmp_path), block_size=4, num_blocks=64, max_num_batched_tokens=12)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    first = llm.generate([requests[0]], params)[0]
    later = llm.generate(requests[1:], params)
    assert all(o.num_cached_tokens >= 24 for o in later)          # whole blocks of the prefix reused
    assert [o.token_ids for o in [first, *later]] == [hf_greedy(model, p) for p in requests]


@pytest.mark.parametrize("arch", sorted({a for a, _ in CASES.values()}))
def test_absent_keys_default_as_transformers_defaults_them(arch):
    """A config.json without the optional keys reads as transformers' config class reads it."""
    minimal = dict(vocab_size=384, hidden_size=1024, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=32)
    ours = LlamaConfig.from_dict({"architectures": [arch], **minimal})
    hf = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**minimal)
    assert ours.rms_norm_eps == hf.rms_norm_eps
    assert ours.max_position_embeddings == hf.max_position_embeddings
    assert ours.num_key_value_heads == hf.num_key_value_heads
    assert ours.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    assert ours.rope.theta == hf.rope_parameters["rope_theta"]
    hf_window = getattr(hf, "sliding_window", None) if arch in ("MistralForCausalLM", "Phi3ForCausalLM") \
        else None    # Qwen2/3: only with use_sliding_window
    assert ours.sliding_window == hf_window
    with_window = LlamaConfig.from_dict({"architectures": [arch], **minimal, "use_sliding_window": True,
                                         "max_window_layers": 1}) if "Qwen" in arch else None
    if with_window is not None:
        hf = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**minimal, use_sliding_window=True,
                                                                           max_window_layers=1)
        assert with_window.sliding_window == hf.sliding_window
        assert list(with_window.layer_types) == hf.layer_types


def test_trainer_init_from_refuses_what_it_would_train_differently(case):
    from mindmotor.trainer.config import ConfigError
    from mindmotor.trainer.init_from import beyond_training_model, init_source

    name, directory, model = case
    config = LlamaConfig.from_dir(directory)
    if beyond_training_model(config) is None:
        if config.head_dim * config.num_attention_heads == config.hidden_size:
            assert init_source(directory).model_config == config
    else:
        with pytest.raises(ConfigError, match="trainer's model does not implement"):
            init_source(directory)
