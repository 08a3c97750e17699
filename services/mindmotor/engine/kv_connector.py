"""The KV connector, scheduler side (vLLM's vocabulary): the sequences whose blocks are held for a
KV transfer rather than for computing — both ends of the prefill/decode split.

- **Pins** (the prefill side): a `prefill_only` request stops after its first token; its sequence
  leaves the running set with its blocks still referenced and is pinned under a handle (its
  request id) until a decode worker has pulled the KV and releases it, or the pin's deadline
  passes (a decode worker that died never strands prefill memory).
- **Loads** (the decode side): a continuation with a KV source is admitted with blocks for its
  prompt (reusing the local prefix cache, whose KV then need not travel) and waits in
  `WAITING_FOR_KV`; a `KVLoad` tells the worker's side what to pull; `finish` ends the wait.

The `Scheduler` owns this object (it owns every holder of blocks); the worker side of the
connector (`mindmotor.worker.kv_connector`) does the pulling over the network. The payloads are
`KVBlocks`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .continuation import KVSource
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


@dataclass(frozen=True)
class KVLoad:
    """What the worker side must pull for one waiting continuation: the prompt's blocks from
    `skip_blocks` on (the ones before are in the local prefix cache)."""
    request_id: str
    source: KVSource
    skip_blocks: int
    num_tokens: int             # prompt tokens those blocks hold (what the transfer is priced on)


@dataclass
class _Pin:
    seq: Sequence
    deadline: float             # clock() after which the blocks are freed anyway


class SchedulerKVConnector:
    """Pinned prefills (by handle) and continuations waiting for their KV (by request id)."""

    def __init__(self, block_size: int, clock: Callable[[], float] = time.monotonic):
        self.block_size = block_size
        self.clock = clock
        self._pins: dict[str, _Pin] = {}
        self._loading: dict[str, Sequence] = {}
        self._new_loads: list[KVLoad] = []

    # ---- the prefill side -------------------------------------------------------------------
    def pin(self, seq: Sequence, ttl_s: float) -> str:
        self._pins[seq.request_id] = _Pin(seq, self.clock() + ttl_s)
        return seq.request_id

    def pinned(self, handle: str) -> Sequence | None:
        pin = self._pins.get(handle)
        return pin.seq if pin is not None else None

    def unpin(self, handle: str) -> Sequence | None:
        pin = self._pins.pop(handle, None)
        return pin.seq if pin is not None else None

    def pop_expired(self) -> list[Sequence]:
        now = self.clock()
        gone = [h for h, pin in self._pins.items() if pin.deadline <= now]
        return [self._pins.pop(h).seq for h in gone]

    def prompt_blocks(self, seq: Sequence) -> list[int]:
        """The block ids holding `seq`'s prompt KV (the last one may be partly filled)."""
        return seq.block_table[:-(-seq.num_prompt_tokens // self.block_size)]

    # ---- the decode side --------------------------------------------------------------------
    def start_load(self, seq: Sequence, num_cached_tokens: int) -> None:
        """`seq` has blocks for its prompt, the first `num_cached_tokens` already computed here:
        ask the worker side for the rest."""
        skip = num_cached_tokens // self.block_size
        self._loading[seq.request_id] = seq
        self._new_loads.append(KVLoad(seq.request_id, seq.kv_source, skip,
                                      seq.num_prompt_tokens - skip * self.block_size))

    def park(self, seq: Sequence) -> None:
        """`seq` waits for KV that another part of the engine loads (the host tier): held here
        like a pull, without a `KVLoad` for the worker side."""
        self._loading[seq.request_id] = seq

    def take_loads(self) -> list[KVLoad]:
        """The loads started since the last call (for the worker side)."""
        loads, self._new_loads = self._new_loads, []
        return loads

    def loading(self, request_id: str) -> Sequence | None:
        return self._loading.get(request_id)

    def finish_load(self, request_id: str) -> Sequence | None:
        """Stop waiting for `request_id`'s KV; None if it is not waiting (aborted meanwhile)."""
        seq = self._loading.pop(request_id, None)
        if seq is not None:
            self._new_loads = [load for load in self._new_loads if load.request_id != request_id]
        return seq

    # ---- what it holds ----------------------------------------------------------------------
    def sequences(self) -> list[Sequence]:
        """Every sequence whose blocks this connector holds."""
        return [pin.seq for pin in self._pins.values()] + list(self._loading.values())

    @property
    def num_pinned(self) -> int:
        return len(self._pins)

    @property
    def num_pinned_blocks(self) -> int:
        return sum(len(pin.seq.block_table) for pin in self._pins.values())

    @property
    def num_loading(self) -> int:
        return len(self._loading)
