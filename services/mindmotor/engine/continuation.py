"""`Continuation`: a request whose first output tokens were made elsewhere — the one idea behind
both migration and the prefill/decode split.

- A request **migrated** after its instance failed is a continuation *without* KV: its output so
  far is recomputed here, as after a preemption.
- The decode half of a **prefill/decode split** is a continuation *with* a KV source: the prefill
  instance made the first token and holds the prompt's KV; the scheduler reserves blocks, the
  request waits in `WAITING_FOR_KV` while the worker's KV connector pulls it, and decodes on.
  A pull that fails turns it into the first kind (recomputed here).

Either way the engine takes it through one path (`LLMEngine._continue`): the seeded generator
skips the draws of the tokens made elsewhere, the grammar state follows them, penalties and
`min_tokens` / `max_tokens` count them, stop strings may begin in their text, and the stream goes
on after the `sent_chars` characters the client already has.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVSource:
    """Where the prompt's KV of a continuation is: a pinned prefill on another worker."""
    address: str                 # host:port of the worker holding it
    handle: str                  # its pin there
    node: str = ""               # that worker's node: same node = HCCS, else the inter-node link
    cached_tokens: int = 0       # prompt tokens its prefix cache held (reported as cached usage)


@dataclass(frozen=True)
class Continuation:
    """The output made elsewhere: its token ids, the characters of its text the client already
    has, and (optionally) where the prompt's KV can be pulled from."""
    output_token_ids: tuple[int, ...]
    sent_chars: int = 0
    kv_source: KVSource | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_token_ids", tuple(int(t) for t in self.output_token_ids))
