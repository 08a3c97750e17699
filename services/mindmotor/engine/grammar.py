"""Structured outputs: a request's constraint (JSON schema, any JSON object, regex, choice, EBNF/Lark
grammar) compiled by llguidance into a grammar, one `LLMatcher` per constrained sequence, and the
per-step token masks of a batch's constrained rows computed together (`LLExecutor`, in parallel
off the GIL) — started before the step's forward pass (`prefetch`) so that they compute while the
model runs, then applied to the logits with one table lookup and one add. The matcher follows the
sequence's output tokens, so a preempted sequence keeps its state and a continued one (migration,
the decode side of a P/D split) rebuilds it by consuming the output produced elsewhere."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache

import llguidance
import numpy as np

from mindmotor.structured.compile import ENGINE_STACK_BYTES, compile_grammar
from mindmotor.rules.constraint import Constraint  # noqa: F401 - re-exported
from mindmotor.structured.stack_thread import run_on_stack, start_on_stack

from mindmotor.rules.request_rules import InvalidRequest


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint, compiled on a thread of `ENGINE_STACK_BYTES`
    (cached); InvalidRequest naming its field when it is not valid. In a serving process, call
    it only for specs a helper process has accepted (`mindmotor.sandbox`): the larger stack here
    then makes a crash impossible for them."""
    return run_on_stack(lambda: _compiled(constraint.kind, constraint.spec, constraint.param), ENGINE_STACK_BYTES,
                        "grammar-compile")


@lru_cache(maxsize=256)
def _compiled(kind: str, spec: str, param: str) -> str:
    return compile_grammar(Constraint(kind, spec, param))


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
        """A new matcher of `constraint` (compiled on the large-stack thread, waited for)."""
        return self.start_matcher(constraint).result()

    def start_matcher(self, constraint: Constraint) -> "Future[llguidance.LLMatcher]":
        """`matcher`, started on its own large-stack thread: await it with `asyncio.wrap_future`
        to keep an event loop (or the engine thread) free while a large grammar compiles."""
        def build() -> llguidance.LLMatcher:
            grammar = _compiled(constraint.kind, constraint.spec, constraint.param)
            m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
            if m.is_error():
                raise InvalidRequest(f"the {constraint.kind} constraint is not valid: {m.get_error()}",
                                     param=constraint.param)
            return m
        return start_on_stack(build, ENGINE_STACK_BYTES, "grammar-compile")

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
