"""`OutputRecall`: what each Generate/Prefill call of this worker produced, by request id — live
while the call runs, then kept for `retention_s` after it ends (however it ends: finished, the
client gone, aborted) — for the `Recall` RPC. A coordinator that takes over a client's stream from
a coordinator that died asks for the output tokens the client has, then continues the request as
a continuation (the tokens are kept, never generated again). Token ids only: a few bytes per token,
bounded by `max_tokens` tokens in all (oldest forgotten first)."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Recalled:
    digest: bytes
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""               # a FinishReason, "" while the call runs
    stop_reason: int | str | None = None
    ended_at: float | None = None          # monotonic; None while the call runs


class OutputRecall:
    def __init__(self, retention_s: float = 60.0, max_tokens: int = 4_000_000,
                 clock: Callable[[], float] = time.monotonic):
        self.retention_s = retention_s
        self.max_tokens = max_tokens
        self.clock = clock
        self._live: dict[str, Recalled] = {}
        self._ended: OrderedDict[str, Recalled] = OrderedDict()
        self._ended_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.retention_s > 0

    def start(self, request_id: str, digest: bytes, earlier: list[int]) -> Recalled:
        """The record of a call that starts (`earlier`: a continuation's output so far); the
        caller appends to its `output_token_ids` as tokens go out."""
        record = Recalled(digest, list(earlier))
        if self.enabled:
            self._live[request_id] = record
        return record

    def end(self, request_id: str, record: Recalled) -> None:
        if not self.enabled or self._live.pop(request_id, None) is not record:
            return
        record.ended_at = self.clock()
        self._ended[request_id] = record
        self._ended_tokens += len(record.output_token_ids)
        self._expire()

    def get(self, request_id: str) -> Recalled | None:
        self._expire()
        return self._live.get(request_id) or self._ended.get(request_id)

    def _expire(self) -> None:
        now = self.clock()
        while self._ended:
            request_id, oldest = next(iter(self._ended.items()))
            if now - oldest.ended_at < self.retention_s and self._ended_tokens <= self.max_tokens:
                return
            del self._ended[request_id]
            self._ended_tokens -= len(oldest.output_token_ids)
