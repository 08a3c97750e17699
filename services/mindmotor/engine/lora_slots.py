"""`LoraSlots`: which LoRA adapters an engine knows, which sit in host memory, and which are in the
`max_loras` device slots a step's batch draws from.

- **Known adapters** (`add` / `remove`): name → directory, each checked when added
  (`model.lora.load_adapter`: a bad adapter is refused with its reason and changes nothing).
  A request names one; an unknown name is refused. Removing a name refuses new requests for it;
  requests already admitted keep their `AdapterRecord` (weights included) and finish normally.
- **Host cache**: the loaded records of up to `max_cpu_loras` adapters, least recently used
  dropped first (a dropped one is read from its directory again when next asked for).
- **Device slots**: `max_loras` of them. A slot is *busy* while a running sequence (or one
  waiting for its KV) uses its adapter; an idle slot is reused, least recently used first. Putting
  an adapter into a slot is an asynchronous copy over the card's host link
  (`EmulatedDevice.price_host_copy`): the slot is ready that many emulated seconds later.

The scheduler asks `ready(seq)` before admitting a waiting sequence (its admission gate): True when
its adapter (if any) is in a ready slot; otherwise a copy is started if a slot is free, and the
sequence stays in the queue without holding back the others — as a continuation waits for its KV.
When a step has nothing else to run, the card idles until the first copy lands (`idle`).

Timing is the device's emulated time (`now`), so the benchmark's numbers are the emulated card's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mindmotor.common.block_hash import adapter_root
from mindmotor.device.cost_model import LoraStepShape
from mindmotor.model.config import LlamaConfig
from mindmotor.model.lora import AdapterError, LoraAdapter, LoraBatch, LoraStack, load_adapter


@dataclass(eq=False)
class AdapterRecord:
    """One adapter as the engine serves it. `adapter` is None on the cost-only runner (no weights:
    the rank, targets and size are what the emulated card is charged for)."""
    name: str
    path: str
    rank: int
    targets: tuple[str, ...]
    device_bytes: int
    adapter: LoraAdapter | None = None
    epoch: int = 1                        # which time this engine was given this name

    @property
    def hash_root(self) -> bytes:
        """The prefix cache's root for this adapter's requests: its name (what the coordinator's
        router hashes with), and after a reload under the same name which load, so the KV the old
        weights computed is never reused."""
        return adapter_root(self.name if self.epoch == 1 else f"{self.name}#{self.epoch}")


@dataclass
class _Slot:
    record: AdapterRecord | None = None
    ready_at: float = 0.0
    last_used: float = 0.0
    draining: bool = False      # admits no new request: freed for a waiting adapter once its running ones end


class LoraSlots:
    def __init__(self, *, max_loras: int, max_cpu_loras: int, max_rank: int, config: LlamaConfig | None,
                 price_copy: Callable[[int], float], now: Callable[[], float], drain_after_s: float = 2.0):
        if max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {max_loras}")
        if max_cpu_loras < max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be at least max_loras ({max_loras})")
        if max_rank < 1:
            raise ValueError(f"max_lora_rank must be at least 1, got {max_rank}")
        self.max_loras, self.max_cpu_loras, self.max_rank = max_loras, max_cpu_loras, max_rank
        self.config = config
        self.stack = LoraStack(config, max_loras, max_rank) if config is not None else None
        self.price_copy, self.now = price_copy, now
        self._lock = threading.Lock()        # known/host: requests are validated off the engine thread
        self.known: dict[str, str] = {}                          # name → directory
        self.epochs: dict[str, int] = {}                         # name → which add() (the prefix cache's key)
        self.host: OrderedDict[str, AdapterRecord] = OrderedDict()
        self.slots = [_Slot() for _ in range(max_loras)]
        self._busy: set[int] = set()                             # slots in use this step
        self.loads = 0                                           # copies into a slot
        self.load_s = 0.0                                        # their emulated seconds
        self.requests: dict[str, int] = {}                       # per adapter, requests admitted
        self.drain_after_s = drain_after_s
        self._refused_since: dict[str, float] = {}               # request id → first refused for want of a slot

    # ---- known adapters ---------------------------------------------------------------------
    def add(self, name: str, path: str) -> AdapterRecord:
        """Check and register `name` (replacing an adapter of that name). AdapterError: refused."""
        record = self._read(name, path, self.epochs.get(name, 0) + 1)
        with self._lock:
            self.known[name] = path
            self.epochs[name] = record.epoch
            self.host[name] = record
            self.host.move_to_end(name)
            self._trim_host()
        return record

    def add_virtual(self, name: str, rank: int, targets: tuple[str, ...], device_bytes: int) -> AdapterRecord:
        """An adapter with no weights, for the cost-only runner (the simulator, benchmarks)."""
        if rank > self.max_rank:
            raise AdapterError(f"{name}: rank {rank} is above max_lora_rank {self.max_rank}")
        record = AdapterRecord(name, f"<virtual:{name}>", rank, tuple(targets), device_bytes)
        self.known[name] = record.path
        self.host[name] = record
        self._trim_host()
        return record

    def remove(self, name: str) -> bool:
        """Refuse new requests for `name`; the admitted ones finish with the weights they have."""
        with self._lock:
            if name not in self.known:
                return False
            del self.known[name]
            self.host.pop(name, None)
            return True

    def names(self) -> list[str]:
        return sorted(self.known)

    def get(self, name: str) -> AdapterRecord:
        """The record of a known adapter (read again from its directory if the host cache dropped
        it). KeyError: unknown."""
        with self._lock:
            if name not in self.known:
                raise KeyError(name)
            record = self.host.get(name)
            if record is None:
                record = self._read(name, self.known[name], self.epochs[name])
                self.host[name] = record
            self.host.move_to_end(name)
            self._trim_host()
            return record

    def _read(self, name: str, path: str, epoch: int) -> AdapterRecord:
        if self.config is None:
            raise AdapterError(f"{name}: this engine has no model weights (the cost-only runner) to "
                               "apply an adapter directory to")
        adapter = load_adapter(path, self.config, self.max_rank, name=name)
        return AdapterRecord(name, str(path), adapter.rank, adapter.target_modules, adapter.device_bytes(),
                             adapter, epoch=epoch)

    def _trim_host(self) -> None:
        while len(self.host) > self.max_cpu_loras:
            self.host.popitem(last=False)

    # ---- device slots -----------------------------------------------------------------------
    def begin_step(self, holders) -> None:
        """Before scheduling: the slots the sequences holding blocks use are busy."""
        if len(self._refused_since) > 100_000:              # entries of requests aborted while refused
            self._refused_since.clear()
        self._busy = {i for i in (self.slot_of(s.lora) for s in holders if s.lora is not None) if i is not None}

    def slot_of(self, record: AdapterRecord) -> int | None:
        for i, slot in enumerate(self.slots):
            if slot.record is record:
                return i
        return None

    def ready(self, seq) -> bool:
        """The scheduler's admission gate (see the module docstring)."""
        record = seq.lora
        if record is None:
            return True
        now = self.now()
        i = self.slot_of(record)
        if i is not None:
            slot = self.slots[i]
            if slot.ready_at > now or slot.draining:
                return False                                # its copy is under way, or it is being freed
            slot.last_used = now
            self._busy.add(i)
            self._refused_since.pop(seq.request_id, None)
            return True
        free = [j for j, s in enumerate(self.slots) if j not in self._busy and s.ready_at <= now]
        if not free:                                        # every slot in use: it waits its turn, and
            since = self._refused_since.setdefault(seq.request_id, now)
            if now - since >= self.drain_after_s:           # after a while one slot stops taking new
                self._drain_one(now)                        # requests, to be freed for it
            return False
        self._refused_since.pop(seq.request_id, None)
        j = min(free, key=lambda k: (self.slots[k].record is not None, self.slots[k].last_used))
        if self.stack is not None:
            self.stack.set(j, record.adapter)
        seconds = self.price_copy(record.device_bytes)
        self.slots[j] = _Slot(record, ready_at=now + seconds, last_used=now)
        self._busy.add(j)                                   # reserved for it until the copy lands
        self.loads += 1
        self.load_s += seconds
        return False

    def _drain_one(self, now: float) -> None:
        """Without this, adapters with a steady stream of requests would hold their slots forever
        and a rarely used one would never get in (starvation): the least recently admitted slot
        stops admitting, so it frees as soon as its running requests end. One at a time, and only
        for a request refused for `drain_after_s` (draining sooner shrinks every batch: measured in
        benchmarks/lora.py, draining at once cut the one-slot baseline's throughput 7×)."""
        if any(s.draining for s in self.slots):
            return
        candidates = [j for j, s in enumerate(self.slots)         # each adapter keeps its slot a while
                      if s.record is not None and s.ready_at + self.drain_after_s <= now]
        if candidates:
            self.slots[min(candidates, key=lambda k: self.slots[k].last_used)].draining = True

    @property
    def loading(self) -> bool:
        now = self.now()
        return any(s.record is not None and s.ready_at > now for s in self.slots)

    def idle(self) -> float:
        """Emulated seconds until the first copy under way lands (0 if none)."""
        now = self.now()
        pending = [s.ready_at - now for s in self.slots if s.record is not None and s.ready_at > now]
        return min(pending) if pending else 0.0

    def count_request(self, record: AdapterRecord | None) -> None:
        if record is not None:
            self.requests[record.name] = self.requests.get(record.name, 0) + 1

    # ---- a step's batch ---------------------------------------------------------------------
    def batch(self, ordered, num_tokens: list[int]) -> LoraBatch | None:
        """Each row's slot (-1: base) for sequences `ordered` with `num_tokens` rows each; None when
        no row has an adapter."""
        slots = [self.slot_of(s.seq.lora) if s.seq.lora is not None else -1 for s in ordered]
        if all(x == -1 for x in slots) or self.stack is None:
            return None
        if any(x is None for x in slots):
            raise RuntimeError("a scheduled sequence's adapter is in no device slot")
        return LoraBatch(self.stack, np.repeat(np.asarray(slots, np.int64), num_tokens))

    def step_shape(self, ordered, num_tokens: list[int]) -> LoraStepShape | None:
        """What the emulated card is charged for the step's LoRA matmuls."""
        records = [(s.seq.lora, n) for s, n in zip(ordered, num_tokens) if s.seq.lora is not None]
        if not records:
            return None
        targets = sorted({t for r, _ in records for t in r.targets})
        distinct = {id(r): r for r, _ in records}
        return LoraStepShape(rows=sum(n for _, n in records), adapters=len(distinct),
                             rank=max(r.rank for r in distinct.values()), targets=tuple(targets))

    def info(self, running, waiting) -> dict:
        """vLLM's lora_requests_info: adapters of running and waiting requests, and max_loras."""
        return {"running_lora_adapters": sorted({s.lora.name for s in running if s.lora is not None}),
                "waiting_lora_adapters": sorted({s.lora.name for s in waiting if s.lora is not None}),
                "max_lora": self.max_loras}
