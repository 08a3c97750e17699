"""Fixtures shared across the suite: small real checkpoints written once per session."""

from __future__ import annotations

import pytest

from mindmotor.model.testing import write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A 2-layer GQA Llama with random weights and a trained 384-token BPE tokenizer."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_qwen2_ckpt(tmp_path_factory):
    """The same shape as Qwen2: q/k/v bias, tied embeddings."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"), architecture="Qwen2ForCausalLM",
                                 attention_bias=True, tie_word_embeddings=True, seed=1)
