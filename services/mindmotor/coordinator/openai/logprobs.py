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


MIN_LOGPROB = -9999.0        # what OpenAI and vLLM send for -inf (JSON has no infinity)


def _value(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def token_name(tokens: TokenText, token_id: int, as_ids: bool) -> str:
    """The token's text, or vLLM's `token_id:<id>` (return_tokens_as_token_ids)."""
    return f"token_id:{token_id}" if as_ids else tokens.text(token_id)


def chat_logprobs(entries: Sequence[pb.TokenLogprob], tokens: TokenText, top_n: int,
                  as_ids: bool = False) -> list[dict]:
    """Chat `logprobs.content`: each token with its `top_n` most likely alternatives (OpenAI's
    shape: exactly the top n, which need not contain the sampled token)."""
    out = []
    for e in entries:
        out.append({
            "token": token_name(tokens, e.token_id, as_ids), "logprob": _value(e.logprob),
            "bytes": tokens.bytes(e.token_id),
            "top_logprobs": [{"token": token_name(tokens, t.token_id, as_ids), "logprob": _value(t.logprob),
                              "bytes": tokens.bytes(t.token_id)} for t in e.top[:top_n]],
        })
    return out


def vllm_prompt_logprobs(first_token: int, entries: Sequence[pb.TokenLogprob], tokens: TokenText,
                         top_n: int, as_ids: bool = False) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then per token a dict
    {token id: {logprob, rank, decoded_token}} of the prompt token and its top_n alternatives."""
    out: list[dict | None] = [None]
    for e in entries:
        entry = {}
        for token_id, logprob, rank in [(e.token_id, e.logprob, e.rank if e.HasField("rank") else None),
                                        *[(t.token_id, t.logprob, i + 1) for i, t in enumerate(e.top[:top_n])]]:
            entry.setdefault(str(token_id), {"logprob": _value(logprob), "rank": rank,
                                             "decoded_token": token_name(tokens, token_id, as_ids)})
        out.append(entry)
    return out


class CompletionLogprobs:
    """The completions `logprobs` object of one choice, built piece by piece. As in vLLM (and
    OpenAI's completions), each `top_logprobs` entry holds the top_n alternatives and the token
    itself (up to top_n + 1 entries; with logprobs 0, the token alone)."""

    def __init__(self, tokens: TokenText, top_n: int, text_offset: int = 0, as_ids: bool = False):
        self.tokens = tokens
        self.top_n = top_n
        self.offset = text_offset
        self.as_ids = as_ids

    def _name(self, token_id: int) -> str:
        return token_name(self.tokens, token_id, self.as_ids)

    def piece(self, entries: Sequence[pb.TokenLogprob]) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            self._add(out, e.token_id, e.logprob, self._top(e))
        return out

    def _top(self, e: pb.TokenLogprob) -> dict:
        top = {}
        for t in e.top[:self.top_n]:
            top.setdefault(self._name(t.token_id), _value(t.logprob))
        top[self._name(e.token_id)] = _value(e.logprob)   # the token's own, when two share a text
        return top

    def _add(self, out: dict, token_id: int, logprob: float | None, top: dict | None) -> None:
        text = self._name(token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(None if logprob is None else _value(logprob))
        out["top_logprobs"].append(top)
        out["text_offset"].append(self.offset)
        self.offset += len(self.tokens.text(token_id))

    def prompt(self, prompt_token_ids: Sequence[int], entries: Sequence[pb.TokenLogprob]) -> dict:
        """The prompt's tokens (echo): the first has no logprob (null), the others theirs from
        the prefill (`entries`, one per prompt token after the first)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if prompt_token_ids:
            self._add(out, prompt_token_ids[0], None, None)
        for e in entries:
            self._add(out, e.token_id, e.logprob, self._top(e))
        return out

    @staticmethod
    def merge(parts: Sequence[dict]) -> dict:
        merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for part in parts:
            for key in merged:
                merged[key].extend(part[key])
        return merged
