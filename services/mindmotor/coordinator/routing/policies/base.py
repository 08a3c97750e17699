"""What every routing policy sees: the request (`RouteRequest`) and the candidate instances
(`InstanceView`s of one model and version, routable, sorted by id, never empty)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from mindmotor.common.block_hash import ROOT_HASH, adapter_root, block_hashes

from mindmotor.coordinator.routing.table import InstanceView


@dataclass
class RouteRequest:
    prompt_token_ids: Sequence[int] = ()
    max_new_tokens: int = 0
    lora: str | None = None            # the LoRA adapter (routing/filters.py: instances holding it)
    _hashes: dict[int, list[bytes]] = field(default_factory=dict, repr=False)

    @property
    def cost_tokens(self) -> int:
        """What the request adds to an instance's outstanding tokens while in flight."""
        return len(self.prompt_token_ids) + self.max_new_tokens

    def block_hashes(self, block_size: int) -> list[bytes]:
        """The chained hashes of the prompt's full blocks (as the workers' prefix cache keys them)."""
        hashes = self._hashes.get(block_size)
        if hashes is None:
            root = adapter_root(self.lora) if self.lora else ROOT_HASH     # as engine/lora_slots.py keys it
            hashes = self._hashes[block_size] = block_hashes(self.prompt_token_ids, block_size, root=root)
        return hashes


class Policy(Protocol):
    def choose(self, candidates: Sequence[InstanceView], request: RouteRequest) -> InstanceView:
        """One of `candidates` (never empty)."""

    def on_routed(self, instance: InstanceView, request: RouteRequest) -> None:
        """The request was sent to `instance` (policies that learn from it override this)."""
