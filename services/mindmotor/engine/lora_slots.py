"""`LoraSlots`: which LoRA adapters an engine knows, which sit in host memory, and which are in the
`max_loras` device slots a step's batch draws from.

- **Known adapters** (`add` / `remove`): name → directory, each checked when added
  (`model.lora.load_adapter`: a bad adapter is refused with its reason and changes nothing).
  A request names one; an unknown name is refused. Removing a name refuses new requests for it;
  requests already admitted keep their `AdapterRecord` (weights included) and finish normally.
- **Host cache**: the loaded records of up to `max_cpu_loras` adapters, least recently used
  dropped first (a dropped one is read from its directory again when next asked for).
- **Device slots**: `max_loras` of them; a step's batch mixes the base model and at most that many
  adapters (vLLM's `--max-loras`). Which adapters, is chosen anew before every step
  (`begin_step`) — not held for a request's lifetime, which made a rarely used adapter's request
  wait seconds for a slot to drain (benchmarks/lora.py measured it: p99 TTFT ~100× the base's):
  first the adapters of the requests at the head of the queue that could be admitted now (their
  first token waits on it; with running adapters, one place is kept for them; with a backlog only
  those passed over for `PATIENCE` steps, so that a burst does not spread over every adapter), then
  the running adapters, the most work left first (with aging: no starvation; and a bonus for those
  in a slot already: no thrash). A running sequence whose adapter is not chosen keeps its KV and skips the step.
  A chosen adapter not in a slot takes the least recently used slot of an unchosen one: a copy
  over the card's host link (`EmulatedDevice.price_host_copy`) — one of at most `SYNC_COPY_S` is
  made before the step (the step waits for it: `take_stall`), a longer one overlaps the steps and
  its adapter's requests wait for it without holding back others, as a continuation waits for
  its KV. When a step has nothing else to run, the card idles until the first copy lands (`idle`).

The scheduler asks `ready(seq)` before admitting a waiting sequence and before scheduling a running
one (its gates): True when its adapter (if any) is one of the step's, loaded.

Timing is the device's emulated time (`now`), so the benchmark's numbers are the emulated card's.
"""

from __future__ import annotations

import heapq
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


# A slot copy this short (rank 8 on q/k/v/o of a 7B model: 10 MB, ~0.2 ms over a 910B's host
# link, against steps of 10+ ms) is made before the step that needs it, which waits for it; a
# longer one overlaps the steps and its adapter's requests wait for it instead.
SYNC_COPY_S = 0.002
# The running adapters' order (`begin_step`), in tokens of work left: measured on
# benchmarks/lora.py (--quick and full), most-work-left first beat most-sequences-first (throughput
# 0.80 vs 0.77 of the base's at --quick); the aging and the bonus changed it by ±1 % and cut the slot
# copies 3×.
AGING = 2.0
RESIDENT_BONUS = 16.0
# Newcomers' adapters go first while the queue holds at most SHORT_QUEUE × max_loras requests; with
# a longer one only those passed over for PATIENCE steps (the full benchmark's burst: newcomers
# always first spread the running requests over all 16 adapters, 1.68× the one-slot capacity
# instead of 2.0×; PATIENCE 20 / 50 / 200 / 1000 steps gave 1.88 / 2.02 / 2.00 / 2.05×).
SHORT_QUEUE = 2
PATIENCE = 50


@dataclass
class _Slot:
    record: AdapterRecord | None = None
    ready_at: float = 0.0
    last_used: float = 0.0


class LoraSlots:
    def __init__(self, *, max_loras: int, max_cpu_loras: int, max_rank: int, config: LlamaConfig | None,
                 price_copy: Callable[[int], float], now: Callable[[], float]):
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
        self._chosen: set[int] = set()                           # id() of this step's adapters
        self._waited: dict[int, int] = {}                        # id() of a running adapter -> steps left out
        self._waited_new: dict[int, int] = {}                    # id() of a newcomer's adapter -> steps left out
        self._stall_s = 0.0
        self.loads = 0                                           # copies into a slot
        self.load_s = 0.0                                        # their emulated seconds
        self.requests: dict[str, int] = {}                       # per adapter, requests admitted

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
    def begin_step(self, holders, waiting=(), admissible: int | None = None) -> None:
        """Before scheduling: choose the adapters of this step's batch (at most `max_loras`) and
        put each in a slot (see the module docstring). `holders`: the sequences holding blocks
        (running ones among them); `waiting`: the queue, in order; `admissible`: how many of its
        head could be admitted now (None: all)."""
        running: dict[int, list] = {}                       # id(record) -> [record, most tokens left]
        for s in holders:
            if s.lora is not None:
                entry = running.setdefault(id(s.lora), [s.lora, 0])
                entry[1] = max(entry[1], s.params.max_tokens - s.num_output_tokens if s.params.max_tokens else 1)
        newcomers: list[AdapterRecord] = []                 # of the admissible head of the queue, in order
        looked = 8 * self.max_loras                         # enough heads to find the newcomers' adapters
        heads = heapq.nsmallest(max(0, min(looked, len(waiting) if admissible is None else admissible)), waiting)
        for s in heads:
            if s.lora is not None and s.lora not in newcomers:
                newcomers.append(s.lora)
        chosen: list[AdapterRecord] = []
        # newcomers first (their first token waits on it) while the queue is short; with a long
        # one (a backlog: capacity matters) only those passed over for PATIENCE steps, else the
        # running adapters would be spread over more and more adapters, each step serving few of
        # them. With running adapters one place stays theirs, so that a step always makes progress
        # (with one slot a patient newcomer takes it now and then).
        patient = [r for r in newcomers if self._waited_new.get(id(r), 0) >= PATIENCE]
        urgent = newcomers if len(waiting) <= SHORT_QUEUE * self.max_loras else patient
        room = self.max_loras - (1 if running else 0)
        for record in urgent:
            if len(chosen) >= room:
                break
            chosen.append(record)
        if not chosen and patient:
            chosen.append(patient[0])
        # then the running adapters, the most work left first (the tokens its longest sequence may
        # still make: the steps it needs at least), plus AGING per step it was left out (no adapter
        # starves) and RESIDENT_BONUS if it is in a slot already (no copy: less thrash)
        def need(entry) -> float:
            record, left = entry
            resident = RESIDENT_BONUS if self.slot_of(record) is not None else 0
            return left + AGING * self._waited.get(id(record), 0) + resident

        by_need = sorted(running.values(), key=need, reverse=True)
        for record, _ in by_need:
            if len(chosen) >= self.max_loras:
                break
            if record not in chosen:
                chosen.append(record)
        for record in newcomers:                             # places left: the other newcomers
            if record not in chosen and len(chosen) < self.max_loras:
                chosen.append(record)
        self._waited_new = {id(r): self._waited_new.get(id(r), 0) + 1 for r in newcomers if r not in chosen}
        for record, _ in running.values():
            key = id(record)
            self._waited[key] = 0 if record in chosen else self._waited.get(key, 0) + 1
        self._waited = {k: v for k, v in self._waited.items() if k in running}
        self._chosen = {id(r) for r in chosen}
        self._place(chosen)

    def _place(self, chosen: list[AdapterRecord]) -> None:
        """Every chosen adapter into a slot: those already in one stay, the others take the slots of
        adapters not chosen, least recently used first. A copy short enough (`SYNC_COPY_S`) is made
        before the step (the step waits for it: `take_stall`); a longer one runs beside the steps and
        the adapter's requests wait for it."""
        now = self.now()
        keep = {self.slot_of(r) for r in chosen} - {None}
        for record in chosen:
            if self.slot_of(record) is not None:
                self.slots[self.slot_of(record)].last_used = now
                continue
            free = [j for j in range(len(self.slots)) if j not in keep and self.slots[j].ready_at <= now]
            if not free:                                    # every other slot's copy is still under way
                self._chosen.discard(id(record))
                continue
            j = min(free, key=lambda k: (self.slots[k].record is not None, self.slots[k].last_used))
            if self.stack is not None:
                self.stack.set(j, record.adapter)
            seconds = self.price_copy(record.device_bytes)
            synchronous = seconds <= SYNC_COPY_S
            if synchronous:
                self._stall_s += seconds
            self.slots[j] = _Slot(record, ready_at=now if synchronous else now + seconds, last_used=now)
            keep.add(j)
            self.loads += 1
            self.load_s += seconds

    def take_stall(self) -> float:
        """Emulated seconds of this step's slot copies made before it (the step waits for them)."""
        stall, self._stall_s = self._stall_s, 0.0
        return stall

    def slot_of(self, record: AdapterRecord) -> int | None:
        for i, slot in enumerate(self.slots):
            if slot.record is record:
                return i
        return None

    def ready(self, seq) -> bool:
        """The scheduler's gates (admission, and running sequences each step): True when the
        sequence's adapter (if any) is one of this step's and its slot is loaded."""
        record = seq.lora
        if record is None:
            return True
        if id(record) not in self._chosen:
            return False
        i = self.slot_of(record)
        return i is not None and self.slots[i].ready_at <= self.now()

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
