"""A training run stopped mid-way leaves no `.tmp-*` behind: `mindmotor train` (tiny preset, a
checkpoint every step, so the signal often lands in the middle of writing one) killed with SIGTERM
or SIGINT, in one process or as a 2-process group told through its parent only; and a staging
directory whose writer was killed outright (nothing could run) is swept by the next export, while
one still being written is left alone. A run stopped by SIGINT first writes a checkpoint of the
step it reached, and `--resume latest` carries on from that step."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from pathlib import Path

import pytest

from mindmotor.trainer.staging import sweep_abandoned
from mindmotor.trainer.testing import PYTHON, read_events, run_cli, stop_process, wait_for

STEPS = 5000            # far more than a test lasts: only the signal ends the run


def leftovers(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if p.name.startswith(".tmp-"))


def versions(store: Path) -> list[str]:
    return [p.name for p in store.iterdir() if not p.name.startswith(".")] if store.is_dir() else []


@pytest.mark.parametrize("sig, nproc", [(signal.SIGINT, 1), (signal.SIGTERM, 2)],   # each signal once: SIGTERM
                         ids=["sigint", "sigterm-to-the-parent-of-2"])           # where it must reach the ranks
def test_a_run_stopped_by_a_signal_leaves_no_temporary_directory(sig, nproc, corpus_dir, tmp_path):
    store = tmp_path / "store"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    run = subprocess.Popen(
        [PYTHON, "-m", "mindmotor.trainer.cli", "train", "--preset", "tiny", "--corpus", str(corpus_dir),
         "--out", str(store), "--steps", str(STEPS), "--nproc", str(nproc), "--no-progress",
         "--set", "checkpoint_interval=1", "--set", "eval_interval=100000", "--set", "micro_batch_size=2"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "train.log", "wb"), env=env)
    try:
        wait_for(lambda: len(versions(store)) >= 3 or run.poll() is not None, timeout=120)
        assert run.poll() is None, (tmp_path / "train.log").read_text()[-2000:]
        run.send_signal(sig)                                # to this process only, not its group
        code = run.wait(timeout=60)
    finally:
        stop_process(run)
    assert code in (-sig, 128 + sig), code
    assert len(versions(store)) < STEPS
    assert leftovers(store) == []


def step_events(path: Path) -> list[int]:
    return [e["step"] for e in read_events(path) if e["event"] == "step"] if path.is_file() else []


def test_sigint_writes_a_checkpoint_of_the_step_reached_and_resume_continues_from_it(corpus_dir, tmp_path):
    store, first, second = tmp_path / "store", tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    common = ["--preset", "tiny", "--corpus", str(corpus_dir), "--out", str(store), "--no-progress",
              "--run-name", "cut", "--set", "checkpoint_interval=100000", "--set", "eval_interval=100000"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    run = subprocess.Popen([PYTHON, "-m", "mindmotor.trainer.cli", "train", *common, "--steps", str(STEPS),
                            "--events", str(first)],
                           stdout=subprocess.DEVNULL, stderr=open(tmp_path / "train.log", "wb"), env=env)
    try:
        wait_for(lambda: len(step_events(first)) >= 3 or run.poll() is not None, timeout=120)
        assert run.poll() is None, (tmp_path / "train.log").read_text()[-2000:]
        run.send_signal(signal.SIGINT)                      # before any periodic checkpoint is due
        code = run.wait(timeout=60)
    finally:
        stop_process(run)
    assert code in (-signal.SIGINT, 128 + signal.SIGINT), code
    reached = step_events(first)[-1]
    assert 3 <= reached < STEPS
    assert versions(store) == [f"cut-step{reached:06d}"]
    assert leftovers(store) == []
    assert "continue with --resume latest" in (tmp_path / "train.log").read_text()

    resumed = run_cli("train", *common, "--steps", str(reached + 2), "--resume", "latest",
                      "--events", str(second))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    events = read_events(second)
    assert [e["start_step"] for e in events if e["event"] == "start"] == [reached]
    assert step_events(second) == [reached + 1, reached + 2]    # the step counter goes on
    assert sorted(versions(store)) == [f"cut-step{reached:06d}", f"cut-step{reached + 2:06d}"]


def test_a_staging_directory_whose_writer_died_is_swept_and_a_live_one_kept(tmp_path):
    dead = tmp_path / ".tmp-run-step000001-deadbeef"
    (dead / "model.safetensors").parent.mkdir()
    (dead / "model.safetensors").write_bytes(b"half")
    (tmp_path / (dead.name + ".lock")).touch()             # its writer died holding nothing
    live = tmp_path / ".tmp-run-step000002-feedface"
    live.mkdir()
    old = tmp_path / ".tmp-from-an-older-version"          # no lock file: not ours to judge
    old.mkdir()
    fd = os.open(tmp_path / (live.name + ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)                     # a writer at work
        assert sweep_abandoned(tmp_path) == [dead.name]
    finally:
        os.close(fd)
    assert leftovers(tmp_path) == sorted([old.name, live.name, live.name + ".lock"])
