"""Chained hashes of full KV blocks: the key of the prefix cache.

A block's hash covers its own token ids and, through the parent hash, every token before it, so
equal hashes mean equal prefixes. BLAKE2b is used so that the value is the same in every process
(the coordinator's cache-aware router computes the same hashes as the workers).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from typing import Sequence

ROOT_HASH = b"mindmotor-prefix-v1"


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The hash of one block after `parent`: the token ids as little-endian int64 (the bytes numpy's
    int64 array has; without numpy, so the coordinator's router does not load it)."""
    ids = array("q", token_ids)
    if sys.byteorder != "little":
        ids.byteswap()
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(ids.tobytes())
    return h.digest()


def adapter_root(key: str) -> bytes:
    """The root hash of the requests of one LoRA adapter (`key`: its name, and which load of it):
    the same tokens under another adapter, or the base model, have other KV, so other hashes."""
    return hash_block(hashlib.blake2b(b"lora:" + key.encode(), digest_size=16).digest(), [])


def block_hashes(token_ids: Sequence[int], block_size: int, start_hashes: Sequence[bytes] = (),
                 root: bytes = ROOT_HASH) -> list[bytes]:
    """Hashes of every full block of `token_ids`, continuing from `start_hashes` (already known);
    the chain starts at `root` (ROOT_HASH: the base model; `adapter_root`: a LoRA adapter's)."""
    hashes = list(start_hashes)
    parent = hashes[-1] if hashes else root
    for first in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[first:first + block_size])
        hashes.append(parent)
    return hashes
