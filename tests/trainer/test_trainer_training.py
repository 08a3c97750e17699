"""The training loop: it learns, it is reproducible, and resuming continues exactly."""

from __future__ import annotations

import math

import pytest

from mindmotor.trainer.config import load_config
from mindmotor.trainer.loop import RunOptions, train
from mindmotor.trainer.testing import tiny_overrides


def run(corpus, store, run_name, **overrides):
    config = load_config("tiny", tiny_overrides(corpus, **overrides))
    return train(config, store, RunOptions(run_name=run_name, show_progress=False))


def test_loss_goes_down_and_validation_is_reported(trained):
    _, result = trained
    assert len(result.losses) == 8 and result.losses[-1] < result.losses[0] - 0.3
    assert set(result.val_losses) == {4, 8} and result.val_losses[8] < result.val_losses[4]


def test_same_seed_same_losses_other_seed_other_losses(trained, corpus_dir, tmp_path):
    _, first = trained
    again = run(corpus_dir, tmp_path, "again")
    assert again.losses == first.losses and again.val_losses == first.val_losses
    other = run(corpus_dir, tmp_path, "other", seed=99, steps=2, checkpoint_interval=2)
    assert other.losses != first.losses[:2]


def test_resume_continues_the_uninterrupted_loss_trajectory(trained, corpus_dir, tmp_path):
    _, uninterrupted = trained
    config = load_config("tiny", tiny_overrides(corpus_dir, checkpoint_interval=100))
    part1 = train(config, tmp_path, RunOptions(run_name="part1", stop_after_step=3,
                                               show_progress=False))
    assert part1.checkpoints == ["part1-step000003"]
    part2 = train(config, tmp_path, RunOptions(run_name="part2", resume="latest",
                                               show_progress=False))
    assert part2.start_step == 3
    resumed = part1.losses + part2.losses
    assert len(resumed) == 8
    assert max(abs(a - b) for a, b in zip(resumed, uninterrupted.losses)) <= 1e-6
    assert part2.val_losses[8] == pytest.approx(uninterrupted.val_losses[8], abs=1e-6)
    from mindmotor.model.manifest import read_manifest
    assert read_manifest(tmp_path / "part2-step000008")["parent"] == "part1-step000003"


def test_activation_checkpointing_changes_memory_not_results(trained, corpus_dir, tmp_path):
    _, plain = trained
    checkpointed = run(corpus_dir, tmp_path, "ac", activation_checkpointing=True, steps=3,
                       checkpoint_interval=3, warmup_steps=2)
    # steps=3 changes the cosine schedule only after warmup: the first two steps are identical
    assert checkpointed.losses[:2] == pytest.approx(plain.losses[:2], abs=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(corpus_dir, tmp_path, precision):
    result = run(corpus_dir, tmp_path, precision, precision=precision, steps=3,
                 checkpoint_interval=3, warmup_steps=1)
    assert all(math.isfinite(x) for x in result.losses)
    assert math.isfinite(result.val_losses[3])
