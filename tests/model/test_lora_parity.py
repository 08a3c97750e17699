"""LoRA adapters in PEFT's format: served output equal to `peft` + transformers, and every adapter
that cannot be served refused at load with its reason.

The base is transformers' own tiny random Llama (saved by `save_pretrained`, as in
test_hf_parity.py); the adapters are made by `peft` itself (`get_peft_model` with random A and B,
`save_pretrained`): different ranks, targets, alphas, rsLoRA and alpha_pattern.
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import peft
import pytest
import torch
import transformers

from mindmotor import LLM, SamplingParams
from mindmotor.common.tokenizer import save_tokenizer
from mindmotor.model.lora import AdapterError, load_adapter
from mindmotor.model.llama import LlamaModel
from mindmotor.model.testing import tiny_tokenizer

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.25,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
NEW_TOKENS = 8
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]


def hf_base(directory, seed: int = 0, **shape):
    tok = tiny_tokenizer(384)
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), **{**SHAPE, **shape})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    model.save_pretrained(directory)
    save_tokenizer(tok, directory, model_max_length=SHAPE["max_position_embeddings"])
    return model


def peft_adapter(base, directory, seed: int, **options):
    """peft's LoRA on a copy of `base`, with random (not zero) B, saved by peft."""
    options = {"r": 8, "lora_alpha": 16, "target_modules": QKVO, "init_lora_weights": False, **options}
    torch.manual_seed(seed)
    model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(**options)).eval()
    model.save_pretrained(directory)
    return model


# 16 rank-8 adapters (a few of other ranks and options): targets, alphas, rsLoRA, alpha_pattern
VARIANTS = [dict(), dict(target_modules=ALL_LINEAR), dict(lora_alpha=8, use_rslora=True),
            dict(target_modules=["q_proj", "v_proj"]), dict(r=4, target_modules=["gate_proj", "down_proj"]),
            dict(alpha_pattern={"v_proj": 32}), dict(r=16, lora_alpha=32, target_modules="all-linear"),
            dict(target_modules=["o_proj", "up_proj"])]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = hf_base(root / "base")
    adapters = {}
    for i in range(16):
        name = f"ad{i}"
        adapters[name] = (root / name, peft_adapter(base, root / name, seed=100 + i, **VARIANTS[i % len(VARIANTS)]))
    return root / "base", base, adapters


def prompts(vocab: int, n: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(3, vocab, int(rng.integers(3, 30))))) for _ in range(n)]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """A tiny model's forward is all dispatch overhead: threads only contend (here 13 s → 1 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def hf_greedy(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def test_logits_of_each_adapter_match_peft(served):
    base_dir, base, adapters = served
    ours = LlamaModel.from_pretrained(base_dir)
    ids = prompts(ours.config.vocab_size, 1)[0]
    for name, (path, model) in list(adapters.items())[:len(VARIANTS)]:     # one of each variant
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0].numpy()
        got = ours.forward_dense(ids, adapter=load_adapter(path, ours.config, max_rank=16))
        np.testing.assert_allclose(got, expected, atol=2e-4 * np.abs(expected).max(), rtol=1e-4, err_msg=name)
        assert np.abs(got - ours.forward_dense(ids)).max() > 1e-2        # the adapter changes something


def test_sixteen_adapters_and_the_base_mixed_in_one_batch_equal_peft(served):
    """16 adapters and base requests submitted together through 4 device slots: every step mixes
    adapters and the base per row; slots are refilled as adapters finish."""
    base_dir, base, adapters = served
    llm = LLM(str(base_dir), block_size=4, num_blocks=256, max_num_batched_tokens=64, max_num_seqs=16,
              enable_lora=True, max_loras=4, max_cpu_loras=8)
    for name, (path, _) in adapters.items():
        llm.add_lora(name, str(path))
    names = [*adapters, None, None, None]
    all_prompts = prompts(base.config.vocab_size, len(names), seed=2)
    all_prompts[-1] = all_prompts[0]                    # the same prompt on the base and on ad0
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    outs = llm.generate(all_prompts, params, lora=names)
    expected = [hf_greedy(adapters[n][1] if n else base, p) for n, p in zip(names, all_prompts)]
    assert [o.token_ids for o in outs] == expected
    stats = llm.engine.stats().lora
    assert stats["loads"] >= 16 and stats["max_lora"] == 4
    assert outs[-1].num_cached_tokens == 0              # ad0's KV is never the base model's
    # each alone, again through the engine (slots warm, prefix cache keyed by adapter)
    for name in ("ad1", "ad6"):
        again = llm.generate([all_prompts[names.index(name)]], params, lora=name)[0]
        assert again.token_ids == expected[names.index(name)] and again.num_cached_tokens > 0


def test_a_request_whose_adapter_is_loading_does_not_block_the_others(served):
    base_dir, base, adapters = served
    llm = LLM(str(base_dir), block_size=4, num_blocks=128, max_num_batched_tokens=64, enable_lora=True,
              max_loras=1)
    llm.add_lora("a", str(adapters["ad0"][0]))
    llm.add_lora("b", str(adapters["ad1"][0]))
    engine = llm.engine
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine.add_request("a", [5, 6, 7], params, lora="a")
    engine.add_request("b", [5, 6, 7], params, lora="b")
    engine.add_request("base", [5, 6, 7], params)
    seen = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen.setdefault(out.request_id, engine.steps)
        engine.check_invariants()
    assert seen["base"] <= seen["a"] < seen["b"]          # b waited for a's slot; the base never waited
    assert engine.lora.loads == 2


# ---- refusals --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good(served, tmp_path_factory):
    return served[2]["ad0"][0]


def refused(path, base_dir, max_rank: int = 16) -> str:
    config = LlamaModel.from_pretrained(base_dir).config
    with pytest.raises(AdapterError) as info:
        load_adapter(path, config, max_rank)
    return str(info.value)


def edited(good, tmp_path, config_changes=None, tensors=None):
    d = tmp_path / "edited"
    shutil.copytree(good, d)
    if config_changes:
        cfg = json.loads((d / "adapter_config.json").read_text())
        cfg.update(config_changes)
        (d / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        from safetensors.numpy import load_file, save_file
        save_file(tensors(load_file(str(d / "adapter_model.safetensors"))), str(d / "adapter_model.safetensors"))
    return d


def test_dora_is_refused(served, tmp_path):
    base_dir, base, _ = served
    peft_adapter(base, tmp_path / "dora", seed=1, use_dora=True)
    assert "DoRA" in refused(tmp_path / "dora", base_dir)


def test_unsupported_target_is_refused(served, tmp_path):
    base_dir, base, _ = served
    peft_adapter(base, tmp_path / "head", seed=1, target_modules=["q_proj", "lm_head"])
    assert "lm_head" in refused(tmp_path / "head", base_dir)


def test_an_adapter_for_another_base_is_refused(served, tmp_path):
    base_dir, _, _ = served
    other = hf_base(tmp_path / "other", hidden_size=32, intermediate_size=64)
    peft_adapter(other, tmp_path / "other-ad", seed=1)
    assert "do not fit the base model" in refused(tmp_path / "other-ad", base_dir)


def test_rank_above_the_limit_is_refused(served):
    base_dir, _, adapters = served
    assert "above --max-lora-rank 8" in refused(adapters["ad6"][0], base_dir, max_rank=8)


@pytest.mark.parametrize("damage, reason", [
    (lambda d: (d / "adapter_model.safetensors").write_bytes(b"\x10\x00"), "too short"),
    (lambda d: (d / "adapter_model.safetensors").write_bytes(
        (d / "adapter_model.safetensors").read_bytes()[:-100]), "past the end"),
    (lambda d: (d / "adapter_model.safetensors").unlink(), "missing"),
    (lambda d: (d / "adapter_config.json").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "adapter_config.json").unlink(), "not a PEFT adapter"),
])
def test_a_corrupt_adapter_is_refused(good, served, tmp_path, damage, reason):
    d = edited(good, tmp_path)
    damage(d)
    assert reason in refused(d, served[0])


@pytest.mark.parametrize("changes, reason", [
    ({"peft_type": "IA3"}, "IA3"), ({"bias": "all"}, "bias"), ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"target_modules": ["q_proj"]}, "target_modules"), ({"r": 0}, "r must be"),
])
def test_unsupported_options_are_refused(good, served, tmp_path, changes, reason):
    assert reason in refused(edited(good, tmp_path, changes), served[0])


def test_broken_tensors_are_refused(good, served, tmp_path):
    def nan(t):
        key = next(k for k in t if k.endswith("lora_B.weight"))
        t[key] = t[key].copy()
        t[key][0, 0] = np.nan
        return t

    def half(t):
        return {k: v for k, v in t.items() if not k.endswith("layers.1.self_attn.k_proj.lora_A.weight")}

    assert "NaN" in refused(edited(good, tmp_path, tensors=nan), served[0])
    shutil.rmtree(tmp_path / "edited")
    assert "lora_A.weight missing" in refused(edited(good, tmp_path, tensors=half), served[0])
