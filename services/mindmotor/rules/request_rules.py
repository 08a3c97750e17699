"""The rules every request must pass before it reaches an engine thread, in one place: the
coordinator applies them to an HTTP request (a 400 naming the parameter), the worker and the
engine to a gRPC or offline one (INVALID_ARGUMENT with the same message). `SamplingParams`
applies the per-field ranges; this module holds the rest and the limits both share.

The ranges are those of the wire (worker.proto: int32 token ids and top_k, int64 seed, uint32
token counts) and of numpy (a seed must be a non-negative integer), so that a value accepted here
can neither fail to serialize nor raise on the engine thread.
"""

from __future__ import annotations

import math
import operator
from typing import Iterable, Sequence

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
INT64_MAX = 2**63 - 1


class InvalidRequest(ValueError):
    """A request that breaks a rule; `param` names the offending field (OpenAI's `param`)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def check_text(text: str, param: str) -> str:
    """`text` unchanged if it is valid Unicode (encodable as UTF-8): a lone surrogate such as
    "\\ud800", which JSON can carry but no tokenizer or protobuf can, is refused."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"{param} is not valid Unicode text: it contains a lone surrogate "
            f"(U+{ord(text[exc.start]):04X} at character {exc.start})", param=param) from None
    return text


def check_token_ids(ids: Iterable[int], what: str, vocab_size: int | None = None,
                    param: str | None = None) -> list[int]:
    """The ids as a list of ints, each in [0, vocab_size) (or in [0, 2^31) — the wire's int32 —
    when the vocabulary is not known here). `what` names them in the message, `param` (default:
    `what`) is the field."""
    param = param or what
    if type(ids) is list and set(map(type, ids)) <= {int}:     # the usual case, checked at C speed
        out = list(ids)
    else:
        out = []
        for t in ids:
            try:
                if isinstance(t, bool):
                    raise TypeError
                out.append(operator.index(t))       # ints and numpy integers; not floats, not bools
            except TypeError:
                raise InvalidRequest(f"{what} must be integers, got {t!r}", param=param) from None
    limit = INT32_MAX + 1 if vocab_size is None else min(vocab_size, INT32_MAX + 1)
    if out and (min(out) < 0 or max(out) >= limit):
        bad = [t for t in out if not 0 <= t < limit]
        where = f"the vocabulary [0, {vocab_size})" if vocab_size is not None else "[0, 2^31)"
        raise InvalidRequest(f"{what} {bad[:5]} are outside {where}", param=param)
    return out


def resolve_max_tokens(prompt_len: int, max_tokens: int | None, min_tokens: int, max_model_len: int) -> int:
    """The number of tokens a request may produce: `max_tokens`, or all the room the context has
    left after the prompt. InvalidRequest when the prompt fills the context, when prompt plus
    max_tokens exceed it, or when min_tokens exceeds what is left."""
    if prompt_len >= max_model_len:
        raise InvalidRequest(
            f"the prompt has {prompt_len} tokens, but this model's maximum context length is "
            f"{max_model_len} tokens (prompt plus at least one generated token)",
            param="prompt", code="context_length_exceeded")
    room = max_model_len - prompt_len
    if max_tokens is not None and max_tokens > room:
        raise InvalidRequest(
            f"this model's maximum context length is {max_model_len} tokens, but "
            f"{prompt_len + max_tokens} were requested ({prompt_len} in the prompt, {max_tokens} in the "
            "completion); reduce the prompt or max_tokens", param="max_tokens", code="context_length_exceeded")
    if min_tokens > room:
        raise InvalidRequest(
            f"min_tokens ({min_tokens}) exceeds the room left in the context: this model's maximum context "
            f"length is {max_model_len} tokens and the prompt has {prompt_len}, so at most {room} can be "
            "generated; reduce min_tokens or the prompt", param="min_tokens", code="context_length_exceeded")
    return room if max_tokens is None else max_tokens


def check_choices(num_prompts: int, n: int, max_n: int, max_choices: int) -> int:
    """The number of choices of a request (prompts × n); InvalidRequest when n is over its limit
    or the choices could never be admitted (more than `max_choices`, the most a model may have
    outstanding at once) — not worth a retry, unlike a momentarily full queue (429)."""
    if n > max_n:
        raise InvalidRequest(f"n must be at most {max_n}, got {n}", param="n")
    choices = num_prompts * n
    if choices > max_choices:
        raise InvalidRequest(
            f"the request asks for {choices} choices ({num_prompts} prompts × n {n}), but a model takes at "
            f"most {max_choices} outstanding choices at once, so it could never be admitted; send fewer "
            "prompts or a smaller n", param="n" if num_prompts == 1 else "prompt", code="too_many_choices")
    return choices


def check_texts(items: Sequence[str], param: str) -> None:
    """`check_text` over several strings."""
    for item in items:
        check_text(item, param)


MAX_LOGIT_BIAS = 100.0           # OpenAI's range for a logit_bias value
MAX_BAD_WORDS = 64


def check_logit_bias(bias) -> dict[int, float]:
    """`logit_bias` as {token id: bias}: keys are token ids (ints, or their decimal strings as
    JSON objects carry them), values finite numbers in [-100, 100]."""
    if not bias:
        return {}
    if not isinstance(bias, dict):
        raise InvalidRequest(f"logit_bias must be an object mapping token ids to numbers, got {bias!r}",
                             param="logit_bias")
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key) if isinstance(key, str) else operator.index(key)
            if isinstance(key, bool):
                raise TypeError
        except (TypeError, ValueError):
            raise InvalidRequest(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise InvalidRequest(f"logit_bias values must be numbers in [-100, 100], got {value!r} for token "
                                 f"{key}", param="logit_bias")
        out[token] = float(value)
    check_token_ids(out, "logit_bias token ids", param="logit_bias")
    return out


def check_bad_words(words) -> list[str]:
    """`bad_words`: at most 64 non-empty strings of valid Unicode."""
    if isinstance(words, str):
        words = [words]
    words = list(words or [])
    if len(words) > MAX_BAD_WORDS:
        raise InvalidRequest(f"at most {MAX_BAD_WORDS} bad_words are allowed, got {len(words)}", param="bad_words")
    if any(not isinstance(w, str) or not w for w in words):
        raise InvalidRequest("bad_words must be non-empty strings", param="bad_words")
    check_texts(words, "bad_words")
    return words
