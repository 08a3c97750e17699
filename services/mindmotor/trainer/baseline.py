"""How good is a checkpoint? Its validation loss next to a unigram model's on the same split.

The corpus is rebuilt exactly as training built it (same documents, the checkpoint's own
tokenizer, the same packing and train/validation split), the unigram model is fitted to the
training targets (add-one smoothing), and both are scored on every validation target, in nats per
token. The checkpoint is scored by the serving numpy model, so this also checks what is served.
No PyTorch needed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mindmotor.common.tokenizer import Tokenizer
from mindmotor.model.llama import LlamaModel
from mindmotor.engine.sampler import log_softmax

from .corpus import read_documents
from .data import pack, token_stream
from mindmotor.model.manifest import read_manifest


@dataclass
class QualityReport:
    val_sequences: int
    val_tokens: int
    unigram_val_loss: float
    model_val_loss: float

    @property
    def unigram_perplexity(self) -> float:
        return math.exp(self.unigram_val_loss)

    @property
    def model_perplexity(self) -> float:
        return math.exp(self.model_val_loss)

    def to_dict(self) -> dict:
        return {**asdict(self), "unigram_perplexity": round(self.unigram_perplexity, 2),
                "model_perplexity": round(self.model_perplexity, 2)}


def unigram_loss(train_targets: np.ndarray, val_targets: np.ndarray, vocab_size: int) -> float:
    counts = np.bincount(train_targets.ravel(), minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(-log_p[val_targets.ravel()].mean())


def model_loss(model: LlamaModel, val: np.ndarray, max_sequences: int | None = None) -> float:
    """Mean next-token loss of `model` over val blocks [n, seq_len + 1]."""
    total, count = 0.0, 0
    for block in val[:max_sequences]:
        logits = model.forward_dense(block[:-1])                   # [seq_len, vocab]
        lp = log_softmax(logits.astype(np.float64))
        total -= lp[np.arange(len(block) - 1), block[1:]].sum()
        count += len(block) - 1
    return total / count


def evaluate_checkpoint(checkpoint: str | Path, max_sequences: int | None = None) -> QualityReport:
    """Corpus, sequence length and split are those the checkpoint's manifest records."""
    trained_with = read_manifest(checkpoint)["train_config"]
    corpus, seq_len = tuple(trained_with["corpus"]), trained_with["seq_len"]
    val_fraction = trained_with["val_fraction"]
    tokenizer = Tokenizer.from_dir(checkpoint)
    documents = read_documents(corpus, trained_with.get("max_corpus_bytes", 0))   # as training cut it
    data = pack(token_stream(tokenizer.hf, documents), seq_len, val_fraction)
    model = LlamaModel.from_pretrained(checkpoint)
    val = data.val[:max_sequences]
    return QualityReport(
        val_sequences=len(val), val_tokens=int(val[:, 1:].size),
        unigram_val_loss=round(unigram_loss(data.train[:, 1:], val[:, 1:], model.config.vocab_size), 4),
        model_val_loss=round(model_loss(model, val), 4))
