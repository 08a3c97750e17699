"""From documents to training batches: tokenize, pack, split, sample.

- Documents are ordered by the sha256 of their text (deterministic, independent of where the
  files live), each followed by `<|endoftext|>`, and concatenated into one token stream.
- The stream is packed into blocks of `seq_len + 1` tokens with stride `seq_len` (inputs are
  `block[:-1]`, targets `block[1:]`, so every token is predicted exactly once).
- The last `val_fraction` of the blocks (at least one) are the validation set; the rest train.
- The global batch of step `s` is a pure function of (seed, s): one seeded permutation of the
  training blocks per epoch. Resuming at step `s` therefore needs no sampler state, and every
  process computes the same global batch and takes its own slice.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from mindmotor.common.tokenizer import EOS_TOKEN

from .config import ConfigError
from .corpus import Document


@dataclass(frozen=True)
class PackedData:
    train: np.ndarray   # [n_train, seq_len + 1] int64
    val: np.ndarray     # [n_val, seq_len + 1] int64


def token_stream(tokenizer: HFTokenizer, documents: list[Document], eos: int | None = None) -> np.ndarray:
    """All documents, hash-ordered, each followed by EOS (`eos`, default `<|endoftext|>`'s id):
    [num_tokens] int64."""
    ordered = sorted(documents, key=lambda d: hashlib.sha256(d.text.encode()).hexdigest())
    eos = tokenizer.token_to_id(EOS_TOKEN) if eos is None else eos
    if eos is None:
        raise ConfigError(f"the tokenizer has no {EOS_TOKEN} token and its tokenizer_config.json names no "
                          "eos_token: documents cannot be separated")
    encodings = tokenizer.encode_batch([d.text for d in ordered], add_special_tokens=False)
    pieces = [np.array(e.ids + [eos], dtype=np.int64) for e in encodings]
    return np.concatenate(pieces)


def pack(stream: np.ndarray, seq_len: int, val_fraction: float) -> PackedData:
    n_blocks = (len(stream) - 1) // seq_len
    if n_blocks < 2:
        raise ConfigError(
            f"corpus too small: {len(stream)} tokens give {n_blocks} sequence(s) of seq_len "
            f"{seq_len}; at least 2 are needed (one to train, one to validate)")
    starts = np.arange(n_blocks) * seq_len
    blocks = stream[starts[:, None] + np.arange(seq_len + 1)]   # [n_blocks, seq_len + 1]
    n_val = min(max(1, round(val_fraction * n_blocks)), n_blocks - 1)
    return PackedData(train=blocks[:n_blocks - n_val], val=blocks[n_blocks - n_val:])


@lru_cache(maxsize=8)
def _epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def global_batch_indices(step: int, batch_size: int, n_train: int, seed: int) -> np.ndarray:
    """Indices into the training blocks for optimizer step `step` (0-based): [batch_size]."""
    positions = np.arange(step * batch_size, (step + 1) * batch_size)
    epochs, offsets = np.divmod(positions, n_train)
    return np.array([_epoch_permutation(seed, int(e), n_train)[o] for e, o in zip(epochs, offsets)])


def micro_batches(blocks: np.ndarray, indices: np.ndarray, rank: int, world_size: int,
                  micro_batch_size: int) -> list[np.ndarray]:
    """This process's slice of a global batch, cut into micro-batches of [mb, seq_len + 1]."""
    share = len(indices) // world_size
    mine = indices[rank * share:(rank + 1) * share]
    return [blocks[mine[i:i + micro_batch_size]] for i in range(0, share, micro_batch_size)]


def eval_shard(val: np.ndarray, eval_sequences: int, rank: int, world_size: int) -> np.ndarray:
    """The fixed validation set (its first `eval_sequences` blocks), dealt round-robin to the
    processes, so the validation loss does not depend on the number of processes."""
    return val[:eval_sequences][rank::world_size]
