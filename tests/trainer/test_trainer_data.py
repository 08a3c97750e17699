"""Corpus discovery, packing, the deterministic split and batch sampling; the LR schedule."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor.common.tokenizer import EOS_TOKEN, train_bpe
from mindmotor.trainer.config import ConfigError
from mindmotor.trainer.corpus import corpus_digest, read_documents, stdlib_sources
from mindmotor.trainer.data import (eval_shard, global_batch_indices, micro_batches, pack,
                                    token_stream)
from mindmotor.trainer.schedule import lr_at


def test_default_corpus_is_the_stdlib_sources_without_test_suites():
    files = stdlib_sources()
    assert {"textwrap.py", "decoder.py"} <= {f.name for f in files}
    assert not any("test" in f.parts or "site-packages" in f.parts for f in files)


def test_packing_split_and_stream_are_deterministic(corpus_dir):
    docs = read_documents([str(corpus_dir)])
    tok = train_bpe((d.text for d in docs), vocab_size=384)
    stream = token_stream(tok, docs)
    assert (stream == tok.token_to_id(EOS_TOKEN)).sum() == len(docs)
    # the order of documents does not matter: they are sorted by content hash
    assert np.array_equal(stream, token_stream(tok, list(reversed(docs))))
    data = pack(stream, seq_len=64, val_fraction=0.1)
    n = len(data.train) + len(data.val)
    assert data.train.shape[1] == 65 and len(data.val) == round(0.1 * n)
    assert np.array_equal(data.train[1][0], data.train[0][-1])   # stride seq_len: targets chain
    assert corpus_digest(docs) == corpus_digest(read_documents([str(corpus_dir)]))


def test_a_corpus_too_small_for_two_sequences_is_refused():
    with pytest.raises(ConfigError, match="corpus too small"):
        pack(np.arange(50), seq_len=64, val_fraction=0.1)


def test_global_batches_depend_only_on_seed_and_step_and_cover_each_epoch():
    n = 10
    a = [global_batch_indices(s, 4, n, seed=1) for s in range(5)]
    b = [global_batch_indices(s, 4, n, seed=1) for s in range(5)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    first_epoch = np.concatenate(a)[:n]
    assert sorted(first_epoch.tolist()) == list(range(n))
    assert not np.array_equal(a[0], global_batch_indices(0, 4, n, seed=2))


def test_processes_split_the_same_global_batch():
    blocks = np.arange(40).reshape(20, 2)
    indices = global_batch_indices(3, 8, 20, seed=0)
    one = np.concatenate(micro_batches(blocks, indices, 0, 1, 2))
    two = np.concatenate([np.concatenate(micro_batches(blocks, indices, r, 2, 2)) for r in (0, 1)])
    assert np.array_equal(one, two) and len(one) == 8
    val = np.arange(10)[:, None]
    shards = [eval_shard(val, 6, r, 2) for r in (0, 1)]
    assert sorted(np.concatenate(shards).ravel().tolist()) == list(range(6))


def test_warmup_then_cosine_to_min_lr():
    lrs = [lr_at(s, 1.0, 0.1, 10, 110) for s in range(110)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55)
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
