"""Helpers for tests of the trainer (and for anyone who needs a tiny training run): a small corpus,
the tiny config on it, real processes, waiting on conditions with a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mindmotor.common.waiting import wait_until

PYTHON = sys.executable
CORPUS_MODULES = ("textwrap", "string", "shlex", "fractions")
wait_for = wait_until        # the name the trainer's tests use


def write_corpus(directory: Path, modules: tuple[str, ...] = CORPUS_MODULES) -> Path:
    """A few standard-library modules' sources as a corpus directory (~70 KB)."""
    import importlib
    import inspect

    directory.mkdir(parents=True, exist_ok=True)
    for name in modules:
        (directory / f"{name}.py").write_text(inspect.getsource(importlib.import_module(name)))
    return directory


def tiny_overrides(corpus: Path, **extra) -> dict:
    """The tiny preset on the test corpus: 2 layers of 64, vocab 384, seq 64, 4 sequences/step."""
    overrides = {"corpus": [str(corpus)], "steps": 8, "checkpoint_interval": 4, "eval_interval": 4,
                 "warmup_steps": 2}
    overrides.update(extra)
    return overrides


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_cli(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m mindmotor.trainer.cli ARGS` in a real process (one thread: tiny models)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run([PYTHON, "-m", "mindmotor.trainer.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def stop_process(process: subprocess.Popen, timeout: float = 15) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
