"""`ResumedText`: a request's text after it moved to another worker.

The new worker is given the prompt plus the tokens already produced, so its own detokenizer
starts mid-stream: it cannot finish a character whose first bytes the old worker produced, it
never sees text the old worker held back (the tail that might begin a stop string), and it cannot
match a stop string that began before the move. So after a move the coordinator makes the text
itself, from all the tokens produced since the start, with the same rules as the engine:
incremental detokenization, the tail held back while it may begin a stop string, the text cut at
the first stop string.
"""

from __future__ import annotations

from typing import Sequence

from mindmotor.common.tokenizer import IncrementalDetokenizer, Tokenizer


class ResumedText:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], produced: Sequence[int],
                 sent_chars: int, stop: Sequence[str] = (), include_stop: bool = False):
        self.detok = IncrementalDetokenizer(tokenizer, prompt_token_ids)
        if produced:
            self.detok.add(produced)
        self.sent = sent_chars                   # characters the client has
        self.stop = list(stop)
        self.include_stop = include_stop
        self.hold = max(map(len, self.stop)) - 1 if self.stop else 0
        self._search_from = max(0, sent_chars - self.hold)

    def add(self, token_ids: Sequence[int], finished: bool) -> tuple[str, str | None]:
        """The text to send for `token_ids`, and the stop string that ended the request (if any)."""
        if token_ids:
            self.detok.add(token_ids)
        if finished:
            self.detok.flush()
        text = self.detok.text
        hit = self._find_stop(text)
        if hit is not None:
            at, stop = hit
            end = at + len(stop) if self.include_stop else at
            delta = text[self.sent:end]
            self.sent = max(self.sent, end)
            return delta, stop
        visible = len(text) if finished else max(self.sent, len(text) - self.hold)
        delta = text[self.sent:visible]
        self.sent = visible
        self._search_from = max(self._search_from, len(text) - self.hold)
        return delta, None

    def _find_stop(self, text: str) -> tuple[int, str] | None:
        best = None
        for stop in self.stop:
            at = text.find(stop, self._search_from)
            if at != -1 and (best is None or at < best[0]):
                best = (at, stop)
        return best
