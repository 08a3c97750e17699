"""KV handed from a prefill instance to a decode instance (the prefill/decode split).

Prefill side: a `prefill_only` request stops after its first token; its sequence leaves the
scheduler with its blocks still referenced and is *pinned* in `KVPins` under a handle (its request
id) until the decode instance has pulled the blocks and releases them, or the pin's deadline
passes (a decode instance that died never strands prefill memory).

Decode side: a request arrives with its prompt and first token; the engine reserves its blocks
(reusing what the local prefix cache already holds, whose KV then need not travel), the worker
pulls the other blocks, and `commit` writes them and lets the sequence run as if it had prefilled
here. These payloads are `KVBlocks`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .sequence import Sequence


@dataclass
class KVBlocks:
    """K and V of consecutive blocks of one sequence, all layers."""
    first_block: int            # index in the sequence's block table of the first block carried
    k: np.ndarray               # [num_layers, num_blocks, block_size, n_kv_heads, head_dim]
    v: np.ndarray               # [num_layers, num_blocks, block_size, n_kv_heads, head_dim]

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclass
class _Pin:
    seq: Sequence
    deadline: float             # clock() after which the blocks are freed anyway


class KVPins:
    """Prefilled sequences whose blocks are held for a decode instance, by handle."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._pins: dict[str, _Pin] = {}

    def pin(self, seq: Sequence, ttl_s: float) -> str:
        self._pins[seq.request_id] = _Pin(seq, self.clock() + ttl_s)
        return seq.request_id

    def get(self, handle: str) -> Sequence | None:
        pin = self._pins.get(handle)
        return pin.seq if pin is not None else None

    def pop(self, handle: str) -> Sequence | None:
        pin = self._pins.pop(handle, None)
        return pin.seq if pin is not None else None

    def pop_expired(self) -> list[Sequence]:
        now = self.clock()
        gone = [h for h, pin in self._pins.items() if pin.deadline <= now]
        return [self._pins.pop(h).seq for h in gone]

    def sequences(self) -> list[Sequence]:
        return [pin.seq for pin in self._pins.values()]

    @property
    def num_blocks(self) -> int:
        return sum(len(pin.seq.block_table) for pin in self._pins.values())

    def __len__(self) -> int:
        return len(self._pins)


def num_prompt_blocks(seq: Sequence, block_size: int) -> int:
    """Blocks holding the prompt's KV (the last one may be partly filled)."""
    return -(-seq.num_prompt_tokens // block_size)
