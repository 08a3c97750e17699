"""`mindmotor train | debug compare | checkpoints` as a user runs them (real processes)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mindmotor.trainer.testing import PYTHON, run_cli


def mindmotor(*args: str) -> subprocess.CompletedProcess:
    """Through the top-level `mindmotor` command, as installed."""
    return subprocess.run([PYTHON, "-m", "mindmotor.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_importing_the_commands_does_not_import_torch():
    code = ("import sys, mindmotor.trainer.cli, mindmotor.trainer.service, "
            "mindmotor.model.manifest; assert 'torch' not in sys.modules, 'torch imported'")
    assert subprocess.run([PYTHON, "-c", code], capture_output=True).returncode == 0


@pytest.mark.parametrize("args, message", [
    (["--set", "hidden_size=65"], "hidden_size 65 is not a multiple of num_attention_heads"),
    (["--set", "colour=blue"], "unknown config keys ['colour']"),
    (["--corpus", "/no/such/corpus"], "corpus path '/no/such/corpus' does not exist"),
    (["--nproc", "3"], "micro_batch_size × processes"),
])
def test_bad_config_is_a_clear_error_and_exit_code_2(args, message, tmp_path):
    done = mindmotor("train", "--preset", "tiny", "--out", str(tmp_path), *args)
    assert done.returncode == 2, done.stderr
    assert "mindmotor train: error:" in done.stderr and message in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_debug_compare_prints_per_layer_differences(trained):
    store, result = trained
    done = run_cli("debug", "compare", "--checkpoint", str(store / result.checkpoints[-1]))
    assert done.returncode == 0, done.stderr
    assert "layer 1" in done.stdout and "within tolerance" in done.stdout


def test_checkpoints_verify_list_and_promote(trained, tmp_path):
    store, result = trained
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    listed = run_cli("checkpoints", "--store", str(copy), "list")
    assert all(v in listed.stdout for v in result.checkpoints)
    assert run_cli("checkpoints", "--store", str(copy), "verify", "latest").returncode == 0
    assert run_cli("checkpoints", "--store", str(copy), "promote", result.checkpoints[0]).returncode == 0
    assert (copy / "PROMOTED").read_text().strip() == result.checkpoints[0]
    (copy / result.checkpoints[-1] / "config.json").write_text("{}")
    bad = run_cli("checkpoints", "--store", str(copy), "verify", "latest")
    assert bad.returncode == 1 and "config.json: sha256" in bad.stderr


def test_bundle_makes_a_verified_serving_only_copy(trained, tmp_path):
    from mindmotor.model.manifest import verify_checkpoint

    store, result = trained
    destination = tmp_path / "demo"
    done = run_cli("checkpoints", "--store", str(store), "bundle", "latest", str(destination))
    assert done.returncode == 0, done.stderr
    manifest = verify_checkpoint(destination)
    assert "trainer_state.pt" not in manifest["files"] and "model.safetensors" in manifest["files"]
    assert manifest["parent"] == result.checkpoints[-1] and manifest["version"] == "demo"
    assert manifest["step"] == 8
    assert not (destination / "trainer_state.pt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]


def test_bundle_in_bfloat16_halves_the_weights_and_still_serves(trained, tmp_path):
    import numpy as np

    from mindmotor.model.llama import LlamaModel
    from mindmotor.model.safetensors_io import read_header
    from mindmotor.model.manifest import verify_checkpoint

    store, result = trained
    destination = tmp_path / "demo-bf16"
    done = run_cli("checkpoints", "--store", str(store), "bundle", "latest", str(destination),
                   "--dtype", "bfloat16")
    assert done.returncode == 0, done.stderr
    verify_checkpoint(destination)
    header, _ = read_header(destination / "model.safetensors")
    assert {info["dtype"] for info in header.values()} == {"BF16"}
    source = store / result.checkpoints[-1]
    assert (destination / "model.safetensors").stat().st_size < 0.6 * (source / "model.safetensors").stat().st_size
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    full = LlamaModel.from_pretrained(source).forward_dense(ids)
    half = LlamaModel.from_pretrained(destination).forward_dense(ids)
    assert np.abs(full - half).max() < 0.1 * np.abs(full).max()
    assert (full.argmax(-1) == half.argmax(-1)).mean() >= 0.75


def test_debug_quality_scores_the_checkpoint_against_a_unigram_model(trained):
    import json

    from mindmotor.trainer.baseline import unigram_loss

    store, result = trained
    checkpoint = store / result.checkpoints[-1]
    done = run_cli("debug", "quality", "--checkpoint", str(checkpoint))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["val_sequences"] >= 1 and report["val_tokens"] > 0
    assert 0 < report["unigram_val_loss"] < 10 and 0 < report["model_val_loss"] < 10
    # the unigram baseline itself: uniform counts give log(vocab)
    import numpy as np
    assert unigram_loss(np.arange(4), np.arange(4), 4) == pytest.approx(np.log(4))
