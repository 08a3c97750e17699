"""`mindmotor train --init-from DIR / --tokenizer-from DIR` (fine-tuning an existing checkpoint,
keeping its tokenizer) and the file modes of what the trainer writes, as a user runs it: real
processes, started under umask 077 so that nothing is readable by others unless made so."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from mindmotor.common.tokenizer import TokenizerFiles
from mindmotor.trainer.testing import PYTHON

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def train_077(out: Path, corpus: Path, *args: str) -> subprocess.CompletedProcess:
    """`mindmotor train --preset tiny` for 2 steps under umask 077."""
    command = [PYTHON, "-m", "mindmotor.cli", "train", "--preset", "tiny", "--out", str(out), "--corpus",
               str(corpus), "--steps", "2", "--set", "checkpoint_interval=2", "--set", "eval_interval=2",
               "--set", "warmup_steps=0", "--no-progress", "--run-name", "ft", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(["sh", "-c", 'umask 077 && exec "$@"', "sh", *command], capture_output=True, text=True,
                          timeout=120, env=env)


def modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [directory, *directory.iterdir()]}


def assert_readable_by_all(directory: Path) -> None:
    found = modes(directory)
    assert found.pop(directory.name) == 0o755
    assert found and all(mode == 0o644 for mode in found.values()), found


def test_init_from_keeps_the_shape_weights_and_tokenizer_of_the_checkpoint(tiny_qwen2_ckpt, corpus_dir, tmp_path):
    done = train_077(tmp_path / "store", corpus_dir, "--init-from", str(tiny_qwen2_ckpt),
                     "--set", "lr=1e-9", "--set", "min_lr=0")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "store" / "ft-step000002"

    source, new = (json.loads((d / "config.json").read_text()) for d in (tiny_qwen2_ckpt, out))
    shape = ("architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings")
    assert {k: new[k] for k in shape} == {k: source[k] for k in shape}
    assert new["architectures"] == ["Qwen2ForCausalLM"]
    for name in TOKENIZER_FILES:                                      # byte for byte: the same digest
        assert (out / name).read_bytes() == (tiny_qwen2_ckpt / name).read_bytes()
    assert TokenizerFiles.read(out).digest() == TokenizerFiles.read(tiny_qwen2_ckpt).digest()
    before, after = load_file(tiny_qwen2_ckpt / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(after) == set(before) and "model.layers.0.self_attn.q_proj.bias" in after
    for name, tensor in before.items():                               # lr 1e-9: the weights it started from
        np.testing.assert_allclose(after[name], tensor, atol=1e-5, err_msg=name)
    manifest = json.loads((out / "mindmotor.json").read_text())
    assert manifest["init_from"] == str(tiny_qwen2_ckpt.resolve()) and manifest["step"] == 2
    assert_readable_by_all(out)
    assert stat.S_IMODE((tmp_path / "store").stat().st_mode) == 0o755

    resumed = train_077(tmp_path / "store", corpus_dir, "--resume", "latest", "--steps", "3",
                        "--set", "checkpoint_interval=1")                  # its shape: the checkpoint's
    assert resumed.returncode == 0, resumed.stderr
    again = tmp_path / "store" / "ft-step000003"
    assert json.loads((again / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert TokenizerFiles.read(again).digest() == TokenizerFiles.read(tiny_qwen2_ckpt).digest()
    assert json.loads((again / "mindmotor.json").read_text())["parent"] == "ft-step000002"


def test_fine_tuning_starts_from_the_trained_loss_not_from_scratch(trained, corpus_dir, tmp_path):
    store, result = trained
    base = store / result.checkpoints[-1]
    done = train_077(tmp_path / "store", corpus_dir, "--init-from", str(base), "--steps", "1",
                     "--set", "checkpoint_interval=1", "--events", str(tmp_path / "events.jsonl"))
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    first = next(e["loss"] for e in events if e["event"] == "step")
    assert first < result.losses[0] - 0.3, (first, result.losses)    # a fresh model starts near ln(vocab)
    manifest = json.loads((tmp_path / "store" / "ft-step000001" / "mindmotor.json").read_text())
    assert manifest["parent"] == result.checkpoints[-1]


def test_tokenizer_from_trains_new_weights_with_the_same_tokenizer(tiny_ckpt, corpus_dir, tmp_path):
    done = train_077(tmp_path / "store", corpus_dir, "--tokenizer-from", str(tiny_ckpt),
                     "--set", "hidden_size=32", "--set", "intermediate_size=64")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "store" / "ft-step000002"
    assert TokenizerFiles.read(out).digest() == TokenizerFiles.read(tiny_ckpt).digest()
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"]) == (32, 384)
    assert_readable_by_all(out)


@pytest.mark.parametrize("args, message", [
    (["--init-from", "{ckpt}", "--set", "hidden_size=128"], "its config.json sets hidden_size=64"),
    (["--init-from", "{ckpt}", "--resume", "latest"], "use one or the other"),
    (["--init-from", "/no/such/dir"], "--init-from /no/such/dir: not a directory"),
    (["--tokenizer-from", "{corpus}"], "tokenizer.json: missing"),
])
def test_bad_starting_points_are_refused_before_any_work(args, message, tiny_ckpt, corpus_dir, tmp_path):
    args = [a.format(ckpt=tiny_ckpt, corpus=corpus_dir) for a in args]
    done = train_077(tmp_path / "store", corpus_dir, *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


def test_bundle_and_promote_write_files_readable_by_all(trained, tmp_path):
    from mindmotor.trainer.bundle import bundle_checkpoint
    from mindmotor.trainer.store import CheckpointStore

    store, result = trained
    source = tmp_path / "private"
    source.mkdir(mode=0o700)
    version = source / result.checkpoints[-1]
    import shutil

    shutil.copytree(store / result.checkpoints[-1], version)
    for path in [version, *version.iterdir()]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    previous = os.umask(0o077)
    try:
        bundled = bundle_checkpoint(version, tmp_path / "serving" / "demo", dtype="bfloat16")
        CheckpointStore(source).promote(version.name)
    finally:
        os.umask(previous)
    assert_readable_by_all(bundled)
    assert stat.S_IMODE((tmp_path / "serving").stat().st_mode) == 0o755
    assert stat.S_IMODE((source / "PROMOTED").stat().st_mode) == 0o644
