"""Token logprobs from the worker, in OpenAI's two shapes: chat (`content` entries with token,
logprob, bytes, top_logprobs) and completions (parallel lists tokens / token_logprobs /
top_logprobs / text_offset). Token strings are the token's own text; bytes are its raw bytes
(byte-level BPE tokens may hold part of a UTF-8 character)."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from mindmotor.common.tokenizer import Tokenizer
from mindmotor.protocol import worker_pb2 as pb


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: the character that stands for each byte (GPT-2's scheme: printable
    bytes stand for themselves, the others are shifted above U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return {c: b for b, c in chars.items()}


class TokenText:
    """Text and bytes of single tokens, cached."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def bytes(self, token_id: int) -> list[int]:
        raw = self._bytes.get(token_id)
        if raw is None:
            piece = self.tokenizer.id_to_token(token_id) or ""
            alphabet = _byte_level_alphabet()
            if piece and all(c in alphabet for c in piece):
                raw = [alphabet[c] for c in piece]
            else:
                raw = list(self.text(token_id).encode("utf-8"))
            self._bytes[token_id] = raw
        return raw


def chat_logprobs(entries: Sequence[pb.TokenLogprob], tokens: TokenText, top_n: int) -> list[dict]:
    out = []
    for e in entries:
        out.append({
            "token": tokens.text(e.token_id), "logprob": e.logprob, "bytes": tokens.bytes(e.token_id),
            "top_logprobs": [{"token": tokens.text(t.token_id), "logprob": t.logprob,
                              "bytes": tokens.bytes(t.token_id)} for t in e.top[:top_n]],
        })
    return out


class CompletionLogprobs:
    """The completions `logprobs` object of one choice, built piece by piece."""

    def __init__(self, tokens: TokenText, top_n: int, text_offset: int = 0):
        self.tokens = tokens
        self.top_n = top_n
        self.offset = text_offset

    def piece(self, entries: Sequence[pb.TokenLogprob]) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            text = self.tokens.text(e.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(e.logprob)
            top = {}
            for t in e.top[:self.top_n]:
                top.setdefault(self.tokens.text(t.token_id), t.logprob)
            out["top_logprobs"].append(top if self.top_n else None)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    @staticmethod
    def merge(parts: Sequence[dict]) -> dict:
        merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for part in parts:
            for key in merged:
                merged[key].extend(part[key])
        return merged
