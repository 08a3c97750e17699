"""`read_model_info`: this worker's `ModelInfo` answer — the served model name, the context length
and the checkpoint's tokenizer files — read once when the worker starts (the engine never reloads
its checkpoint, so the answer cannot change), so a coordinator without a copy of the checkpoint
can tokenize and apply the chat template for the model exactly as it would from the directory."""

from __future__ import annotations

from pathlib import Path

from mindmotor.common.tokenizer import TokenizerFiles
from mindmotor.protocol import worker_pb2 as pb

GENERATION_CONFIG_FILE = "generation_config.json"


def read_model_info(model_dir: str | Path, model: str, max_model_len: int) -> pb.ModelInfoResponse:
    files = TokenizerFiles.read(model_dir)
    generation_config = Path(model_dir) / GENERATION_CONFIG_FILE
    return pb.ModelInfoResponse(
        model=model, max_model_len=max_model_len, tokenizer_json=files.tokenizer_json,
        tokenizer_config_json=files.tokenizer_config_json,
        generation_config_json=generation_config.read_bytes() if generation_config.is_file() else b"",
        tokenizer_digest=files.digest())


def digest_only(info: pb.ModelInfoResponse) -> pb.ModelInfoResponse:
    """The answer without the files (`ModelInfoRequest.digest_only`)."""
    return pb.ModelInfoResponse(model=info.model, max_model_len=info.max_model_len,
                                tokenizer_digest=info.tokenizer_digest)
