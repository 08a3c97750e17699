"""Structured outputs: a request's constraint (JSON schema, any JSON object, regex, choice, EBNF/Lark
grammar) compiled by llguidance into a grammar, one `LLMatcher` per constrained sequence, and the
per-step token masks of a batch's constrained rows computed together (`LLExecutor`, in parallel
off the GIL). The matcher follows the sequence's output tokens, so a preempted sequence keeps its
state and a continued one (migration, the decode side of a P/D split) rebuilds it by consuming
the output produced elsewhere."""

from __future__ import annotations

import json
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


class GrammarEngine:
    """Matchers over one tokenizer and vocabulary, and the batch's masks."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                eos_token=list(eos_token_ids) or None)
        self.executor = llguidance.LLExecutor()
        self.words = (vocab_size + 31) // 32
        self.mask_time_s = 0.0                  # host time spent computing and applying masks
        self.masked_rows = 0

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        m = llguidance.LLMatcher(self.tokenizer, grammar_text(constraint.kind, constraint.spec), log_level=0)
        if m.is_error():
            raise InvalidRequest(f"the {constraint.kind} constraint is not valid: {m.get_error()}",
                                 param="structured_outputs")
        return m

    def apply(self, logits: np.ndarray, rows: list[int], matchers: list) -> None:
        """Set to -inf, in place, every token the row's matcher does not allow next."""
        bitmask = np.full((len(rows), self.words), -1, dtype=np.int32)
        self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.ctypes.data,
                                              self.words * 4, len(rows))
        allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :logits.shape[1]]
        idx = np.asarray(rows)
        logits[idx] = np.where(allowed.astype(bool), logits[idx], -np.inf)


def advance(matcher, tokens) -> None:
    """Consume `tokens` (the sequence's new output); ValueError when the grammar refuses one."""
    for token in tokens:
        if matcher.is_stopped():
            return
        if not matcher.consume_token(int(token)):
            raise ValueError(f"token {int(token)} does not follow the request's structured output grammar: "
                             f"{matcher.get_error()}")
