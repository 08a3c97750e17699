"""ModelInfo: what a coordinator needs to serve the worker's model without its checkpoint — the
served name, the context length and the tokenizer files byte for byte, with a digest that is the
same for every worker on the same tokenizer (and pinned to the documented formula)."""

from __future__ import annotations

import hashlib
import json

from mindmotor.protocol import worker_pb2 as pb


def model_info(worker, digest_only: bool = False) -> pb.ModelInfoResponse:
    return worker.stub.ModelInfo(pb.ModelInfoRequest(digest_only=digest_only), timeout=5)


def documented_digest(*contents: bytes) -> str:
    """worker.proto: sha256 over tokenizer.json and tokenizer_config.json, each after its length
    as 8 big-endian bytes."""
    h = hashlib.sha256()
    for content in contents:
        h.update(len(content).to_bytes(8, "big") + content)
    return h.hexdigest()


def test_model_info_carries_the_checkpoint_files(worker, tiny_model):
    info = model_info(worker)

    assert info.model == tiny_model.name == worker.stub.Status(pb.StatusRequest(), timeout=5).model
    assert info.max_model_len == 1024
    assert info.tokenizer_json == (tiny_model / "tokenizer.json").read_bytes()
    assert info.tokenizer_config_json == (tiny_model / "tokenizer_config.json").read_bytes()
    assert info.generation_config_json == (tiny_model / "generation_config.json").read_bytes()
    config = json.loads(info.tokenizer_config_json)
    assert "<|im_start|>" in config["chat_template"] and config["eos_token"] == "<|endoftext|>"
    assert info.tokenizer_digest == documented_digest(info.tokenizer_json, info.tokenizer_config_json)


def test_digest_only_leaves_the_files_out_and_the_digest_is_stable(worker):
    full, again, short = model_info(worker), model_info(worker), model_info(worker, digest_only=True)

    assert again.tokenizer_digest == full.tokenizer_digest == short.tokenizer_digest
    assert (short.model, short.max_model_len) == (full.model, full.max_model_len)
    assert not (short.tokenizer_json or short.tokenizer_config_json or short.generation_config_json)


def test_served_model_name_is_what_model_info_and_status_report(worker, start_worker):
    other = start_worker("--timing", "virtual", "--served-model-name", "other", "--max-model-len", "512")
    info = model_info(other)

    assert info.model == "other" == other.stub.Status(pb.StatusRequest(), timeout=5).model
    assert info.max_model_len == 512
    assert info.tokenizer_digest == model_info(worker).tokenizer_digest   # another process, same files
