"""Fixtures for the trainer tests: a small corpus (a few stdlib modules) and one trained
checkpoint store. Helpers live in
`mindmotor.trainer.testing`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mindmotor.trainer.testing import tiny_overrides, write_corpus


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def trained(tmp_path_factory, corpus_dir):
    """One tiny run of 8 steps, checkpoints at 4 and 8: (store path, TrainResult)."""
    import torch

    from mindmotor.trainer.config import load_config
    from mindmotor.trainer.loop import RunOptions, train

    torch.set_num_threads(1)   # tiny models: threads cost more than they give on a busy machine
    store = tmp_path_factory.mktemp("store")
    config = load_config("tiny", tiny_overrides(corpus_dir))
    result = train(config, store, RunOptions(run_name="base", show_progress=False))
    return store, result


@pytest.fixture
def checkpoint_copy(trained, tmp_path) -> Path:
    """A private copy of the final checkpoint, free to be damaged."""
    store, result = trained
    copy = tmp_path / result.checkpoints[-1]
    shutil.copytree(store / result.checkpoints[-1], copy)
    return copy
