"""The bundled demo model: trained by our trainer, verified on load, served by default, and
clearly better than a unigram model on the validation split it was trained with."""

from __future__ import annotations

import ast
import json

from mindmotor import LLM, SamplingParams
from mindmotor.model.checkpoint import BUNDLED_MODEL_DIR, resolve_model_dir
from mindmotor.model.config import LlamaConfig
from mindmotor.model.manifest import verify_checkpoint


def test_bundled_checkpoint_is_complete_and_verified():
    manifest = verify_checkpoint(BUNDLED_MODEL_DIR)
    assert resolve_model_dir(None) == BUNDLED_MODEL_DIR
    config = LlamaConfig.from_dir(BUNDLED_MODEL_DIR)
    assert config.hidden_size == 256 and 4 <= config.num_hidden_layers <= 6
    assert 4096 <= config.vocab_size <= 8192 and config.max_position_embeddings >= 4096
    assert sum((BUNDLED_MODEL_DIR / f).stat().st_size for f in manifest["files"]) < 16 * 2**20
    assert manifest["val_loss"] < 4.0 and manifest["train_config"]["corpus"] == []


def test_llm_with_no_model_serves_it_and_writes_python():
    llm = LLM()
    out = llm.generate(["def fibonacci(n):"], SamplingParams(max_tokens=48, temperature=0))[0]
    text = "def fibonacci(n):" + out.text
    assert "\n    " in text                                  # an indented body
    lines = text.splitlines()
    # the first complete lines parse as Python (the cut at max_tokens may fall mid-statement)
    assert any(_parses("\n".join(lines[:k]) + "\n        pass") or _parses("\n".join(lines[:k]))
               for k in range(2, len(lines)))


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
        return True
    except SyntaxError:
        return False


def test_validation_loss_is_far_below_a_unigram_model():
    from mindmotor.trainer.baseline import evaluate_checkpoint

    report = evaluate_checkpoint(BUNDLED_MODEL_DIR, max_sequences=4)
    assert report.model_val_loss < report.unigram_val_loss - 2.0, json.dumps(report.to_dict())
