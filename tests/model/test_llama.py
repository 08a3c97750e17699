"""The numpy Llama: the paged path equals the dense reference, and checkpoints load or fail clearly."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from mindmotor.model.attention import AttentionMetadata
from mindmotor.model.config import CheckpointError, LlamaConfig
from mindmotor.model.kv_cache import PagedKVCache
from mindmotor.model.llama import LlamaModel
from mindmotor.model.safetensors_io import load_safetensors
from mindmotor.model.testing import random_tensors, tiny_config, write_tiny_checkpoint


def paged_logits_in_chunks(model: LlamaModel, ids: list[int], chunks: list[int], block_size=4):
    """Feed `ids` through the paged path chunk by chunk (blocks deliberately out of order)."""
    cfg = model.config
    cache = PagedKVCache(cfg.num_hidden_layers, 64, block_size, cfg.num_key_value_heads, cfg.head_dim)
    table = [7, 3, 12, 0, 9, 5, 30, 31, 2, 1, 4, 6, 8, 10, 11, 13][: -(-len(ids) // block_size)]
    cache.ensure_blocks(max(table))
    start, logits = 0, []
    for n in chunks:
        pos = np.arange(start, start + n)
        slots = np.asarray(table)[pos // block_size] * block_size + pos % block_size
        meta = AttentionMetadata(slot_mapping=slots, query_start_loc=np.array([0, n]),
                                 context_lens=np.array([start + n]), block_tables=np.array([table]),
                                 num_decodes=1 if n == 1 else 0)
        logits.append(model.forward(np.asarray(ids[start:start + n]), pos, meta, cache, np.arange(n)))
        start += n
    return np.concatenate(logits)


@pytest.mark.parametrize("fixture", ["tiny_ckpt", "tiny_qwen2_ckpt"])
def test_paged_forward_matches_dense_reference(request, fixture):
    model = LlamaModel.from_pretrained(request.getfixturevalue(fixture))
    ids = list(np.random.default_rng(0).integers(0, model.config.vocab_size, 23))
    dense = model.forward_dense(ids)
    paged = paged_logits_in_chunks(model, ids, [9, 5, 1, 1, 7])
    np.testing.assert_allclose(paged, dense, rtol=1e-4, atol=1e-4)


def test_batched_decodes_match_single_sequences(tiny_ckpt):
    """Two sequences of different lengths decoding in one step give their own dense logits."""
    model = LlamaModel.from_pretrained(tiny_ckpt)
    cfg, bs = model.config, 4
    rng = np.random.default_rng(1)
    seqs = [list(rng.integers(0, cfg.vocab_size, n)) for n in (6, 11)]
    cache = PagedKVCache(cfg.num_hidden_layers, 16, bs, cfg.num_key_value_heads, cfg.head_dim)
    tables = [[0, 1], [2, 3, 4]]
    for seq, table in zip(seqs, tables):  # prefill all but the last token
        n = len(seq) - 1
        pos = np.arange(n)
        slots = np.asarray(table)[pos // bs] * bs + pos % bs
        meta = AttentionMetadata(slots, np.array([0, n]), np.array([n]), np.array([table]), 0)
        model.forward(np.asarray(seq[:n]), pos, meta, cache, np.array([n - 1]))
    pos = np.array([len(s) - 1 for s in seqs])
    slots = np.array([tables[i][p // bs] * bs + p % bs for i, p in enumerate(pos)])
    meta = AttentionMetadata(slots, np.array([0, 1, 2]), pos + 1, np.array([[0, 1, 0], [2, 3, 4]]), 2)
    logits = model.forward(np.array([s[-1] for s in seqs]), pos, meta, cache, np.array([0, 1]))
    for i, seq in enumerate(seqs):
        np.testing.assert_allclose(logits[i], model.forward_dense(seq)[-1], rtol=1e-4, atol=1e-4)


def test_fp16_checkpoint_loads_close_to_fp32(tmp_path):
    d32 = write_tiny_checkpoint(tmp_path / "f32", seed=3)
    d16 = write_tiny_checkpoint(tmp_path / "f16", seed=3, dtype="float16")
    ids = [5, 17, 99, 3]
    a = LlamaModel.from_pretrained(d32).forward_dense(ids)
    b = LlamaModel.from_pretrained(d16).forward_dense(ids)
    np.testing.assert_allclose(a, b, atol=2e-2)


def write_bf16_safetensors(path, tensors: dict[str, np.ndarray]):
    """bfloat16 is the top 16 bits of float32 (round toward zero here)."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        raw = (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_bf16_tensors_are_widened_exactly(tmp_path):
    values = np.array([[1.0, -2.5, 3.140625], [0.0, 65280.0, -0.001953125]], dtype=np.float32)
    write_bf16_safetensors(tmp_path / "x.safetensors", {"w": values})
    np.testing.assert_array_equal(load_safetensors(tmp_path / "x.safetensors")["w"], values)


def test_bf16_checkpoint_serves(tmp_path, tiny_ckpt):
    d = tmp_path / "bf16"
    shutil.copytree(tiny_ckpt, d)
    config = LlamaConfig.from_dir(d)
    write_bf16_safetensors(d / "model.safetensors", random_tensors(config, seed=0))
    model = LlamaModel.from_pretrained(d)
    reference = LlamaModel.from_pretrained(tiny_ckpt)
    ids = [1, 2, 3, 4, 5]
    np.testing.assert_allclose(model.forward_dense(ids), reference.forward_dense(ids), atol=5e-2)


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_unsupported_architecture_is_named(tmp_path, tiny_ckpt):
    d = tmp_path / "m"
    shutil.copytree(tiny_ckpt, d)
    _edit_config(d, architectures=["FalconForCausalLM"])
    with pytest.raises(CheckpointError, match=r"config\.json.*FalconForCausalLM.*not supported"):
        LlamaModel.from_pretrained(d)


def test_missing_tensor_names_file_and_tensor(tmp_path, tiny_ckpt):
    d = tmp_path / "m"
    shutil.copytree(tiny_ckpt, d)
    tensors = random_tensors(LlamaConfig.from_dir(d))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*'model\.layers\.1\.mlp\.up_proj\.weight'"):
        LlamaModel.from_pretrained(d)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path, tiny_ckpt):
    d = tmp_path / "m"
    shutil.copytree(tiny_ckpt, d)
    _edit_config(d, intermediate_size=96)
    with pytest.raises(CheckpointError, match=r"gate_proj\.weight' has shape \(128, 64\), expected \(96, 64\)"):
        LlamaModel.from_pretrained(d)


def test_missing_config_and_extra_tensors(tmp_path, tiny_ckpt):
    with pytest.raises(CheckpointError, match="config.json: missing"):
        LlamaModel.from_pretrained(tmp_path)
    d = tmp_path / "m"
    shutil.copytree(tiny_ckpt, d)
    _edit_config(d, num_hidden_layers=1)
    with pytest.raises(CheckpointError, match="unexpected tensors.*model.layers.1"):
        LlamaModel.from_pretrained(d)


def test_config_reads_qwen2_defaults():
    config = LlamaConfig.from_dict({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
                                    "intermediate_size": 16, "num_hidden_layers": 1,
                                    "num_attention_heads": 2, "num_key_value_heads": 1})
    assert config.attention_bias and config.head_dim == 4 and config.rms_norm_eps == 1e-6
    assert tiny_config(10).num_parameters() > 0


def naive_attention(q, k, v, n_kv):
    """Per head, per query: the textbook formula."""
    num_q, n_heads, hd = q.shape
    total = k.shape[0]
    out = np.zeros_like(q, dtype=np.float64)
    for h in range(n_heads):
        kh, vh = k[:, h // (n_heads // n_kv)].astype(np.float64), v[:, h // (n_heads // n_kv)].astype(np.float64)
        for i in range(num_q):
            visible = total - num_q + i + 1
            s = kh[:visible] @ q[i, h] / np.sqrt(hd)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ vh[:visible]
    return out


@pytest.mark.parametrize("num_q, total", [(1, 1), (7, 7), (300, 700), (600, 600)])
def test_causal_attention_across_query_tiles(num_q, total):
    from mindmotor.model.attention import QUERY_TILE, causal_attention

    assert QUERY_TILE < 300  # the larger cases span several tiles
    rng = np.random.default_rng(num_q)
    q = rng.standard_normal((num_q, 4, 8)).astype(np.float32)
    k = rng.standard_normal((total, 2, 8)).astype(np.float32)
    v = rng.standard_normal((total, 2, 8)).astype(np.float32)
    np.testing.assert_allclose(causal_attention(q, k, v, 2), naive_attention(q, k, v, 2), atol=1e-5)
