"""`mindmotor train --lora-rank`: a LoRA adapter trained on a checkpoint's frozen weights, written as a
PEFT adapter directory that `peft.PeftModel.from_pretrained` loads and the engine serves with the
same greedy tokens."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

from mindmotor.trainer.testing import PYTHON

NEW_TOKENS = 8


def train_lora(out, corpus, *args):
    command = [PYTHON, "-m", "mindmotor.cli", "train", "--preset", "tiny", "--out", str(out), "--corpus",
               str(corpus), "--steps", "3", "--set", "checkpoint_interval=3", "--set", "eval_interval=3",
               "--set", "warmup_steps=0", "--set", "lr=0.01", "--no-progress", "--run-name", "ad", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_a_trained_adapter_loads_in_peft_and_serves_the_same_tokens(trained, corpus_dir, tmp_path):
    import peft
    import torch
    import transformers

    from mindmotor import LLM, SamplingParams

    from mindmotor.cli import build_parser
    from mindmotor.trainer.cli import train_overrides
    from mindmotor.trainer.loop import RunOptions, train
    from mindmotor.trainer.validate import validated_config

    store, result = trained
    base = str(store / result.checkpoints[-1])
    # the command line `mindmotor train` parses, run in this process (no second torch import: seconds)
    args = build_parser().parse_args(
        ["train", "--preset", "tiny", "--corpus", str(corpus_dir), "--steps", "3", "--set", "checkpoint_interval=3",
         "--set", "eval_interval=3", "--set", "warmup_steps=0", "--set", "lr=0.01", "--init-from", base,
         "--lora-rank", "8", "--lora-alpha", "16", "--lora-target-modules", "q_proj", "v_proj", "o_proj", "down_proj"])
    config = validated_config(args.preset, train_overrides(args), 1, tmp_path / "adapters", init_from=base)
    train(config, tmp_path / "adapters", RunOptions(run_name="ad", init_from=base, tokenizer_from=base,
                                                    show_progress=False))
    adapter = tmp_path / "adapters" / "ad-step000003"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["target_modules"] == ["down_proj", "o_proj", "q_proj", "v_proj"]
    tensors = load_file(adapter / "adapter_model.safetensors")
    assert len(tensors) == 2 * 4 * 2                                   # A and B, 4 modules, 2 layers
    assert all(np.abs(t).max() > 0 for k, t in tensors.items() if "lora_B" in k)   # B trained away from 0

    torch.set_num_threads(1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(base).float().eval()
    model = peft.PeftModel.from_pretrained(hf, adapter).eval()
    prompt = list(range(5, 30))
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                  eos_token_id=None, pad_token_id=0,
                                  attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):].tolist()
        base_tokens = model.get_base_model()  # (the adapter is active on it: compare via disable_adapter)
        with model.disable_adapter():
            plain = base_tokens.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                         eos_token_id=None, pad_token_id=0,
                                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):].tolist()
    llm = LLM(str(base), block_size=4, num_blocks=64, enable_lora=True)
    llm.add_lora("mine", str(adapter))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    outs = llm.generate([prompt, prompt], params, lora=["mine", None])
    assert [o.token_ids for o in outs] == [expected, plain]


def test_a_lora_run_without_a_base_is_refused_before_any_work(corpus_dir, tmp_path):
    done = train_lora(tmp_path / "adapters", corpus_dir, "--lora-rank", "8")
    assert done.returncode != 0 and "--init-from" in done.stderr


def test_lora_targets_the_model_does_not_have_are_refused(trained, corpus_dir, tmp_path):
    from mindmotor.trainer.config import ConfigError
    from mindmotor.trainer.validate import validated_config

    store, result = trained
    base = str(store / result.checkpoints[-1])
    overrides = {"corpus": [str(corpus_dir)], "lora_rank": 8, "lora_target_modules": ["lm_head"]}
    with pytest.raises(ConfigError, match="lora_target_modules"):
        validated_config("tiny", overrides, 1, tmp_path, init_from=base)
    with pytest.raises(ConfigError, match="no --resume"):
        validated_config("tiny", {**overrides, "lora_target_modules": ["q_proj"]}, 1, tmp_path, resume="latest",
                         init_from=base)
