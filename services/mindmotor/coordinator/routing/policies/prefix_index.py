"""`PrefixIndex`: which prompt blocks each instance probably holds in its prefix cache — the
hashes of the prompts this coordinator sent there, most recent last, at most `max_blocks` per
instance (the oldest are forgotten first, as the worker's LRU evicts them)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class PrefixIndex:
    def __init__(self, max_blocks: int):
        self.max_blocks = max_blocks
        self._blocks: dict[str, OrderedDict[bytes, None]] = {}

    def add(self, instance_id: str, hashes: Sequence[bytes]) -> None:
        blocks = self._blocks.setdefault(instance_id, OrderedDict())
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def match(self, instance_id: str, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of `hashes` the instance holds."""
        blocks = self._blocks.get(instance_id)
        if not blocks:
            return 0
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def forget(self, instance_id: str) -> None:
        self._blocks.pop(instance_id, None)

    def size(self, instance_id: str) -> int:
        return len(self._blocks.get(instance_id, ()))
