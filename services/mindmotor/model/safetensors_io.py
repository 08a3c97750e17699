"""Reading `.safetensors` files into float32 numpy arrays, bf16 included.

The `safetensors` library's numpy backend has no bfloat16 (numpy has no such dtype), so tensors are
read from the documented file layout directly — an 8-byte little-endian header length, a JSON header
of `{name: {dtype, shape, data_offsets}}`, then the raw bytes — memory-mapped, and widened to float32.
Writing uses the `safetensors` library itself.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .config import CheckpointError

_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64,
                 "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def read_header(path: Path) -> tuple[dict, int]:
    """Return the JSON header and the byte offset where tensor data starts."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path}: not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > 100_000_000:
            raise CheckpointError(f"{path}: not a safetensors file (header length {length})")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: corrupt safetensors header: {exc}") from exc
    header.pop("__metadata__", None)
    return header, 8 + length


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of one file as float32 (floating) or native (integer) numpy arrays."""
    path = Path(path)
    header, data_start = read_header(path)
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        raw = blob[data_start + start:data_start + end]
        shape = tuple(info["shape"])
        dtype = info["dtype"]
        if data_start + end > blob.size:
            raise CheckpointError(f"{path}: tensor {name!r} extends past the end of the file")
        if dtype == "BF16":
            # bfloat16 is the top half of an IEEE float32: shift it back into place.
            array = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype in _NUMPY_DTYPES:
            array = raw.view(_NUMPY_DTYPES[dtype])
            if array.dtype.kind == "f":
                array = array.astype(np.float32)
        else:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
        tensors[name] = np.ascontiguousarray(array.reshape(shape))
    return tensors


def load_checkpoint_tensors(directory: str | Path) -> dict[str, np.ndarray]:
    """Tensors of `model.safetensors`, or of every shard named in `model.safetensors.index.json`."""
    directory = Path(directory)
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return load_safetensors(single)
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, np.ndarray] = {}
        for shard in shards:
            tensors.update(load_safetensors(directory / shard))
        return tensors
    raise CheckpointError(f"{single}: missing (no model.safetensors or index in {directory})")
