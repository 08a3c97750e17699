"""Checkpoints: Hugging Face layout, manifest, integrity checks, atomic writes, the store, and
parity with the serving engine's numpy model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from mindmotor.common.tokenizer import EOS_TOKEN, Tokenizer
from mindmotor.model.config import CheckpointError, LlamaConfig
from mindmotor.model.manifest import (MANIFEST_NAME, CheckpointIntegrityError, file_sha256,
                                        verify_checkpoint)
from mindmotor.trainer.store import CheckpointStore

HF_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"}


def test_checkpoint_is_a_hugging_face_directory_our_loaders_read(trained):
    store, result = trained
    directory = store / result.checkpoints[-1]
    assert HF_FILES | {MANIFEST_NAME, "trainer_state.pt"} == {p.name for p in directory.iterdir()}
    config = LlamaConfig.from_dir(directory)
    assert (config.architecture, config.hidden_size, config.num_hidden_layers) == ("LlamaForCausalLM", 64, 2)
    raw = json.loads((directory / "config.json").read_text())
    assert raw["model_type"] == "llama" and raw["hidden_act"] == "silu"
    tensors = load_file(directory / "model.safetensors")
    assert tensors["model.embed_tokens.weight"].shape == (config.vocab_size, 64)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 16, 64)
    assert all(t.dtype == np.float32 for t in tensors.values())
    tok = Tokenizer.from_dir(directory)
    assert tok.decode(tok.encode("def f(x):\n    return x")) == "def f(x):\n    return x"
    assert tok.eos_token == EOS_TOKEN and tok.eos_token_ids == (config.eos_token_id,)
    assert "<|im_start|>assistant" in tok.apply_chat_template([{"role": "user", "content": "hi"}])
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config.eos_token_id


def test_manifest_records_origin_and_every_file(trained):
    store, result = trained
    first, last = (store / v for v in result.checkpoints)
    manifest = verify_checkpoint(last)
    assert manifest["version"] == last.name and manifest["parent"] == first.name
    assert manifest["step"] == 8 and manifest["val_loss"] == pytest.approx(result.val_losses[8])
    assert len(manifest["corpus_digest"]) == 64 and len(manifest["config_digest"]) == 64
    assert set(manifest["files"]) == HF_FILES | {"trainer_state.pt"}
    assert manifest["files"]["model.safetensors"] == file_sha256(last / "model.safetensors")
    assert verify_checkpoint(first)["parent"] is None


def test_a_tampered_file_is_refused_naming_the_file(checkpoint_copy):
    weights = checkpoint_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointIntegrityError, match="model.safetensors: sha256 .* does not match"):
        verify_checkpoint(checkpoint_copy)
    assert issubclass(CheckpointIntegrityError, CheckpointError)   # what serving catches


def test_missing_and_unlisted_files_are_refused(checkpoint_copy):
    (checkpoint_copy / "extra.bin").write_bytes(b"x")
    with pytest.raises(CheckpointIntegrityError, match="extra.bin: not listed"):
        verify_checkpoint(checkpoint_copy)
    (checkpoint_copy / "extra.bin").unlink()
    (checkpoint_copy / "tokenizer.json").unlink()
    with pytest.raises(CheckpointIntegrityError, match="tokenizer.json: missing"):
        verify_checkpoint(checkpoint_copy)
    (checkpoint_copy / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(CheckpointIntegrityError, match="mindmotor.json: corrupt manifest"):
        verify_checkpoint(checkpoint_copy)


def test_a_failed_export_leaves_no_directory(trained, tmp_path, monkeypatch):
    import torch
    from tokenizers import Tokenizer as HFTokenizer

    from mindmotor.trainer import export
    from mindmotor.trainer.compare import load_torch_model

    store, result = trained
    source = store / result.checkpoints[-1]
    model = load_torch_model(source)
    tok = HFTokenizer.from_file(str(source / "tokenizer.json"))
    info = export.CheckpointInfo(version="v-fail", run="v", parent=None, step=1, val_loss=1.0,
                                 corpus_digest="0" * 64, config_digest="0" * 64, train_config={})

    def crash(*args, **kwargs):   # weights and config are written by now; the tokenizer is not
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "save_tokenizer", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        export.export_checkpoint(tmp_path, info, model, tok, {"step": torch.tensor(1)})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    written = export.export_checkpoint(tmp_path, info, model, tok)
    assert [p.name for p in tmp_path.iterdir()] == ["v-fail"] and verify_checkpoint(written)


def test_store_lists_versions_latest_and_promotes(trained):
    store_root, result = trained
    store = CheckpointStore(store_root)
    (store_root / ".tmp-half-written").mkdir(exist_ok=True)   # never listed
    assert [v.version for v in store.versions()] == result.checkpoints
    assert store.latest().version == result.checkpoints[-1]
    assert store.promoted() is None
    store.promote(result.checkpoints[0])
    assert store.promoted().version == result.checkpoints[0]
    assert store.resolve("promoted") == store_root / result.checkpoints[0]
    with pytest.raises(CheckpointError, match="no such checkpoint version"):
        store.promote("nope")
    (store_root / "PROMOTED").unlink()


def test_numpy_serving_model_matches_pytorch_per_layer(trained):
    from mindmotor.trainer.compare import compare_checkpoint

    store, result = trained
    diffs = compare_checkpoint(store / result.checkpoints[-1], max_tokens=48)
    assert [d.name for d in diffs] == ["embed", "layer 0", "layer 1", "logits"]
    assert max(d.max_abs for d in diffs) <= 1e-4, diffs
