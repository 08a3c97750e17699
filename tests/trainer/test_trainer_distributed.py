"""Data parallelism: 1 and 2 real gloo processes at the same global batch follow the same loss
curve — started by `mindmotor train --nproc 2`, and by `torchrun` with its c10d rendezvous (the
path multi-machine training takes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mindmotor.model.manifest import verify_checkpoint
from mindmotor.trainer.testing import read_events, run_cli, tiny_overrides

TRAIN_ARGS = ["--preset", "tiny", "--no-progress"]


def write_config(corpus: Path, directory: Path) -> Path:
    # batch 4 = micro 2 × accumulation 2 × 1 process = micro 2 × accumulation 1 × 2 processes
    path = directory / "config.json"
    path.write_text(json.dumps(tiny_overrides(corpus, steps=6, checkpoint_interval=6,
                                              eval_interval=3)))
    return path


def curves(events: list[dict]) -> tuple[list[float], list[float]]:
    return ([e["loss"] for e in events if e["event"] == "step"],
            [e["val_loss"] for e in events if e["event"] == "eval"])


@pytest.fixture(scope="module")
def single_process(corpus_dir, tmp_path_factory):
    """The reference curve: the same config in one process (this one)."""
    from mindmotor.trainer.config import load_config
    from mindmotor.trainer.loop import RunOptions, train

    directory = tmp_path_factory.mktemp("ddp1")
    config = load_config("tiny", json.loads(write_config(corpus_dir, directory).read_text()))
    events = directory / "events.jsonl"
    train(config, directory / "store", RunOptions(events_path=str(events), show_progress=False))
    return curves(read_events(events))


def test_two_processes_match_one(single_process, corpus_dir, tmp_path):
    events = tmp_path / "events.jsonl"
    done = run_cli("train", *TRAIN_ARGS, "--config", str(write_config(corpus_dir, tmp_path)),
                   "--out", str(tmp_path / "store"), "--nproc", "2", "--run-name", "p2",
                   "--events", str(events))
    assert done.returncode == 0, done.stderr[-3000:]
    losses, val_losses = curves(read_events(events))
    assert len(losses) == 6
    assert losses == pytest.approx(single_process[0], abs=1e-5)
    assert val_losses == pytest.approx(single_process[1], abs=1e-5)
    assert verify_checkpoint(tmp_path / "store" / "p2-step000006")["world_size"] == 2


def test_torchrun_rendezvous_matches_one_process(single_process, corpus_dir, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    assert torchrun.exists(), f"{torchrun}: torch's torchrun should be installed next to this Python"
    events = tmp_path / "events.jsonl"
    done = subprocess.run(
        # --standalone: the c10d rendezvous (as across machines) on a port torchrun picks itself
        [str(torchrun), "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
         "-m", "mindmotor.trainer.cli", "train", *TRAIN_ARGS,
         "--config", str(write_config(corpus_dir, tmp_path)), "--out", str(tmp_path / "store"),
         "--events", str(events)],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    losses, _ = curves(read_events(events))
    assert losses == pytest.approx(single_process[0], abs=1e-5)
