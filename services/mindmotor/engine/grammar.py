"""Structured outputs: a request's constraint (JSON schema, any JSON object, regex, choice, EBNF/Lark
grammar) compiled by llguidance into a grammar, one `LLMatcher` per constrained sequence, and the
per-step token masks of a batch's constrained rows computed together (`LLExecutor`, in parallel
off the GIL) — started before the step's forward pass (`prefetch`) so that they compute while the
model runs, then applied to the logits with one table lookup and one add. The matcher follows the
sequence's output tokens, so a preempted sequence keeps its state and a continued one (migration,
the decode side of a P/D split) rebuilds it by consuming the output produced elsewhere."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark

from .request_rules import InvalidRequest

KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_SPEC_CHARS = 256 * 1024


@dataclass(frozen=True)
class Constraint:
    kind: str          # one of KINDS
    spec: str = ""     # json: the schema (JSON text); regex; choice: a JSON list of strings; grammar: EBNF/Lark


def grammar_text(kind: str, spec: str, param: str = "structured_outputs") -> str:
    """The llguidance grammar of a constraint; InvalidRequest (naming `param`) when it is not valid."""
    if kind not in KINDS:
        raise InvalidRequest(f"unknown structured output kind {kind!r}; expected one of {', '.join(KINDS)}",
                             param=param)
    if len(spec) > MAX_SPEC_CHARS:
        raise InvalidRequest(f"the {kind} constraint has {len(spec)} characters; at most {MAX_SPEC_CHARS}",
                             param=param)
    return _compile(kind, spec, param)


@lru_cache(maxsize=256)
def _compile(kind: str, spec: str, param: str) -> str:
    try:
        if kind == "json_object":
            grammar = llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}',
                                                                    defaults={"whitespace_flexible": False})
        elif kind == "json":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(spec, defaults={"whitespace_flexible": False})
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(spec)
        elif kind == "choice":
            choices = json.loads(spec)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
                raise ValueError("choice must be a non-empty list of non-empty strings")
            grammar = llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
        else:
            grammar = llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec))
    except Exception as exc:  # noqa: BLE001 - every compile failure is the request's
        raise InvalidRequest(f"the {kind} constraint is not valid: {exc}", param=param) from None
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    if error:
        raise InvalidRequest(f"the {kind} constraint is not valid: {error.strip()}", param=param)
    return grammar


def _bit_table() -> np.ndarray:
    """[256, 8] float32: for each mask byte, 0 where its bit (little-endian) allows the token,
    -inf where not."""
    bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(bool)
    return np.where(bits, np.float32(0), np.float32(-np.inf)).astype(np.float32)


BIT_TABLE = _bit_table()


@dataclass
class _Prefetch:
    matchers: list
    bitmask: np.ndarray
    done: Future


class GrammarEngine:
    """Matchers over one tokenizer and vocabulary, and the batch's masks. With `overlap`, the masks
    of a step are computed on a background thread from `prefetch` (called before the forward pass)
    and `apply` only waits for them (the exposed part) and applies them."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                 overlap: bool = True):
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                eos_token=list(eos_token_ids) or None)
        self.executor = llguidance.LLExecutor()
        self.words = (vocab_size + 31) // 32
        self.mask_time_s = 0.0                  # host time the sampler spent on masks (the exposed cost)
        self.compute_time_s = 0.0               # time computing masks, wherever it ran
        self.masked_rows = 0
        self.overlap = overlap
        self._pool: ThreadPoolExecutor | None = None
        self._pending: _Prefetch | None = None

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        m = llguidance.LLMatcher(self.tokenizer, grammar_text(constraint.kind, constraint.spec), log_level=0)
        if m.is_error():
            raise InvalidRequest(f"the {constraint.kind} constraint is not valid: {m.get_error()}",
                                 param="structured_outputs")
        return m

    def prefetch(self, matchers: list) -> None:
        """Start computing the next-token masks of `matchers` in the background. Call it after
        their last `advance` before the step samples; `apply` then uses these masks."""
        self.settle()
        self._pending = None
        if not self.overlap or not matchers:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        bitmask = np.full((len(matchers), self.words), -1, dtype=np.int32)
        self._pending = _Prefetch(matchers, bitmask, self._pool.submit(self._fill, matchers, bitmask))

    def settle(self) -> None:
        """Wait for a prefetch under way: no matcher may be touched while one computes."""
        if self._pending is not None:
            wait([self._pending.done])

    def masked(self, logits: np.ndarray, rows: list[int], matchers: list) -> np.ndarray:
        """`logits` with -inf at every token a row's matcher does not allow next (a new array;
        `logits` is left as it is)."""
        bitmask = self._masks(matchers)
        bias = np.take(BIT_TABLE, bitmask.view(np.uint8), axis=0).reshape(len(rows), -1)[:, :logits.shape[1]]
        if len(rows) == logits.shape[0]:
            return logits + bias
        out = logits.copy()
        out[rows] += bias
        return out

    def _masks(self, matchers: list) -> np.ndarray:
        """[len(matchers), words] bitmasks: the prefetched ones when they cover `matchers`."""
        self.settle()
        pending, self._pending = self._pending, None
        if pending is not None and pending.done.exception() is None:   # else computed here, raising here
            at = {id(m): i for i, m in enumerate(pending.matchers)}
            if all(id(m) in at for m in matchers):
                return pending.bitmask[[at[id(m)] for m in matchers]]
        bitmask = np.full((len(matchers), self.words), -1, dtype=np.int32)
        self._fill(matchers, bitmask)
        return bitmask

    def _fill(self, matchers: list, bitmask: np.ndarray) -> None:
        started = time.perf_counter()
        self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.ctypes.data,
                                              self.words * 4, len(matchers))
        self.compute_time_s += time.perf_counter() - started


def advance(matcher, tokens) -> None:
    """Consume `tokens` (the sequence's new output); ValueError when the grammar refuses one."""
    for token in tokens:
        if matcher.is_stopped():
            return
        if not matcher.consume_token(int(token)):
            raise ValueError(f"token {int(token)} does not follow the request's structured output grammar: "
                             f"{matcher.get_error()}")
